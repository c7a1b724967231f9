"""Decoding under a time limit: the decoder runs in a helper process that can be abandoned.

A broken file can hang a decoder inside its C code while it holds the GIL (decord #373): no thread of that process
runs again, so no timer inside it can stop the decoder. Killing the DataLoader worker from outside does not help
either: torch raises the worker's death in the training process from its SIGCHLD handler, at whatever line that
process is on, and a DataLoader cannot replace one of its workers. So each process that decodes (every DataLoader
worker, or the training process itself with NUM_WORKERS 0) forks one helper the first time it needs one, and opens
and reads its videos there. It waits for each answer until the clip's deadline (waiting releases its own GIL); when
the deadline passes it kills the helper, the video is bad ("decoding took longer than N s"), and the next video gets
a new helper. A helper that dies (a decoder that crashes on a file) makes the video bad the same way, where it would
have taken the worker, and with it the run, down. A helper says it is ready before a clip's clock starts: one forked
while another thread of its parent held a lock it needs would never answer, and would make a good video bad; it is
forked again instead (FORK_LIMIT).

    limit = TimeLimit(60.0)
    within = limit.start()                          # one deadline for everything one clip needs
    n = within.call(open_video, path)               # open_video(state, path) runs in the helper
    frames = within.call(read_frames, indices)      # a CPU tensor comes back through shared memory

A call is ``fn(state, *args)`` with a module-level ``fn`` (pickled by name; the forked helper has the same code) and
``state`` a dict the helper keeps between calls (an open reader). A tensor result comes back in a memfd the helper
fills and passes over the socket: one copy of the frames, no pickling; anything else is pickled.

The helper ignores stop signals (they are the training process's, as in the DataLoader workers) and ends with its
parent: on the end of its socket, or by the kernel (PR_SET_PDEATHSIG) when the parent is killed.

``TimeLimit(seconds, spawn=MODULE)`` (GPU decoding: CUDA cannot be used in a forked child of a process that uses it)
starts each helper as a fresh interpreter instead (``python -c``, this package on its path, the socket passed as a
file descriptor) that imports MODULE (the calls' functions) before it says it is ready, within START_LIMIT: its start
is not charged to a clip's deadline. A tensor still comes back as a CPU tensor (the caller moves it to its device).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import importlib
import mmap
import os
import pickle
import select
import signal
import socket
import sys
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import torch

from trainer.errors import first_line

MAX_MESSAGE = 1 << 20  # requests and answers other than frames are small: a path, a clip's frame indices
PR_SET_PDEATHSIG = 1
START_LIMIT = 300.0  # seconds a spawned helper may take to import torch and say it is ready (a loaded node)
# Seconds a forked helper may take to say it is ready. It imports nothing: one that takes longer is stuck on a lock
# that another thread of its parent (gloo's, a checkpoint writer's) held when it forked, and a new one is forked, up to
# FORK_TRIES times.
FORK_LIMIT = 10.0
FORK_TRIES = 3
READY = b"ready"
# A spawned helper's program: the package this file is in importable, then serve (argv: socket fd, parent pid, the
# module to import first).
SPAWNED = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r}); "
           "from trainer.data.timelimit import serve_spawned; serve_spawned()")

State = dict[str, Any]
# Looked up here, in the parent: a forked child that called dlopen or dlsym could wait forever on the dynamic loader's
# lock, held by another thread of its parent when it forked.
PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


class TimeLimitExceeded(Exception):
    """The call did not end before the deadline; the helper was killed. The message is the video's reason."""


class HelperDied(Exception):
    """The helper ended during the call (a decoder that crashed); the message says how."""


class HelperError(Exception):
    """The call raised in the helper; the message is that exception's first line."""


EXCEEDED = "decoding took longer than"


def exceeded_reason(limit: float) -> str:
    """What a video whose decoding ran out of time is reported with."""
    return f"{EXCEEDED} {limit:g} s"


def is_exceeded(reason: str) -> bool:
    """Whether a bad video's reason says its decoding ran out of time (it would hang again)."""
    return reason.startswith(f"{EXCEEDED} ")


class Helper:
    """One forked (or spawned) process that runs calls for the process that started it, one at a time."""

    def __init__(self, spawn: str | None = None) -> None:
        limit, tries = (START_LIMIT, 1) if spawn is not None else (FORK_LIMIT, FORK_TRIES)
        for _ in range(tries):
            self._start(spawn)
            if select.select([self.sock], [], [], limit)[0] and self.sock.recv(MAX_MESSAGE) == READY:
                return
            ended = self.stop()
        raise HelperDied(f"the decoder's process did not start within {limit:g} s ({ended})")

    def _start(self, spawn: str | None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        if spawn is not None:
            theirs.set_inheritable(True)
            argv = [sys.executable, "-c", SPAWNED, str(theirs.fileno()), str(parent), spawn]
            pid = os.posix_spawn(sys.executable, argv, os.environ)
        else:
            pid = os.fork()
            if pid == 0:
                ours.close()
                _serve(theirs, parent)
        theirs.close()
        self.pid, self.sock, self.owner = pid, ours, parent
        # When this object goes (a dataset dropped, the process ending), so does the helper. A forked child (a
        # DataLoader worker) holds a copy of this object: there it only closes its copy of the socket.
        self._release = weakref.finalize(self, _release, pid, ours, parent)

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float) -> Any:
        """``fn(state, *args)`` in the helper; TimeLimitExceeded (the helper killed) when it is not done by
        ``deadline`` (time.monotonic()), HelperDied or HelperError when it ended otherwise."""
        try:
            self.sock.send(pickle.dumps((fn, args)))
        except OSError:  # it died since the last call (killed from outside)
            raise HelperDied(f"the decoder's process died ({self.stop()})") from None
        if not select.select([self.sock], [], [], max(deadline - time.monotonic(), 0.0))[0]:
            self.stop()
            raise TimeLimitExceeded
        message, fds, _, _ = socket.recv_fds(self.sock, MAX_MESSAGE, 1)
        if not message:
            raise HelperDied(f"the decoder's process died ({self.stop()})")
        kind, value = pickle.loads(message)
        if kind == "error":
            raise HelperError(value)
        return _tensor_from(fds[0], value) if kind == "tensor" else value

    def stop(self) -> str:
        """Kill the helper and reap it; how it ended, in words."""
        status = self._release() or 0  # once: the pid is not ours to signal after it was reaped
        if os.WIFSIGNALED(status):
            return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        return f"exit status {os.WEXITSTATUS(status)}"


def _release(pid: int, sock: socket.socket, owner: int) -> int:
    """Close the socket; in the helper's parent, also kill and reap the helper (its wait status, else 0)."""
    sock.close()
    if os.getpid() != owner:
        return 0
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


class TimeLimit:
    """Each clip's deadline, and this process's helper (forked when first needed, again after one was killed).
    Cheap to pickle: the helper stays with the process that forked it."""

    def __init__(self, seconds: float, spawn: str | None = None) -> None:
        self.seconds = seconds
        self.spawn = spawn
        self._helper: Helper | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "spawn": self.spawn, "_helper": None}

    def start(self) -> Deadline:
        self.helper()  # started before the clock is: a helper's start is not charged to the clip
        return Deadline(self, time.monotonic() + self.seconds)

    def helper(self) -> Helper:
        helper = self._helper
        if helper is None or helper.owner != os.getpid() or helper.sock.fileno() < 0:
            # A DataLoader worker inherits its parent's helper object: that helper is the parent's, not the worker's.
            helper = self._helper = Helper(self.spawn)
        return helper


class Deadline:
    """Calls that must all be done by one point in time (a clip: opening the video and reading its frames)."""

    def __init__(self, limit: TimeLimit, at: float) -> None:
        self.limit = limit
        self.at = at

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self.limit.helper().call(fn, args, self.at)
        except TimeLimitExceeded:
            raise TimeLimitExceeded(exceeded_reason(self.limit.seconds)) from None


# ---------------------------------------------------------------------------------------------------------------------
# The helper's side


def _serve(sock: socket.socket, parent: int) -> NoReturn:
    """The helper's life: say it is ready, then answer calls until the parent goes. Never returns (and never runs the
    parent's exit handlers: os._exit)."""
    status = 1
    try:
        _become_helper(parent)
        sock.send(READY)
        state: State = {}
        while message := sock.recv(MAX_MESSAGE):
            fn, args = pickle.loads(message)
            fds: list[int] = []
            try:
                result = fn(state, *args)
                if isinstance(result, torch.Tensor):
                    fd, shape = _tensor_to_memfd(result)
                    fds, answer = [fd], ("tensor", shape)
                else:
                    answer = ("value", result)
            except Exception as exc:
                answer = ("error", first_line(exc))
            socket.send_fds(sock, [pickle.dumps(answer)], fds)
            for fd in fds:
                os.close(fd)
        status = 0
    finally:
        os._exit(status)


def serve_spawned() -> NoReturn:
    """A spawned helper's life (SPAWNED runs it): its socket, parent and module from argv; ready once imported."""
    importlib.import_module(sys.argv[3])
    _serve(socket.socket(fileno=int(sys.argv[1])), int(sys.argv[2]))


def die_with_parent(parent: int) -> None:
    """From now on the kernel kills this process when ``parent`` (the thread of it that started this process) ends,
    however it ends; this process ends now if it already has."""
    if PRCTL is not None:
        PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl
            os._exit(0)


def _become_helper(parent: int) -> None:
    # The parent's stop signals are its own (its DataLoader workers ignore them too); the helper ends with it.
    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    # What the helper has to say comes back over its socket, as a video's reason: the decoders' own prints (decord
    # logs every file it fails to open before it raises) and a crash's traceback of the parent's stack would only
    # add lines to the training log.
    faulthandler.disable()
    quiet = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(quiet, fd)
    os.close(quiet)
    die_with_parent(parent)  # even while a decoder hangs
    # A forked process must not enter its parent's OpenMP thread pool (it hangs there): copies run in this thread.
    torch.set_num_threads(1)


def _tensor_to_memfd(tensor: torch.Tensor) -> tuple[int, tuple[int, ...]]:
    """A memfd holding the uint8 tensor's values, and its shape."""
    if tensor.dtype != torch.uint8 or tensor.device.type != "cpu" or tensor.numel() == 0:
        raise TypeError(f"only non-empty uint8 CPU tensors come back from the helper, not {tensor.dtype} "
                        f"{tuple(tensor.shape)} on {tensor.device}")
    fd = os.memfd_create("vidcluster-frames", os.MFD_CLOEXEC)
    os.ftruncate(fd, tensor.numel())
    with mmap.mmap(fd, tensor.numel()) as shared:
        target = torch.frombuffer(shared, dtype=torch.uint8).view(tensor.shape)
        target.copy_(tensor)
        del target  # the mapping closes only once no tensor uses it
    return fd, tuple(tensor.shape)


def _tensor_from(fd: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The helper's tensor, mapped (no copy): the mapping lives as long as the tensor."""
    try:
        shared = mmap.mmap(fd, int(torch.Size(shape).numel()))
    finally:
        os.close(fd)
    return torch.frombuffer(shared, dtype=torch.uint8).view(shape)
