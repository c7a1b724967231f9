"""Who is the job's hub after its hub is lost: pure decisions, made here and carried out by the supervisor's member
(trainer.runtime.watch.member) and listener (trainer.runtime.watch.listener).

Hubs succeed each other in member order (the trainers by node rank, then the spares), by term: the hub of term ``t``
is member ``t mod M``. A member that has lost its hub first asks that hub once more: one that answers with the record is
followed again (the member was the one cut off, or stalled; ``back_to_lost_hub``). Otherwise it looks for the hub of
the next term: it asks that term's candidate (a join naming the term). The candidate

- becomes the hub, when it is looking for a hub itself and the term is not older than its own (``takes_over``);
- answers with the job's record, when it is the hub already: the member follows it;
- points to the hub it still hears: the member asks that hub, unless it names the hub that was lost;
- cannot be reached: the member moves on to the next term's candidate (``after_answer``).

A member that is itself the candidate of the term it looks for becomes the hub. Whether a hub so chosen may start an
attempt is the hub's to decide: only while it hears a majority (trainer.runtime.job.hub).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from trainer.runtime.watch.messages import Mode, NotHub, RecordReply, Reply


def candidate(order: Sequence[str], term: int) -> str:
    """The member that is the hub of ``term``."""
    return order[term % len(order)]


def takes_over(me: str, order: Sequence[str], mode: Mode, my_term: int, asked_term: int) -> bool:
    """Asked by a member to be the hub of ``asked_term``: does this supervisor become the hub?"""
    return mode == Mode.SEARCHING and asked_term >= my_term and candidate(order, asked_term) == me


class Move(StrEnum):
    BECOME_HUB = "become_hub"  # this member is the term's candidate
    ASK = "ask"  # ask the term's candidate
    FOLLOW = "follow"  # ``addr`` is the hub: follow it
    ASK_HUB = "ask_hub"  # the candidate hears a hub at ``addr``: ask it
    NEXT_TERM = "next_term"  # the candidate cannot be reached: the next term's candidate is asked
    AGAIN = "again"  # the candidate looks for a hub too (or names the lost one): ask it again after a pause


@dataclass(frozen=True)
class Step:
    move: Move
    term: int
    addr: str | None = None


def back_to_lost_hub(me: str, order: Sequence[str], term: int, lost_addr: str | None, answer: Reply | None) -> Step:
    """After asking the lost hub (at ``lost_addr``) once more: follow it if it answered as the hub, else look for the
    hub of ``term``."""
    if isinstance(answer, RecordReply):
        return Step(Move.FOLLOW, term - 1, lost_addr)
    return first_step(me, order, term)


def first_step(me: str, order: Sequence[str], term: int) -> Step:
    """Looking for the hub of ``term``: become it, or ask its candidate."""
    return Step(Move.BECOME_HUB if candidate(order, term) == me else Move.ASK, term)


def after_answer(term: int, asked: str | None, answer: Reply | None, lost_hub: str) -> Step:
    """What to do after asking the member at ``asked`` to be the hub of ``term`` (``answer`` None: no answer)."""
    if isinstance(answer, RecordReply):
        return Step(Move.FOLLOW, term, asked)
    if answer is None:
        return Step(Move.NEXT_TERM, term + 1)
    assert isinstance(answer, NotHub)
    if not answer.searching and answer.hub != lost_hub and answer.addr:
        return Step(Move.ASK_HUB, term, answer.addr)
    return Step(Move.AGAIN, term)
