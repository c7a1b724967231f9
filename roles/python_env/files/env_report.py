"""Print this Python environment's training stack as one JSON object (python_env runs it with the env's python).

Keys: python, torch, cuda, cudnn, nccl, torchvision, decord, torchcodec, paramiko (version strings), ffmpeg (the
FFmpeg torchcodec loaded: its version, "not found" when torchcodec finds no FFmpeg shared libraries it supports, "n/a"
without torchcodec), torch_gpus (device names torch sees). A package that is not installed reports "missing"; one
that is installed but fails to import reports "broken: <error>", so a half-installed node shows up in the cross-node
table instead of crashing the report.
"""

from __future__ import annotations

import importlib
import json
import platform
from importlib import metadata
from typing import Any

NOT_AVAILABLE = "n/a"


def _module_version(module: str) -> tuple[Any, str]:
    """Import a module and return it with its version, or (None, 'missing' / 'broken: ...')."""
    try:
        metadata.distribution(module)
    except metadata.PackageNotFoundError:
        return None, "missing"
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # any import failure is a finding to report, not a crash
        return None, f"broken: {type(exc).__name__}: {exc}"
    return imported, str(getattr(imported, "__version__", None) or metadata.version(module))


def _torch_details(torch: Any) -> dict[str, Any]:
    """CUDA, cuDNN and NCCL versions of the torch build, and the GPUs it can use."""
    details: dict[str, Any] = {"cuda": torch.version.cuda or NOT_AVAILABLE}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    details["cudnn"] = str(cudnn) if cudnn else NOT_AVAILABLE
    try:
        nccl = torch.cuda.nccl.version()
        details["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except (AttributeError, RuntimeError):  # CPU-only builds have no NCCL
        details["nccl"] = NOT_AVAILABLE
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    details["torch_gpus"] = [torch.cuda.get_device_name(index) for index in range(count)]
    return details


def _ffmpeg_version(torchcodec: Any) -> str:
    """The FFmpeg libraries torchcodec loads from the system (decord brings its own and needs none)."""
    if torchcodec is None:
        return NOT_AVAILABLE
    if torchcodec.ffmpeg_major_version is None:
        return "not found"
    try:
        from torchcodec._core import get_ffmpeg_library_versions

        return str(get_ffmpeg_library_versions()["ffmpeg_version"])
    except Exception as exc:  # a finding to report, not a crash
        return f"broken: {type(exc).__name__}: {exc}"


def main() -> None:
    report: dict[str, Any] = {"python": platform.python_version()}
    torch, report["torch"] = _module_version("torch")
    if torch is None:
        report.update(cuda=NOT_AVAILABLE, cudnn=NOT_AVAILABLE, nccl=NOT_AVAILABLE, torch_gpus=[])
    else:
        report.update(_torch_details(torch))
    for module in ("torchvision", "decord", "paramiko"):
        report[module] = _module_version(module)[1]
    torchcodec, report["torchcodec"] = _module_version("torchcodec")
    report["ffmpeg"] = _ffmpeg_version(torchcodec)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
