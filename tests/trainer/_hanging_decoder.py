"""A decord reader that hangs on one file, standing in for decord #373 (get_batch stuck in C code, holding the GIL).

The file is $VCT_HANGING_VIDEO (a path as the annotation list resolves it). Reading its frames appends a line to
$VCT_HANGING_VIDEO_LOG (so a test can count how often a decoder got stuck in it) and then calls libc's sleep through
ctypes.PyDLL, which keeps the GIL for the whole call: nothing else in that process runs again, as with the real bug.

A test installs it in its own process (monkeypatch READERS), or runs the trainer with ``hanging_env``: the
sitecustomize in hanging_site/ then installs it in every Python process of the run, spawned ones included.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from trainer.data import decoders

HANGING_ENV = "VCT_HANGING_VIDEO"
LOG_ENV = "VCT_HANGING_VIDEO_LOG"
SITE = Path(__file__).resolve().parent / "hanging_site"
REPO = Path(__file__).resolve().parents[2]


class HangingReader(decoders.DecordReader):
    def __init__(self, path: str, size: tuple[int, int], device: str = "cpu") -> None:
        super().__init__(path, size, device)
        self.path = path

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        if self.path == os.environ.get(HANGING_ENV):
            with open(os.environ[LOG_ENV], "a") as log:
                log.write(f"{os.getpid()}\n")
            ctypes.PyDLL(None).sleep(3600)  # in C, with the GIL held
        return super().get_frames(indices)


def install() -> None:
    decoders.READERS["decord"] = HangingReader


def hanging_env(video: str, log: Path) -> dict[str, str]:
    """The environment of a trainer run in which ``video`` hangs the decoder (entries go to ``log``)."""
    return {HANGING_ENV: video, LOG_ENV: str(log), "PYTHONPATH": f"{SITE}{os.pathsep}{REPO}"}


def entered(log: Path) -> int:
    """How many times a decoder got stuck in the hanging file."""
    return len(log.read_text().splitlines()) if log.exists() else 0
