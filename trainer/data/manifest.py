"""A dataset folder's manifest: every file's path, size, modification time and SHA-256, kept beside the data as
``<folder>/.vidcluster-manifest.json``. It says what a complete, unchanged copy holds: playbooks/stage-data.yml
writes it to every node and moves only the files a node lacks or holds wrong; ``python -m trainer check-data
--manifest DIR`` and playbooks/check-data.yml say whether a copy is complete and unchanged.

Standard library only and runnable as a script: the stager runs this file with the controller's Python and with every
node's own python3 (no trainer install needed there):

    manifest.py build SRC OUT [--source TEXT]   SRC's manifest into OUT; OUT's hashes, and those of SRC's own
                                                manifest, are reused for files whose size and mtime they record (a
                                                rebuild reads only what changed)
    manifest.py verify DIR [--manifest FILE] [--need FILE] [--checksum] [--read-only]
                                                DIR against DIR/.vidcluster-manifest.json (first made a copy of
                                                --manifest FILE), as a JSON report; the files to copy go to --need
                                                FILE (NUL-separated: rsync --files-from --from0)
    manifest.py prune DIR                       delete the files in DIR its manifest does not list

A copy's file is taken as unchanged when its size and mtime (to the second; rsync -t keeps it) are the manifest's,
and otherwise hashed: a truncated or rewritten file is found, one whose mtime alone differs is adopted (its mtime
set to the manifest's). --checksum hashes every file, for damage that kept size and mtime.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

FORMAT = "vidcluster-manifest/1"
MANIFEST = ".vidcluster-manifest.json"
# Names starting so are the tools' bookkeeping (the manifest, rsync's --partial-dir, roles/shared_fs's markers), never
# data: not listed, not copied, not deleted.
OWN_PREFIX = ".vidcluster"
CHUNK = 1 << 20
HASH_THREADS = min(8, os.cpu_count() or 1)  # hashlib releases the GIL on large updates
EXAMPLES = 5


class ManifestError(Exception):
    """A folder that cannot be described or checked; the message names the path."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative, "/"-separated, os.fsdecode'd (undecodable bytes survive as surrogates)
    size: int
    mtime_ns: int
    sha256: str

    def same_time(self, st: os.stat_result) -> bool:
        """mtime equal to the second: what every rsync keeps with -t."""
        return st.st_mtime_ns // 10**9 == self.mtime_ns // 10**9


@dataclass
class Manifest:
    source: str
    entries: list[Entry]

    @property
    def bytes(self) -> int:
        return sum(entry.size for entry in self.entries)

    def dumps(self) -> str:
        """Canonical text (one entry a line): the same files give the same bytes."""
        head = json.dumps({"format": FORMAT, "source": self.source, "files": len(self.entries), "bytes": self.bytes})
        rows = ",\n".join(json.dumps([e.path, e.size, e.mtime_ns, e.sha256]) for e in self.entries)
        return f'{head[:-1]}, "entries": [\n{rows}\n]}}\n'


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_manifest(path: str) -> tuple[Manifest, str]:
    """The manifest in a file, and the digest of its text."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} manifest")
        entries = [Entry(str(p), int(s), int(t), str(h)) for p, s, t, h in data["entries"]]
    except FileNotFoundError:
        raise ManifestError(f"{path}: no manifest (playbooks/stage-data.yml writes it)") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"{path}: not a readable manifest ({exc})") from None
    return Manifest(str(data["source"]), entries), digest(text)


def sha256_file(path: bytes) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def walk(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, stat) of every file under root, sorted, following symlinks to files; the tools' own names are
    skipped. A symlink to a folder or anything that is neither file nor folder is refused, naming it."""
    base, own = os.fsencode(root), os.fsencode(OWN_PREFIX)

    def visit(rel: bytes) -> Iterator[tuple[str, os.stat_result]]:
        folder = os.path.join(base, rel) if rel else base
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            raise ManifestError(f"{os.fsdecode(folder)}: cannot list it ({exc.strerror})") from None
        for entry in entries:
            if entry.name.startswith(own):
                continue
            path = os.path.join(rel, entry.name) if rel else entry.name
            shown = os.fsdecode(os.path.join(base, path))
            if entry.is_dir(follow_symlinks=False):
                yield from visit(path)
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError:
                raise ManifestError(f"{shown}: a broken symlink or an unreadable file") from None
            if stat.S_ISDIR(st.st_mode):
                raise ManifestError(f"{shown}: a symlink to a folder; copy that folder in, or point src at it")
            if not stat.S_ISREG(st.st_mode):
                raise ManifestError(f"{shown}: neither a file nor a folder")
            yield os.fsdecode(path), st

    if not os.path.isdir(base):
        raise ManifestError(f"{root}: not a folder")
    yield from visit(b"")


def build(src: str, out: str, source: str) -> dict[str, object]:
    """Write src's manifest to out (untouched when it would not change); hashes out already holds for a file of the
    same size and mtime are reused, and so are those of src's own manifest (a staged copy's, or the one
    trainer/data/prepare.py writes with the hashes it took while making the files). Returns what was done."""
    known: dict[str, Entry] = {}
    for seed in (os.path.join(src, MANIFEST), out):
        with contextlib.suppress(ManifestError):
            known.update({e.path: e for e in read_manifest(seed)[0].entries})
    files = list(walk(src))

    def entry(item: tuple[str, os.stat_result]) -> Entry:
        rel, st = item
        old = known.get(rel)
        if old is not None and old.size == st.st_size and old.mtime_ns == st.st_mtime_ns:
            return old
        return Entry(rel, st.st_size, st.st_mtime_ns, sha256_file(os.fsencode(os.path.join(src, rel))))

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        entries = list(pool.map(entry, files))
    hashed = [e for e in entries if known.get(e.path) is not e]
    text = Manifest(source, entries).dumps()
    try:
        with open(out, encoding="utf-8") as f:
            changed = f.read() != text
    except OSError:
        changed = True
    if changed:
        write_atomically(out, text)
    return {"files": len(entries), "bytes": sum(e.size for e in entries), "hashed": len(hashed),
            "hashed_bytes": sum(e.size for e in hashed), "changed": changed, "digest": digest(text)}


def install(folder: str, manifest_file: str) -> None:
    """Make manifest_file folder's manifest (the folder is created; an identical manifest is left as it is)."""
    with open(manifest_file, encoding="utf-8") as f:
        text = f.read()
    target = os.path.join(folder, MANIFEST)
    try:
        with open(target, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    write_atomically(target, text)


def point(handle: str, target: str) -> None:
    """Make the symlink handle -> target (replaced atomically when it points elsewhere): the node scripts' remote
    paths are such handles, plain words, so no path of the user's reaches a shell."""
    if os.path.islink(handle) and os.readlink(handle) == target:
        return
    tmp = f"{handle}.{os.getpid()}.tmp"
    os.symlink(target, tmp)
    os.replace(tmp, handle)


def write_atomically(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class Check:
    """A copy against its manifest."""

    manifest: Manifest
    digest: str
    missing: list[Entry] = field(default_factory=list)
    changed: list[tuple[Entry, int]] = field(default_factory=list)  # with the size the copy has
    extra: list[tuple[str, int]] = field(default_factory=list)  # files not in the manifest, with their sizes
    adopted: int = 0  # same content, mtime set to the manifest's

    @property
    def need(self) -> list[Entry]:
        return [*self.missing, *(entry for entry, _ in self.changed)]

    @property
    def complete(self) -> bool:
        return not self.missing and not self.changed


def check_entry(root: bytes, entry: Entry, checksum: bool, adopt: bool) -> tuple[str, int]:
    """("ok" | "missing" | "changed" | "adopted", size on disk) of one manifest entry in the copy at root."""
    path = os.path.join(root, os.fsencode(entry.path))
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return "missing", 0
    if not stat.S_ISREG(st.st_mode):
        return "changed", 0
    if st.st_size != entry.size:
        return "changed", st.st_size
    if entry.same_time(st) and not checksum:
        return "ok", st.st_size
    if sha256_file(path) != entry.sha256:
        return "changed", st.st_size
    if entry.same_time(st) or not adopt:
        return "ok", st.st_size
    os.utime(path, ns=(st.st_atime_ns, entry.mtime_ns))
    return "adopted", st.st_size


def verify(folder: str, checksum: bool = False, adopt: bool = True) -> Check:
    """Check the copy in folder against folder/.vidcluster-manifest.json (a missing folder is an empty copy)."""
    manifest, text_digest = read_manifest(os.path.join(folder, MANIFEST))
    check = Check(manifest, text_digest)
    root = os.fsencode(folder)
    with ThreadPoolExecutor(HASH_THREADS) as pool:
        states = pool.map(lambda e: check_entry(root, e, checksum, adopt), manifest.entries)
        for entry, (state, size) in zip(manifest.entries, states, strict=True):
            if state == "missing":
                check.missing.append(entry)
            elif state == "changed":
                check.changed.append((entry, size))
            check.adopted += state == "adopted"
    listed = {e.path for e in manifest.entries}
    check.extra = [(rel, st.st_size) for rel, st in walk(folder) if rel not in listed]
    return check


def examples(paths: Iterable[str]) -> list[str]:
    return [p for _, p in zip(range(EXAMPLES), paths, strict=False)]


def free_bytes(folder: str) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def report(folder: str, check: Check) -> dict[str, object]:
    """The check as the stager and check-data read it (counts, a few names each, the space it needs)."""
    need = check.need
    return {
        "dir": folder, "source": check.manifest.source, "digest": check.digest, "complete": check.complete,
        "files": len(check.manifest.entries), "bytes": check.manifest.bytes,
        "missing": len(check.missing), "changed": len(check.changed), "adopted": check.adopted,
        "need_files": len(need), "need_bytes": sum(e.size for e in need),
        # rsync writes each file beside its old version, then renames: the copy grows by the new sizes less the old
        # ones, and one file more while it is written.
        "required_bytes": sum(e.size for e in need) - sum(size for _, size in check.changed)
                          + max((e.size for e in need), default=0),
        "free_bytes": free_bytes(folder),
        "extra": len(check.extra), "extra_bytes": sum(size for _, size in check.extra),
        "examples": {"missing": examples(e.path for e in check.missing),
                     "changed": examples(e.path for e, _ in check.changed),
                     "extra": examples(rel for rel, _ in check.extra)},
    }  # fmt: skip


def problems(report: dict[str, Any]) -> str:
    """What is wrong with a copy, from its report: '2 missing (a.mp4, b.mp4), 1 changed (c.mp4, ...)'."""
    parts = []
    for kind in ("missing", "changed"):
        if report[kind]:
            shown = report["examples"][kind]
            more = ", ..." if report[kind] > len(shown) else ""
            parts.append(f"{report[kind]} {kind} ({', '.join(shown)}{more})")
    return ", ".join(parts)


def write_need(path: str, check: Check) -> None:
    """The files to copy, NUL-separated (rsync --files-from --from0)."""
    data = b"".join(os.fsencode(entry.path) + b"\0" for entry in check.need)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def prune(folder: str) -> dict[str, object]:
    """Delete the files the manifest does not list, then the folders that became empty."""
    check = verify(folder, adopt=False)
    root = os.fsencode(folder)
    for rel, _ in check.extra:
        os.unlink(os.path.join(root, os.fsencode(rel)))
    parents = sorted({os.path.dirname(os.fsencode(rel)) for rel, _ in check.extra} - {b""}, key=len, reverse=True)
    for parent in parents:
        while parent:
            try:
                os.rmdir(os.path.join(root, parent))  # only empty folders go
            except OSError:
                break
            parent = os.path.dirname(parent)
    return {"deleted": len(check.extra), "deleted_bytes": sum(size for _, size in check.extra),
            "examples": examples(rel for rel, _ in check.extra)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="manifest.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("build", help="write SRC's manifest to OUT")
    p.add_argument("src")
    p.add_argument("out")
    p.add_argument("--source", default="", help="where the data comes from, as the manifest records it")
    p = commands.add_parser("verify", help="check DIR against its manifest")
    p.add_argument("dir")
    p.add_argument("--manifest", help="make this file DIR's manifest first")
    p.add_argument("--need", help="write the files to copy here (NUL-separated)")
    p.add_argument("--checksum", action="store_true", help="hash every file, not only those whose mtime differs")
    p.add_argument("--read-only", action="store_true", help="do not adopt the manifest's mtime for same content")
    p = commands.add_parser("prune", help="delete the files in DIR its manifest does not list")
    p.add_argument("dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            out: dict[str, object] = build(args.src, args.out, args.source or args.src)
        elif args.command == "verify":
            folder = os.path.abspath(os.path.expanduser(args.dir))
            if args.manifest:
                install(folder, args.manifest)
            check = verify(folder, checksum=args.checksum, adopt=not args.read_only)
            if args.need:
                write_need(args.need, check)
            out = report(folder, check)
        else:
            out = prune(os.path.abspath(os.path.expanduser(args.dir)))
    except (ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
