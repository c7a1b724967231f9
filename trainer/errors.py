"""How a command ends, as its exit status says to whoever restarts it (a node supervisor, torchrun, Slurm):

* 0: finished;
* 2 (``USER_ERROR_EXIT``): the input is bad (a config, a missing list, an unknown model, a bad checkpoint or weights
  file, data that cannot be read): a restart cannot fix it. One line ``error: <message>``, no traceback;
* 75 (``PREEMPTED_EXIT``, EX_TEMPFAIL): stopped on request (SIGTERM or SIGUSR1) after every rank saved a checkpoint
  at the same step: start it again to resume. One line ``preempted: <message>``;
* anything else: a failure a restart may get past: 1 for a lost peer, a missed rendezvous or a crashed worker
  (``distributed.PeerError``: one line), or a bug (with its traceback).

Every command runs its body through ``report_user_errors``, which turns a ``UserError`` or ``Preempted`` into its
line and status, whether it rose in this process, in a spawned worker (see ``trainer.distributed``) or in a torchrun
worker. This module imports nothing heavy: the config check runs on controllers without torch.
"""

from __future__ import annotations

import pickle
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, TypeVar

from trainer.runtime.contract import EXIT_PREEMPTED as PREEMPTED_EXIT
from trainer.runtime.contract import EXIT_REJECTED as USER_ERROR_EXIT

T = TypeVar("T")
# How a stop is asked for: what schedulers and spot notices send (Slurm's --signal, a node supervisor passing on what
# it got); the trainer checkpoints at the next optimizer step on every rank and ends with PREEMPTED_EXIT.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def restore_stop_handlers(previous: dict[signal.Signals, Any], stopping: bool) -> None:
    """The stop signals' handlers as they were; but a process on its way out after a stop ignores them from now on
    (``ignore_stop_signals``)."""
    if stopping:
        ignore_stop_signals()
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def ignore_stop_signals() -> None:
    """A process that is ending after a stop ignores further stop signals: a second one (a supervisor and the process
    that spawned it both pass one on, a user signals twice) would otherwise meet the default action while the process
    ends, and turn its clean stop (exit status 75) into a death by that signal."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class UserError(Exception):
    """Bad input; the message names the file, key, model or node at fault and what to change."""

    exit_status = USER_ERROR_EXIT  # a restart cannot fix it (a launcher's restart policy reads this status)


class CheckpointError(UserError):
    """A checkpoint file that cannot be read or does not fit the model."""


class Preempted(Exception):
    """Every rank stopped at the same optimizer step on a signal, with a checkpoint of that step on disk."""


def lost_peer(exc: BaseException) -> bool:
    """A collective failed because another process went away: that process's own error is the one to report."""
    if type(exc).__name__ in ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    return any(marker in str(exc) for marker in ("closed by peer", "reset by peer", "Broken pipe"))


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (C++ and state-dict errors run to many lines), else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def reading_checkpoint(what: str) -> Iterator[None]:
    """Turn what torch raises on a bad checkpoint (not a pickle, truncated, another model's) into one line."""
    try:
        yield
    except UserError:
        raise
    except (pickle.UnpicklingError, OSError, EOFError, RuntimeError, ValueError, KeyError) as exc:
        if lost_peer(exc):
            raise  # a rank waiting for another's checkpoint lost it: not this file's fault
        # load_state_dict's RuntimeError lists every mismatched tensor over many lines: keep the first.
        raise CheckpointError(f"{what}: cannot load it ({type(exc).__name__}: {first_line(exc)})") from exc


def report_user_errors(command: Callable[[], T]) -> T:
    """Run a command's body; a UserError becomes ``error: <message>`` on stderr and its exit status (2, or 1 for a
    PeerError), a Preempted ``preempted: <message>`` and exit status 75."""
    try:
        return command()
    except UserError as exc:
        _exit(f"error: {exc}", exc.exit_status)
    except Preempted as exc:
        _exit(f"preempted: {exc}", PREEMPTED_EXIT)


def _exit(line: str, status: int) -> NoReturn:
    sys.stderr.write(line + "\n")  # one write: torchrun's workers share the terminal
    sys.stderr.flush()
    raise SystemExit(status) from None
