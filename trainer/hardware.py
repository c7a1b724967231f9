"""Does this machine fit the config: the GPU-side rules a config meets only on the node that runs it.

- ``CONFIG.TRAIN.AMP: bf16`` needs bf16 units: compute capability 8.0 or newer (Ampere on). On a V100 (7.0) or T4
  (7.5) it is refused, naming the GPU: fp16 with the gradient scaler, or auto (which is fp16 there), are what runs.
- ``CONFIG.TRAIN.COMPILE`` builds kernels when the model first runs: on a GPU Triton compiles its kernel launchers
  with a C compiler ($CC, else gcc, else clang: Triton's own search), on a CPU Inductor compiles C++ ($CXX, else g++);
  both include ``Python.h`` of the running Python. A node without them would fail minutes into the first step.
- ``CONFIG.DATA.DECODER_DEVICE: cuda`` needs a CUDA build of torchcodec (its version.py says ``+cuXYZ``: PyPI's
  0.17.0 is ``+cu130``, the cpu build's 0.13.0 ``+cpu``); a CPU-only build would decode in the training process, with
  no workers.

Each rule is a function of the facts it needs (a capability, a compiler lookup, a version string), so every case is
tested on any machine; ``check_config`` gathers this machine's facts and applies them (``node_checks.check_runtime``
calls it on every node before a launch and at every trainer start).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sysconfig
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainer.config import Config

BF16_CAPABILITY = (8, 0)
# The build of torchcodec that decodes on NVDEC: PyTorch's index, one folder per CUDA build of torch.
TORCH_INDEX = "https://download.pytorch.org/whl"


@dataclass(frozen=True)
class Gpu:
    """A GPU as this process numbers it (after CUDA_VISIBLE_DEVICES), its name and compute capability."""

    index: int
    name: str
    capability: tuple[int, int]

    def __str__(self) -> str:
        return f"GPU {self.index} {self.name} (sm_{self.capability[0]}{self.capability[1]})"


def visible_gpus() -> list[Gpu]:
    """The GPUs torch sees here ([] without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [Gpu(i, torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
            for i in range(torch.cuda.device_count())]


def amp_problem(amp: str, gpus: Sequence[Gpu]) -> str | None:
    """Why CONFIG.TRAIN.AMP cannot run on these GPUs, or None (a CPU run uses float32 whatever AMP says)."""
    lacking = [gpu for gpu in gpus if gpu.capability < BF16_CAPABILITY]
    if amp != "bf16" or not lacking:
        return None
    return (f"CONFIG.TRAIN.AMP: bf16 needs a GPU of compute capability 8.0 or newer (Ampere or later), and "
            f"{', '.join(map(str, lacking))} has none; set AMP to fp16 (float16 with the gradient scaler) or auto "
            "(fp16 with the scaler on this GPU)")


def python_include_dir() -> Path:
    """Where Python.h of this Python is, as Triton looks for it (Debian's posix_local scheme read as posix_prefix)."""
    scheme = sysconfig.get_default_scheme()
    return Path(sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"])


def compile_problem(device_type: str, which: Callable[[str], str | None] = shutil.which,
                    environ: Mapping[str, str] = os.environ, include_dir: Path | None = None) -> str | None:
    """Why torch.compile cannot build kernels for ``device_type`` ('cuda' or 'cpu') here, or None."""
    if device_type == "cuda":
        given = environ.get("CC")
        compiler = which(given) if given else which("gcc") or which("clang")
        wanted = "a C compiler for Triton's kernel launchers (gcc, clang, or $CC)"
    else:
        compiler = which(environ.get("CXX") or "g++")
        wanted = "a C++ compiler for Inductor's CPU kernels (g++, or $CXX)"
    if compiler is None:
        return (f"CONFIG.TRAIN.COMPILE: torch.compile needs {wanted}, and this node has none; install one "
                "(Debian/Ubuntu: build-essential) or set COMPILE false")
    header = (include_dir or python_include_dir()) / "Python.h"
    if not header.is_file():
        version = sysconfig.get_python_version()
        return (f"CONFIG.TRAIN.COMPILE: torch.compile includes Python.h, and {header} is missing; install Python "
                f"{version}'s headers (Debian/Ubuntu: python{version}-dev) or set COMPILE false")
    return None


def cuda_build(version: str) -> bool:
    """Whether a PyTorch-family wheel's version says it was built with CUDA ('0.17.0+cu130')."""
    return "+cu" in version


def torchcodec_version() -> str:
    """torchcodec's own version (its version.py, which carries the build: '0.17.0+cu130'; the package metadata says
    '0.17.0'), read without importing it: importing loads FFmpeg and torch. '' when it is not installed."""
    spec = importlib.util.find_spec("torchcodec")
    origin = Path(spec.origin).with_name("version.py") if spec is not None and spec.origin else None
    if origin is None or not origin.is_file():
        return ""
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", origin.read_text())
    return found[1] if found else ""


def decoder_device_problem(device: str, torchcodec_version: str, torch_cuda: str | None) -> str | None:
    """Why CONFIG.DATA.DECODER_DEVICE cannot decode on the GPU with this torchcodec, or None. ``torch_cuda`` is
    torch.version.cuda ('13.0'), which names the torchcodec build to install."""
    if device != "cuda" or cuda_build(torchcodec_version):
        return None
    build = f"cu{torch_cuda.replace('.', '')}" if torch_cuda else "cu130"
    release = torchcodec_version.split("+", 1)[0]
    return (f"CONFIG.DATA.DECODER_DEVICE: cuda needs torchcodec's CUDA build, and torchcodec {torchcodec_version} is "
            f"a CPU-only build; install the one for this torch: pip install torchcodec=={release}+{build} "
            f"--index-url {TORCH_INDEX}/{build} (or set DECODER_DEVICE cpu)")


def check_config(cfg: Config) -> list[str]:
    """What keeps this machine from running ``cfg`` as the rules above say; [] when it fits. Imports torch only when
    a rule needs it."""
    train, data = cfg.CONFIG.TRAIN, cfg.CONFIG.DATA
    if not (train.AMP == "bf16" or train.COMPILE or data.DECODER_DEVICE == "cuda"):
        return []
    import torch

    gpus = visible_gpus()
    problems = [amp_problem(train.AMP, gpus)]
    if train.COMPILE:
        problems.append(compile_problem("cuda" if gpus else "cpu"))
    if gpus and data.DECODER_DEVICE == "cuda":
        problems.append(decoder_device_problem("cuda", torchcodec_version(), torch.version.cuda))
    return [problem for problem in problems if problem]
