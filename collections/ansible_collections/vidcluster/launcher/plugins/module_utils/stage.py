"""A dataset copy's bookkeeping, and the copy itself (roles/stage_data). Standard library only: the controller's
plugins import it, the role's node module (stage_data_node) carries it to the nodes, and the controller runs this
file for the copy it sends itself (``python stage.py copy ...``).

Where everything is, and who writes it (the one owner of these names):

On a node, in its stage folder ``~/vidcluster/stage`` (``STAGE_DIR``), for each copy a **handle**: a symlink named by
a hash of the request and the node (``d<hash>.<node>`` -> the node's destination, ``s<hash>.<node>`` -> a source
folder on the node). rsync's remote paths are these plain words, so no path or name of the user's reaches a shell.
Beside each handle (``Handle``):

    <handle>.manifest.json       the manifest the copy must hold (stage_data_node prepare; source: built there)
    <handle>.need                what the copy lacks, NUL-separated (rsync --files-from --from0; prepare)
    <handle>.lock                held by the one copy into it (copy; a second copy stops the first)
    <handle>.<token>.progress    that copy's progress (copy; prepare forgets those of earlier plays)

On the controller, in the stage_data cache folder (``Controller``): ``<key>.json``, the manifest of a source (built
there or fetched; a rebuild hashes only what changed); ``<handle>.<key(address)>.lock`` of the copy the controller
sends itself (named by where it connects as well: two clusters may both have a ``node0``);
``runs/<token>/<node>.progress`` of that copy and ``runs/<token>/<node>.json``, every transfer's record of what it
moved (the totals and the summary read them; removed when the play ends).

The copy (``copy``): one rsync whose arguments include ``--out-format='%i %l'`` and ``--stats``, read here, with its
progress file replaced atomically about once a second:
    {"pid", "beat", "files", "bytes", "done": false}   ... then "done": true, "rc", "sent", "received", "error"
"beat" moves while it lives. rc 127: rsync is not installed here.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import posixpath
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import IO, Any, NoReturn

STAGE_DIR = "vidcluster/stage"  # in the cluster user's home on every node
BEAT_SECONDS = 1.0
STOP_WAIT = 30.0
TOTAL = re.compile(rb"^Total bytes (sent|received): ([\d,]+)")


def key(text: str) -> str:
    """A short stable name for a request's path (a source, a destination)."""
    return hashlib.sha1(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Handle:
    """One handle in a stage folder and the files beside it; ``stage`` as the reader needs it (absolute on the
    node, or relative to the home for rsync's remote side)."""

    stage: str
    name: str

    @classmethod
    def of(cls, stage: str, kind: str, request: str, node: str) -> Handle:
        """``kind`` "d": the destination ``request`` on ``node``; "s": the source folder ``request`` on it."""
        return cls(stage, f"{kind}{key(request)}.{node}")

    @property
    def path(self) -> str:
        return posixpath.join(self.stage, self.name)

    @property
    def manifest(self) -> str:
        return f"{self.path}.manifest.json"

    @property
    def need(self) -> str:
        return f"{self.path}.need"

    @property
    def lock(self) -> str:
        return f"{self.path}.lock"

    def progress(self, token: str) -> str:
        return f"{self.path}.{token}.progress"

    def old_progress(self) -> list[str]:
        return glob.glob(glob.escape(self.path) + ".*.progress")


@dataclass(frozen=True)
class Controller:
    """The controller's side of one play's copies, in its cache folder."""

    cache: str
    token: str  # this play's, drawn once

    def manifest(self, source: str) -> str:
        """The manifest cache of a source (its absolute controller path, or NODE:path)."""
        return posixpath.join(self.cache, f"{key(source)}.json")

    @property
    def run_dir(self) -> str:
        return posixpath.join(self.cache, "runs", self.token)

    def lock(self, handle: Handle, address: str) -> str:
        """The lock of the copy the controller sends into ``handle`` on the node it reaches at ``address``
        (user@host:port): a node's name alone is one inventory's, and a play on another cluster with a node of the
        same name must not stop this copy as if an interrupted play had left it."""
        return posixpath.join(self.cache, f"{handle.name}.{key(address)}.lock")

    def progress(self, node: str) -> str:
        return posixpath.join(self.run_dir, f"{node}.progress")

    def record(self, node: str) -> str:
        return posixpath.join(self.run_dir, f"{node}.json")


def rsync_problem() -> str:
    """'' when rsync runs here, else why not."""
    try:
        done = subprocess.run(["rsync", "--version"], capture_output=True, text=True, check=False)
    except OSError as exc:
        return str(exc.strerror)
    return "" if done.returncode == 0 else f"rsync --version exits {done.returncode}"


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
    """Fork a daemon for the copy. In the caller: None once the daemon has started (OSError with the reason when it
    could not). In the daemon: the pipe to write a failure to, and close once started."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child:
        os.close(write_end)
        with os.fdopen(read_end, "rb") as r:
            problem = r.read().decode(errors="replace")
        os.waitpid(child, 0)
        if problem:
            raise OSError(problem)
        return None
    os.close(read_end)
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    return write_end


def copy(lock_path: str, progress_path: str, command: list[str], detached: bool = False) -> int:
    """Run one rsync (``command``), keeping its progress file, and return its exit status; with ``detached``, return
    0 once it has started in a daemon of its own (which exits when the copy ends, never returning to its caller)."""
    started = detach() if detached else None
    if detached and started is None:
        return 0
    try:
        lock = take_over(lock_path)
        progress = Progress(progress_path)
        progress.write()
    except OSError as exc:
        if started is None:
            raise SystemExit(str(exc)) from None
        os.write(started, str(exc).encode())
        os._exit(1)
    if started is not None:
        os.close(started)
    rc = _run(command, progress)
    lock.close()
    if detached:
        os._exit(rc)  # the daemon leaves here: never back into its caller (an Ansible module's code)
    return rc


def _run(command: list[str], progress: Progress) -> int:
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except FileNotFoundError:
        progress.finish(127, f"{command[0]} is not installed")
        return 127

    def stop(signum: int, _frame: object) -> NoReturn:
        proc.terminate()
        progress.finish(128 + signum, f"stopped by signal {signum}")
        os._exit(128 + signum)

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
    return rc


if __name__ == "__main__":  # the controller's own copy: python stage.py copy LOCK PROGRESS RSYNC_ARG...
    if len(sys.argv) < 5 or sys.argv[1] != "copy":
        sys.exit("usage: stage.py copy LOCK PROGRESS RSYNC_ARG...")
    sys.exit(copy(sys.argv[2], sys.argv[3], sys.argv[4:]))
