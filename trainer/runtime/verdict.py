"""What a failure is, and which node failed first: decided here, and nowhere else.

A failure is a dict ``{"node", "kind", "reason", "at", "rc"}``: ``at`` the wall-clock time of the failed part's last
sign of life (the exit its supervisor saw, its last heartbeat, its last report to the hub), ``rc`` the trainer's exit
status when it has one. The kinds, as the node that saw them names them:

    rejected   the trainer exited with status 2: its input (config, data, weights) is bad; a restart cannot fix it
    stopped    a user stopped the job (stop-training.yml)
    preempted  the node was told to make way (SIGTERM/SIGUSR1 to its supervisor); the trainer checkpointed (75)
    killed     the trainer was killed by a signal, or ended without an exit status
    frozen     a training process stopped beating (SIGSTOP, a hung filesystem, a wedged driver)
    lost       the node stopped answering the hub, never joined, or did not confirm its trainer stopped
    exited     the trainer exited with another status (a crash, or the loss of its peers)

When one node fails, its peers fail soon after, in the collective they were waiting in ("connection closed by peer"):
those are consequences. So the first failure is the earliest one of the most telling tier of kinds: a bad input or a
user's stop; then what happened to a node from outside (killed, frozen, lost: whichever came first); then a
preemption; then plain exits.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Mapping
from typing import Any

from trainer.runtime.contract import EXIT_PREEMPTED, EXIT_REJECTED

# Kinds by tier: a failure of an earlier tier explains the later ones; within a tier, the earlier failure does.
TIERS = (("rejected", "stopped"), ("killed", "frozen", "lost"), ("preempted",), ("exited",))
KINDS = tuple(kind for tier in TIERS for kind in tier)


def exit_failure(rc: int | None) -> tuple[str, str]:
    """(kind, words) for a trainer that ended with status ``rc`` (None: no status, a negative one: a signal)."""
    if rc is None:
        return "killed", "its trainer ended without an exit status"
    if rc < 0:
        try:
            name = f" ({signal.Signals(-rc).name})"
        except ValueError:
            name = ""
        return "killed", f"its trainer was killed by signal {-rc}{name}"
    if rc == EXIT_REJECTED:
        return "rejected", f"its trainer rejected its input (exit status {EXIT_REJECTED}; the log says what to fix)"
    if rc == EXIT_PREEMPTED:
        return "preempted", f"its trainer checkpointed and stopped when asked (exit status {EXIT_PREEMPTED})"
    return "exited", f"its trainer exited with status {rc}"


def failure(node: str, kind: str, reason: str, at: float, rc: int | None = None) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown failure kind {kind!r}")
    return {"node": node, "kind": kind, "reason": reason, "at": at, "rc": rc}


def first_failure(failures: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The failure that explains the others (see the module docstring), or None when there is none."""
    def tier(kind: str) -> int:
        return next(i for i, kinds in enumerate(TIERS) if kind in kinds)

    ranked = sorted(failures, key=lambda f: (tier(f["kind"]), float(f["at"])))
    return dict(ranked[0]) if ranked else None


def words(first: Mapping[str, Any]) -> str:
    """'node1 failed first: its trainer was killed by signal 9 (SIGKILL)'."""
    return f"{first['node']} failed first: {first['reason']}"
