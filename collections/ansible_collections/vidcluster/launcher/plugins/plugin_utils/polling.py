"""The launcher's one polling machine. A process runs detached on a node (a job's hub, a dataset copy) and writes what
it is doing (the job's status, a copy's progress file); the controller looks at it once per poll, prints a line each
time what it says changes, and stops when it ends, or when it gave no sign of life for too long. roles/ddp_launch's
``vidcluster_follow`` and roles/stage_data's ``stage_data_transfer`` are this loop with their own looks and words.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

S = TypeVar("S")  # what one look sees
R = TypeVar("R")  # what the watch ends with


@dataclass
class Poll(Generic[S, R]):
    """Look until ``ended`` or ``silent`` gives a result (or ``deadline`` passes: ``overtime``'s).

    ``look``: one look, None when nothing was heard. ``alive``: whether a state is a sign of life after the last one
    (any answer, or only a moving heartbeat). ``silent``: called with the seconds since the last sign of life after
    every look that gave none; its result ends the watch. ``key``/``line``: a line is shown when the key changes (at
    most every ``every`` seconds, but always for the state that ends the watch). ``pause``: seconds to wait before
    the next look, from the seconds since the start and whether this look was a sign of life. ``silent_for``:
    seconds of silence that went before this watch (one that carries on an earlier one); ``said``: the key of what
    was already said before the first look.
    """

    look: Callable[[], S | None]
    ended: Callable[[S], R | None]
    silent: Callable[[float], R | None]
    key: Callable[[S], Hashable]
    line: Callable[[S], str]
    show: Callable[[str], None]
    alive: Callable[[S, S | None], bool] = lambda state, last: True
    every: float = 0.0
    pause: Callable[[float, bool], float] = lambda elapsed, heard: 0.0
    deadline: float = math.inf  # time.monotonic() after which the watch stops with overtime()
    overtime: Callable[[], R] | None = None
    silent_for: float = 0.0
    said: Hashable = None

    def run(self) -> R:
        start = time.monotonic()
        heard, last, shown, shown_at = start - self.silent_for, None, self.said, -math.inf
        while True:
            state = self.look()
            now = time.monotonic()
            fresh = state is not None and self.alive(state, last)
            if fresh:
                heard = now
            result = None if fresh else self.silent(now - heard)
            if state is not None:
                last = state
                result = result if result is not None else self.ended(state)
                key = self.key(state)
                if key != shown and (result is not None or now - shown_at >= self.every):
                    self.show(self.line(state))
                    shown, shown_at = key, now
            if result is not None:
                return result
            if now >= self.deadline and self.overtime is not None:
                return self.overtime()
            time.sleep(self.pause(now - start, fresh))


def on_node(action: ActionBase, module: str, args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any] | None:
    """One module call on the task's host, or None when the host did not answer (unreachable: silence, not a
    failure; what the module itself says, failed or not, is the caller's to read)."""
    try:
        out = action._execute_module(module_name=module, module_args=args, task_vars=task_vars)
    except AnsibleConnectionFailure:
        return None
    return None if out.get("unreachable") else out
