"""Errors a user can fix (a bad config, a missing list, an unknown model, a bad checkpoint): one line, no traceback.

Every command catches ``UserError`` at its top (``report_user_errors``), prints ``error: <message>`` and exits with
status 2, whether the error rose in this process, in a spawned worker (see ``trainer.distributed``) or in a torchrun
worker. Anything else is a bug and keeps its traceback. This module imports nothing heavy: the config check runs on
controllers without torch.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")
USER_ERROR_EXIT = 2


class UserError(Exception):
    """Bad input; the message names the file, key, model or node at fault and what to change."""

    exit_status = USER_ERROR_EXIT  # a restart cannot fix it (a launcher's restart policy reads this status)


class CheckpointError(UserError):
    """A checkpoint file that cannot be read or does not fit the model."""


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
    """Run a command's body; a UserError becomes ``error: <message>`` on stderr and exit status 2."""
    try:
        return command()
    except UserError as exc:
        sys.stderr.write(f"error: {exc}\n")  # one write: torchrun's workers share the terminal
        sys.stderr.flush()
        raise SystemExit(exc.exit_status) from None
