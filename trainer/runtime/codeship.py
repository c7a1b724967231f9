"""The trainer code a job runs, shipped once per version: a byte-for-byte reproducible archive made on the controller
(the checksum of its bytes is the version), checked and unpacked on the nodes. Standard library only and
self-contained: the launcher runs this file with the controller's Python (a macOS laptop needs no GNU tar or
sha256sum) and on the nodes as ``python3 -c "<this file>" ...``.

    archive SRC OUT           write OUT, a .tar.gz of the folder SRC (sorted names, fixed times, owners and modes,
                              no gzip timestamp), unless OUT holds those bytes already; print
                              {"version", "changed", "manifest"}
    verify DIR                print {"manifest": [...]}: "<sha256>  <path>" of every file below the code version's
                              folder DIR (``trainer/...``, and anything else someone put there: a
                              ``sitecustomize.py`` would run in every job process, as DIR is their PYTHONPATH),
                              sorted ([] if there is no DIR). Refused (exit status 2, one line) when DIR, its folder
                              of versions or anything below DIR is writable by others than its owner, or not ours:
                              what others may change there, no checksum can vouch for
    install ARCHIVE DIR       unpack ARCHIVE beside DIR (a code version's folder), move it into place in one rename
                              (a job never sees half a version), delete ARCHIVE; print {"changed": true}
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import sys
import tarfile
import tempfile
from typing import Any

SKIP_DIRS = {"__pycache__"}  # Python's own caches: checked for who may write them, not for what they hold
SKIP_SUFFIXES = (".pyc",)  # not shipped; on a node, one outside a cache folder is listed (Python would import it)


class CodeError(Exception):
    """A code folder that cannot be trusted (the message names the path)."""


def files(root: str, suffixes: tuple[str, ...] = SKIP_SUFFIXES) -> list[str]:
    """Every file below ``root`` but Python's caches (and names ending in ``suffixes``), as sorted paths relative to
    ``root``."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [os.path.relpath(os.path.join(folder, n), root) for n in names if not n.endswith(suffixes)]
    return sorted(found)


def manifest(root: str, prefix: str, suffixes: tuple[str, ...] = SKIP_SUFFIXES) -> list[str]:
    """``<sha256>  <prefix><path>`` of every file below ``root`` (``files``)."""
    if not os.path.isdir(root):
        return []
    lines = []
    for rel in files(root, suffixes):
        with open(os.path.join(root, rel), "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        lines.append(f"{digest}  {prefix}{rel}")
    return lines


def writable_by_others(code_dir: str) -> list[str]:
    """The code version's folder of versions, the folder itself and everything below it (caches included) that
    another user could change: group- or world-writable, or owned by someone else."""
    paths = [os.path.dirname(code_dir.rstrip("/")), code_dir]
    for folder, dirs, names in os.walk(code_dir):
        paths += [os.path.join(folder, name) for name in dirs + names]
    found = []
    for path in paths:
        info = os.lstat(path)
        if (info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not stat.S_ISLNK(info.st_mode)) \
                or info.st_uid != os.getuid():
            found.append(f"{path} (mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid})")
    return found


def verify(code_dir: str) -> dict[str, Any]:
    """The manifest of everything in the code version's folder, or CodeError when others could change it."""
    if not os.path.isdir(code_dir):
        return {"manifest": []}
    others = writable_by_others(code_dir)
    if others:
        raise CodeError(f"{others[0]}: writable by others than its owner, so the job's code could be changed under "
                        f"it; remove {code_dir} (it is shipped again) or make it yours alone (chmod -R go-w)")
    return {"manifest": manifest(code_dir, "", suffixes=())}


def archive_bytes(src: str) -> bytes:
    name = os.path.basename(src.rstrip("/"))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in ["", *files(src)]:
            path = os.path.join(src, rel) if rel else src
            info = tar.gettarinfo(path, arcname=os.path.join(name, rel) if rel else name)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isdir():
                tar.addfile(info)
            else:
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def archive(src: str, out: str) -> dict[str, Any]:
    data = archive_bytes(src)
    changed = True
    if os.path.isfile(out):
        with open(out, "rb") as handle:
            changed = handle.read() != data
    if changed:
        tmp = f"{out}.{os.getpid()}.tmp"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, out)
    name = os.path.basename(src.rstrip("/"))
    return {"version": hashlib.sha256(data).hexdigest()[:16], "changed": changed,
            "manifest": manifest(src, f"{name}/")}


def install(archive_path: str, final: str) -> dict[str, Any]:
    root, version = os.path.split(final.rstrip("/"))
    os.makedirs(root, mode=0o755, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f"{version}.unpack.", dir=root)
    with tarfile.open(archive_path) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(tmp, filter="data")
        else:  # an older Python: the archive is our own, made by archive() above
            tar.extractall(tmp)
    if os.path.isdir(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    os.unlink(archive_path)
    return {"changed": True}


def main(argv: list[str]) -> int:
    if argv[:1] == ["archive"] and len(argv) == 3:
        result = archive(argv[1], argv[2])
    elif argv[:1] == ["verify"] and len(argv) == 2:
        try:
            result = verify(argv[1])
        except CodeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    elif argv[:1] == ["install"] and len(argv) == 3:
        result = install(argv[1], argv[2])
    else:
        print("usage: archive SRC OUT | verify DIR | install ARCHIVE DIR", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
