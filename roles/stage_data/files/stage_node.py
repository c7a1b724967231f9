"""The node side of roles/stage_data, standard library only (the controller runs its ``copy`` too):

    stage_node.py prepare DEST STAGE HANDLE DIGEST [--checksum] [--manifest-stdin]
        Make the stage folder and DEST, point STAGE/HANDLE at DEST (both "~"-expanded: the role's remote paths are
        such plain handles, so no user path reaches a shell), forget earlier runs' progress files, check that rsync
        runs. With --manifest-stdin, the manifest of DIGEST comes on stdin and is kept as STAGE/HANDLE.manifest.json.
        When that file is the manifest of DIGEST, make it DEST's manifest, check DEST against it and list what DEST
        lacks in STAGE/HANDLE.need. Prints {"dest", "stage", "rsync", "manifest": "current" or "stale", "check": the
        check's report or null}.
    stage_node.py source SRC STAGE HANDLE LABEL
        Point STAGE/HANDLE at SRC and write SRC's manifest to STAGE/HANDLE.manifest.json (a rebuild hashes only files
        whose size or mtime moved). Prints {"src", "stage", "rsync", "build"}.
    stage_node.py copy LOCK PROGRESS [--detach] RSYNC_ARG...
        Run one rsync, keeping PROGRESS (JSON, replaced atomically about once a second):
            {"pid", "beat", "files", "bytes", "done": false}   ... then "done": true, "rc", "sent", "received", "error"
        The rsync arguments include --out-format='%i %l' and --stats, read here: one line per item done ("<f..." a
        file sent, ">f..." received, "cd..." a folder), then the totals. One copy per LOCK: a second stops the first (a
        copy an interrupted play left running). --detach: return once the copy has started and let it run on its own
        (the controller polls PROGRESS; "beat" moves while it lives). rc 127: rsync is not installed here.

prepare and source use trainer/data/manifest.py, which the role passes along as the module ``manifest``:
    python3 -c LOADER <manifest.py's source> <this file's source> prepare ...      (LOADER: the role's vars/main.yml)
copy needs nothing else: python3 -c <this file's source> copy ...
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from typing import IO, Any

BEAT_SECONDS = 1.0
STOP_WAIT = 30.0
TOTAL = re.compile(rb"^Total bytes (sent|received): ([\d,]+)")


class StageError(Exception):
    """A folder that cannot be prepared or described; the message names it."""


def rsync_problem() -> str:
    """'' when rsync runs here, else why not."""
    try:
        done = subprocess.run(["rsync", "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return str(exc.strerror)
    return "" if done.returncode == 0 else f"rsync --version exits {done.returncode}"


def prepare(dest: str, stage: str, handle: str, digest: str, checksum: bool, sent: str | None) -> dict[str, Any]:
    import manifest  # trainer/data/manifest.py, passed along by the role (see the module docstring)

    dest, stage = os.path.abspath(os.path.expanduser(dest)), os.path.abspath(os.path.expanduser(stage))
    try:
        os.makedirs(stage, mode=0o700, exist_ok=True)
        os.makedirs(dest, exist_ok=True)
        prefix = os.path.join(stage, handle)
        manifest.point(prefix, dest)
        for old in glob.glob(glob.escape(prefix) + ".*.progress"):
            os.unlink(old)
        out: dict[str, Any] = {"dest": dest, "stage": stage, "rsync": rsync_problem(), "manifest": "stale",
                               "check": None}
        kept = f"{prefix}.manifest.json"
        if sent is not None:
            if manifest.digest(sent) != digest:
                raise StageError(f"the manifest sent for {dest} arrived damaged (its digest differs)")
            manifest.write_atomically(kept, sent)
        try:
            current = manifest.read_manifest(kept)[1] == digest
        except manifest.ManifestError:
            current = False
        if current:
            manifest.install(dest, kept)
            check = manifest.verify(dest, checksum=checksum)
            manifest.write_need(f"{prefix}.need", check)
            out.update(manifest="current", check=manifest.report(dest, check))
    except (OSError, manifest.ManifestError) as exc:
        raise StageError(str(exc)) from None
    return out


def source(src: str, stage: str, handle: str, label: str) -> dict[str, Any]:
    import manifest  # see prepare

    src, stage = os.path.abspath(os.path.expanduser(src)), os.path.abspath(os.path.expanduser(stage))
    try:
        os.makedirs(stage, mode=0o700, exist_ok=True)
        prefix = os.path.join(stage, handle)
        manifest.point(prefix, src)
        return {"src": src, "stage": stage, "rsync": rsync_problem(),
                "build": manifest.build(src, f"{prefix}.manifest.json", f"{label}:{src}")}
    except (OSError, manifest.ManifestError) as exc:
        raise StageError(str(exc)) from None


class Progress:
    """The copy's numbers, written to the progress file by a heartbeat thread and at the end."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.state: dict[str, Any] = {"pid": os.getpid(), "beat": 0, "files": 0, "bytes": 0, "done": False}
        self.lock = threading.RLock()  # the signal handler may finish while the main thread holds it

    def line(self, raw: bytes) -> None:
        """One line of rsync's output: an item done ("%i %l"), or a --stats total."""
        total = TOTAL.match(raw)
        fields = raw.split()
        with self.lock:
            if total:
                self.state["sent" if total[1] == b"sent" else "received"] = int(total[2].replace(b",", b""))
            elif len(fields) == 2 and fields[0][1:2] == b"f" and fields[1].isdigit():
                self.state["files"] += 1
                self.state["bytes"] += int(fields[1])

    def beat(self) -> None:
        while not self.state["done"]:
            self.write()
            time.sleep(BEAT_SECONDS)

    def finish(self, rc: int, error: str) -> None:
        with self.lock:
            self.state.update(done=True, rc=rc, error=error)
        self.write()

    def write(self) -> None:
        with self.lock:
            self.state["beat"] += 1
            text = json.dumps(self.state)
        tmp = f"{self.path}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)


def holder(lock: IO[str], lock_path: str) -> int | None:
    """The pid written in a held lock, when that process is a copy of this lock (its command line names it)."""
    lock.seek(0)
    try:
        pid = int(lock.read().strip())
    except ValueError:
        return None  # not written yet
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except FileNotFoundError:  # no /proc (a macOS controller)
        command = subprocess.run(["ps", "-ww", "-p", str(pid), "-o", "command="], capture_output=True).stdout
    except OSError:
        return None
    return pid if os.fsencode(lock_path) in command else None


def take_over(lock_path: str) -> IO[str]:
    """Hold the lock, stopping the copy that holds it (a run an interrupted play left)."""
    lock = open(lock_path, "a+")  # noqa: SIM115 (held for the life of the process)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = holder(lock, lock_path)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(f"{lock_path}: the copy holding it did not stop") from None
                time.sleep(0.2)
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    return lock


def detach() -> int | None:
    """Fork a daemon for the copy. In the caller: returns the exit status once the daemon has started (or why it
    could not, on stderr). In the daemon: returns None, with a pipe on fd 3 to close once started."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as r:
            problem = r.read().decode(errors="replace")
        os.waitpid(child, 0)
        if problem:
            print(problem, file=sys.stderr)
        return 1 if problem else 0
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.dup2(write_end, 3)
    return None


def copy(lock_path: str, progress_path: str, command: list[str], detached: bool) -> int:
    if detached:
        status = detach()
        if status is not None:
            return status
    try:
        lock = take_over(lock_path)
        progress = Progress(progress_path)
        progress.write()
    except OSError as exc:
        if detached:
            os.write(3, str(exc).encode())
        raise SystemExit(str(exc)) from None
    if detached:
        os.close(3)
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        progress.finish(127, f"{command[0]} is not installed")
        return 127

    def stop(signum: int, _frame: object) -> None:
        proc.terminate()
        progress.finish(128 + signum, f"stopped by signal {signum}")
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, stop)
    errors: deque[bytes] = deque(maxlen=8)
    threading.Thread(target=lambda: errors.extend(proc.stderr or []), daemon=True).start()
    threading.Thread(target=progress.beat, daemon=True).start()
    for raw in proc.stdout or []:
        progress.line(raw)
    rc = proc.wait()
    time.sleep(0.1)  # the stderr reader's last lines
    progress.finish(rc, b"".join(errors).decode(errors="replace").strip())
    lock.close()
    return rc


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    try:
        if command == "prepare" and len(args) >= 4 and set(args[4:]) <= {"--checksum", "--manifest-stdin"}:
            sent = sys.stdin.read() if "--manifest-stdin" in args[4:] else None
            out = prepare(*args[:4], checksum="--checksum" in args[4:], sent=sent)
        elif command == "source" and len(args) == 4:
            out = source(*args)
        elif command == "copy" and len(args) >= 3:
            detached = args[2] == "--detach"
            return copy(args[0], args[1], args[3:] if detached else args[2:], detached)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except StageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
