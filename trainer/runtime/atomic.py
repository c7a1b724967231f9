"""Replacing a file so that no reader ever sees half of it: the one way the trainer and the runtime write a file that
another process reads (a node's state, a plan, a status, metrics, a checkpoint, the watch's key). Standard library
only.

The new contents go into a new file beside the target (the same file system), made with ``mode`` by the call that
creates it, which is then renamed over the target. The files the roles run alone on a node (trainer/data/manifest.py
and the scripts that carry it, trainer/runtime/codeship.py) cannot import this package there and keep their own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PRIVATE = 0o600  # the default: a job's files are its user's
SHARED = 0o644  # what a file written with the usual umask gets, for files others may read (rendered configs)


@contextlib.contextmanager
def replacing(path: str | Path, mode: int = PRIVATE, durable: bool = False) -> Iterator[Path]:
    """A new empty file to fill (by path) that replaces ``path`` when the block ends; removed if the block raises.
    ``durable``: on disk (the file and the folder synced) once the block ends."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, mode)
        os.close(fd)
        yield tmp
        if durable:
            _fsync(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        _fsync(path.parent)


@contextlib.contextmanager
def replacing_folder(path: str | Path, durable: bool = False) -> Iterator[Path]:
    """A new empty folder (mode 0700) to fill that replaces ``path`` when the block ends; removed if the block raises.
    A folder already at ``path`` is moved aside, then removed, after the new one is complete (a rename cannot replace
    a folder that has files). ``durable``: the rename is on disk once the block ends (the files are the writer's to
    sync)."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    old = tmp.with_name(f"{tmp.name}.old")
    try:
        yield tmp
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    if durable:
        _fsync(path.parent)


def write(path: str | Path, data: str | bytes, mode: int = PRIVATE) -> Path:
    """Replace ``path`` with ``data`` (text as UTF-8); the path written."""
    with replacing(path, mode) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
