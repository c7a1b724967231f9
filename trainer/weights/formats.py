"""Read a weights file of any supported zoo and tell which one it is, from the file and the tensor names in it.

Nothing here unpickles arbitrary objects: torch files are read with ``weights_only=True`` and Caffe2 pickles with an
unpickler that builds numpy arrays and nothing else.
"""

from __future__ import annotations

import pickle
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from trainer.errors import CheckpointError, first_line


class WeightsError(CheckpointError, ValueError):
    """A weights file that cannot be used: the message names the file and what is wrong, on one line (a UserError:
    every command prints it as ``error: <message>`` and exits with status 2)."""


@dataclass
class WeightsFile:
    """The tensors of a weights file under the source's own names, and what the file is."""

    path: Path
    format: str  # vidcluster, torchvision, pyslowfast, caffe2, pytorchvideo or gluoncv
    tensors: dict[str, torch.Tensor]
    inference: dict[str, Any] = field(default_factory=dict)  # our checkpoints: what predicting needs


# Caffe2 training state that PySlowFast skips too: momentum buffers, the learning rate, the iteration counter.
_CAFFE2_SOLVER_BLOBS = ("_momentum", "lr", "model_iter")
_NUMPY_GLOBALS = {
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("collections", "OrderedDict"),
    ("_codecs", "encode"),  # how Python 3 writes bytes in a protocol-2 pickle
}


class _NumpyUnpickler(pickle.Unpickler):
    """Unpickles dicts of numpy arrays (Caffe2 ``.pkl`` model files, written by Python 2 or 3) and refuses any
    other global, so a hostile pickle cannot run code."""

    def find_class(self, module: str, name: str) -> Any:
        module = module.replace("numpy.core", "numpy._core", 1) if module.startswith("numpy.core") else module
        if (module, name) not in _NUMPY_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}")
        return super().find_class(module, name)


def _read_caffe2(path: Path) -> dict[str, torch.Tensor]:
    with path.open("rb") as handle:
        try:
            obj = _NumpyUnpickler(handle, encoding="latin1").load()
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            raise WeightsError(f"{path}: neither a torch file nor a Caffe2 pickle of arrays ({exc})") from None
    blobs = obj.get("blobs") if isinstance(obj, Mapping) else None
    if not isinstance(blobs, Mapping):
        raise WeightsError(f"{path}: a pickle without the 'blobs' dict of a Caffe2 model")
    return {
        name: torch.from_numpy(np.ascontiguousarray(value))
        for name, value in blobs.items()
        if isinstance(value, np.ndarray) and not any(marker in name for marker in _CAFFE2_SOLVER_BLOBS)
    }


def _refusal_reason(exc: pickle.UnpicklingError) -> str:
    # torch's weights-only refusal opens with advice to load unsafely; why it refused follows this marker (and is
    # followed by advice to allow-list what it refused, which we do not take either).
    _, marker, reason = str(exc).partition("WeightsUnpickler error:")
    if not (marker and reason.strip()):
        return first_line(exc)
    return reason.strip().splitlines()[0].split(" Please use ")[0]


def read_torch_file(path: Path) -> Any:
    """``torch.load`` with ``weights_only=True`` on the CPU; a missing or unreadable file is a WeightsError."""
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise WeightsError(f"{path}: not loadable as plain tensors (UnpicklingError: {_refusal_reason(exc)})") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise WeightsError(f"{path}: not a torch file ({type(exc).__name__}: {first_line(exc)})") from None


# In an FSDP2 checkpoint folder (trainer.checkpoint): all of the checkpoint's dict but the model and the optimizer.
TRAINER_STATE_FILE = "trainer_state.pth"


def is_sharded_checkpoint(path: Path) -> bool:
    return path.is_dir() and (path / TRAINER_STATE_FILE).is_file()


def read_sharded_checkpoint(folder: Path) -> dict[str, Any]:
    """An FSDP2 checkpoint folder read whole, as the one-file checkpoint's dict (the model and optimizer keyed by
    parameter name), without a process group."""
    with tempfile.TemporaryDirectory(prefix="vidcluster-dcp-") as tmp:
        try:
            dcp_to_torch_save(folder, Path(tmp) / "whole.pth")  # DCP's own reader, every rank's shards
        except (RuntimeError, OSError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {first_line(exc)}"
            raise WeightsError(f"{folder}: not a readable DCP folder ({reason})") from None
        return {**read_torch_file(folder / TRAINER_STATE_FILE), **read_torch_file(Path(tmp) / "whole.pth")}


# State-dict names that identify a source. PySlowFast's pytorchvideo models carry a 'model.' prefix. pytorchvideo's
# ResNets and SlowFast start with their stem, blocks.0 (a conv, or one per pathway); a bare "blocks.0." would also
# claim torchvision's MViT, whose transformer blocks are named so too.
_SIGNATURES = (
    ("pyslowfast", "s1.pathway0_stem.conv.weight"),
    ("pytorchvideo", "blocks.0.conv."),
    ("pytorchvideo", "blocks.0.multipathway_blocks."),
    ("gluoncv", "fast_conv1.weight"),  # SlowFast
    ("gluoncv", "first_stage.0.weight"),  # I3D_ResNetV1
    ("gluoncv", "layer1.0.conv1.weight"),  # ResNet_SlowFast (i3d_slow_*) and R2Plus1D (bottleneck)
    ("gluoncv", "layer1.0.conv1.conv1.weight"),  # R2Plus1D (basic block)
)
_WRAPPER_KEYS = ("model_state", "model", "state_dict")
_PREFIXES = ("module.", "model.")


def _unwrap(obj: Any, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(state dict, our inference metadata) from the dict layouts the zoos and we save."""
    if not isinstance(obj, Mapping):
        raise WeightsError(f"{path}: holds a {type(obj).__name__}, not a state dict or a checkpoint dict")
    inference = obj.get("inference") if isinstance(obj.get("inference"), Mapping) else {}
    for key in _WRAPPER_KEYS:
        if isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    state = dict(obj)
    for prefix in _PREFIXES:  # DDP saves ('module.'), PySlowFast's pytorchvideo wrapper ('model.')
        if state and all(name.startswith(prefix) for name in state):
            state = {name.removeprefix(prefix): value for name, value in state.items()}
    return state, dict(inference)


def detect_format(names: set[str], inference: Mapping[str, Any]) -> str:
    if inference:
        return "vidcluster"
    for fmt, signature in _SIGNATURES:
        if any(name.startswith(signature) for name in names):
            return fmt
    # a bare state dict: ours (from a VidCluster model) or torchvision's (from one of its video models)
    return "vidcluster" if "head.fc.weight" in names else "torchvision"


def read_weights(path: str | Path) -> WeightsFile:
    """Read ``path`` and detect its format; WeightsError if it is not a weights file we know."""
    path = Path(path).expanduser()
    if is_sharded_checkpoint(path):
        return _weights_file(path, read_sharded_checkpoint(path))
    if not path.is_file():
        raise WeightsError(f"weights file {path} does not exist")
    # torch >= 1.6 writes zip archives; a plain pickle is Caffe2's (.pkl) or an old torch file
    if not zipfile.is_zipfile(path):
        if path.suffix == ".pkl":
            return WeightsFile(path, "caffe2", _read_caffe2(path))
        try:
            obj = read_torch_file(path)
        except WeightsError:
            return WeightsFile(path, "caffe2", _read_caffe2(path))
    else:
        obj = read_torch_file(path)
    return _weights_file(path, obj)


def _weights_file(path: Path, obj: Any) -> WeightsFile:
    state, inference = _unwrap(obj, path)
    tensors = {name: value for name, value in state.items() if isinstance(value, torch.Tensor)}
    if not tensors:
        raise WeightsError(f"{path}: no tensors in it")
    return WeightsFile(path, detect_format(set(tensors), inference), tensors, inference)
