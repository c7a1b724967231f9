"""Print this Python environment's training stack as one JSON object (python_env runs it with the env's python).

Keys: python, torch, cuda, cudnn, nccl, torchvision, decord, torchcodec, paramiko (version strings), ffmpeg (the
FFmpeg torchcodec loaded: its version, "not found" when torchcodec finds no FFmpeg shared libraries it supports, "n/a"
without torchcodec), torch_gpus (device names torch sees), torch_archs (the GPU kernels of the torch build:
torch.cuda.get_arch_list()), gpu_checks (per GPU: index, name, compute capability "major.minor", and "ok" or the error
of one small CUDA operation on it). A package that is not installed reports "missing"; one
that is installed but fails to import reports "broken: <error>", so a half-installed node shows up in the cross-node
table instead of crashing the report.

    python env_report.py [--cache DIR]

With --cache, a report is kept in DIR under a fingerprint of everything it depends on (the interpreter, every
installed distribution's metadata and its modification time, the NVIDIA driver and devices, the FFmpeg libraries), so
a rerun on an unchanged node prints the kept report without importing torch again; any install or driver change makes
a new fingerprint.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

NOT_AVAILABLE = "n/a"
# Part of the fingerprint: a report kept by an older version of this script lacks keys this one has.
REPORT_VERSION = 2
# Where the system's FFmpeg libraries live (torchcodec loads them); a change there changes the fingerprint.
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib")


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
    details["torch_archs"] = list(torch.cuda.get_arch_list()) if torch.version.cuda else []
    details["gpu_checks"] = [_gpu_check(torch, index) for index in range(count)]
    return details


def _gpu_check(torch: Any, index: int) -> dict[str, Any]:
    """One GPU's compute capability and one small CUDA operation on it: a build without kernels for the GPU fails
    here ("no kernel image is available"), not minutes into a job."""
    major, minor = torch.cuda.get_device_capability(index)
    try:
        total = torch.ones(64, device=f"cuda:{index}").add(1).sum().item()
        op = "ok" if total == 128 else f"wrong result: 64 twos summed to {total}"
    except Exception as exc:  # the finding to report: the kernel or the device failed
        op = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
    return {"index": index, "name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}", "op": op}


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


def fingerprint() -> str:
    """A digest of what the report depends on, computed without importing any of the reported packages."""
    digest = hashlib.sha256(f"{REPORT_VERSION}|{sys.version}|{os.path.realpath(sys.prefix)}|".encode())
    for folder in sorted({os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}):
        for entry in sorted(os.listdir(folder)):
            if entry.endswith((".dist-info", ".egg-info", ".pth", ".egg-link")):
                digest.update(f"{folder}/{entry}:{os.stat(os.path.join(folder, entry)).st_mtime_ns}|".encode())
    digest.update(os.environ.get("CUDA_VISIBLE_DEVICES", "-").encode())
    driver = Path("/proc/driver/nvidia/version")
    digest.update(driver.read_bytes() if driver.exists() else b"no-driver")
    libraries = [path for folder in LIBRARY_DIRS for path in glob.glob(f"{folder}/libav*.so.*")]
    for path in sorted(glob.glob("/dev/nvidia*") + libraries):
        digest.update(f"{path}:{os.stat(path).st_mtime_ns}|".encode())
    return digest.hexdigest()[:32]


def report() -> dict[str, Any]:
    report: dict[str, Any] = {"python": platform.python_version()}
    torch, report["torch"] = _module_version("torch")
    if torch is None:
        report.update(cuda=NOT_AVAILABLE, cudnn=NOT_AVAILABLE, nccl=NOT_AVAILABLE, torch_gpus=[], torch_archs=[],
                      gpu_checks=[])
    else:
        report.update(_torch_details(torch))
    for module in ("torchvision", "decord", "paramiko"):
        report[module] = _module_version(module)[1]
    torchcodec, report["torchcodec"] = _module_version("torchcodec")
    report["ffmpeg"] = _ffmpeg_version(torchcodec)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="this environment's training stack as JSON")
    parser.add_argument("--cache", help="folder of kept reports, by fingerprint")
    args = parser.parse_args()
    kept = Path(os.path.expanduser(args.cache)) / f"{fingerprint()}.json" if args.cache else None
    if kept is not None and kept.is_file():
        print(kept.read_text().strip())
        return
    found = report()
    text = json.dumps(found)
    # A broken import or a failed GPU operation is worth looking at again next time.
    if kept is not None and "broken" not in text and all(gpu["op"] == "ok" for gpu in found["gpu_checks"]):
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, kept)
        except OSError:
            pass  # no room to keep it: the report stands, the next run recomputes it
    print(text)


if __name__ == "__main__":
    main()
