"""The supervisor's lines in the node's train.log (its stdout, shared with its trainer's output), and saying a thing
once: what a peer or a bug may repeat thousands of times a second costs one line, not a full disk."""

from __future__ import annotations

import time
from collections.abc import Callable

Say = Callable[[str], None]
ONCE_KEPT = 256  # distinct things said once; past that, one line says that more went unsaid


def say(message: str) -> None:
    """A line of the node's supervisor, with the time."""
    print(f"supervisor: {message} at {time.strftime('%F %T')}", flush=True)


class Once:
    """Says each thing (by its key) the first time only; remembers at most ``kept`` keys."""

    def __init__(self, say: Say, kept: int = ONCE_KEPT) -> None:
        self.say, self.kept = say, kept
        self.keys: set[str] = set()
        self.full = False

    def __call__(self, key: str, message: str) -> None:
        if key in self.keys:
            return
        if len(self.keys) < self.kept:
            self.keys.add(key)
            self.say(message)
        elif not self.full:
            self.full = True
            self.say(f"more than {self.kept} distinct problems; the others are not logged")
