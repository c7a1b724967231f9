"""The trainer code a job runs, shipped once per version: a byte-for-byte reproducible archive made on the controller
(the checksum of its bytes is the version), checked and unpacked on the nodes. Standard library only and
self-contained: the launcher runs this file with the controller's Python (a macOS laptop needs no GNU tar or
sha256sum) and on the nodes as ``python3 -c "<this file>" ...``.

    archive SRC OUT           write OUT, a .tar.gz of the folder SRC (sorted names, fixed times, owners and modes,
                              no gzip timestamp), unless OUT holds those bytes already; print
                              {"version", "changed", "manifest"}
    verify DIR                print {"manifest": [...]}: "<sha256>  <path>" of every file below DIR, sorted ([] if
                              there is no DIR)
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
import sys
import tarfile
import tempfile

SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc",)


def files(root: str) -> list[str]:
    """Every file below ``root`` that is code (no caches), as sorted paths relative to ``root``."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]
        found += [os.path.relpath(os.path.join(folder, n), root) for n in names if not n.endswith(SKIP_SUFFIXES)]
    return sorted(found)


def manifest(root: str) -> list[str]:
    """``<sha256>  <path>`` of every file below ``root`` (``path`` starting with the folder's own name)."""
    if not os.path.isdir(root):
        return []
    lines = []
    for rel in files(root):
        with open(os.path.join(root, rel), "rb") as handle:
            digest = hashlib.sha256(handle.read()).hexdigest()
        lines.append(f"{digest}  {os.path.join(os.path.basename(root.rstrip('/')), rel)}")
    return lines


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


def archive(src: str, out: str) -> dict:
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
    return {"version": hashlib.sha256(data).hexdigest()[:16], "changed": changed, "manifest": manifest(src)}


def install(archive_path: str, final: str) -> dict:
    root, version = os.path.split(final.rstrip("/"))
    os.makedirs(root, exist_ok=True)
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
        result = {"manifest": manifest(os.path.join(argv[1], "trainer"))}
    elif argv[:1] == ["install"] and len(argv) == 3:
        result = install(argv[1], argv[2])
    else:
        print("usage: archive SRC OUT | verify DIR | install ARCHIVE DIR", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
