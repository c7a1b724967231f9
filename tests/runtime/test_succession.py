"""Who the next hub is (trainer.runtime.watch.succession): pure decisions, every branch."""

from __future__ import annotations

from tests.runtime.test_records import a_record
from trainer.runtime.watch.messages import Mode, NotHub, RecordReply, Says
from trainer.runtime.watch.succession import (
    Move,
    Step,
    after_answer,
    back_to_lost_hub,
    candidate,
    first_step,
    takes_over,
)

ORDER = ("n0", "n1", "n2")  # trainers by node rank, then spares
RECORD = RecordReply(says=Says.RECORD, record=a_record(), changes=None, progress=None)


def not_hub(hub: str, searching: bool = False, addr: str | None = "10.0.0.2:4000") -> NotHub:
    return NotHub(says=Says.NOT_HUB, hub=hub, term=1, searching=searching, addr=addr)


def test_hubs_succeed_each_other_in_member_order_by_term() -> None:
    assert [candidate(ORDER, term) for term in range(5)] == ["n0", "n1", "n2", "n0", "n1"]
    assert first_step("n1", ORDER, 1).move == Move.BECOME_HUB  # this member is the next term's candidate
    assert first_step("n2", ORDER, 1) == Step(Move.ASK, 1)


def test_a_candidate_takes_over_only_while_it_looks_for_a_hub_itself_and_for_no_older_term() -> None:
    assert takes_over("n1", ORDER, Mode.SEARCHING, my_term=0, asked_term=1)
    assert takes_over("n1", ORDER, Mode.SEARCHING, my_term=1, asked_term=4)  # n1 is the candidate of term 4 too
    assert not takes_over("n1", ORDER, Mode.MEMBER, my_term=0, asked_term=1)  # it still hears a hub
    assert not takes_over("n1", ORDER, Mode.HUB, my_term=1, asked_term=1)  # it is the hub already
    assert not takes_over("n1", ORDER, Mode.SEARCHING, my_term=4, asked_term=1)  # an older term
    assert not takes_over("n1", ORDER, Mode.SEARCHING, my_term=0, asked_term=2)  # n2's term


def test_after_asking_a_candidate() -> None:
    assert after_answer(1, "10.0.0.1:4000", RECORD, "n0") == Step(Move.FOLLOW, 1, "10.0.0.1:4000")
    assert after_answer(1, "10.0.0.1:4000", None, "n0").move == Move.NEXT_TERM  # unreachable: the next candidate
    assert after_answer(1, "10.0.0.1:4000", None, "n0").term == 2
    assert after_answer(1, "x", not_hub("n2"), "n0") == Step(Move.ASK_HUB, 1, "10.0.0.2:4000")  # it hears a hub
    assert after_answer(1, "x", not_hub("n0"), "n0").move == Move.AGAIN  # the hub it hears is the lost one
    assert after_answer(1, "x", not_hub("n2", searching=True), "n0").move == Move.AGAIN  # it looks too
    assert after_answer(1, "x", not_hub("n2", addr=None), "n0").move == Move.AGAIN  # it does not know where


def test_a_lost_hub_that_answers_again_is_followed_again() -> None:
    """The member was the one cut off (or stalled): the hub it lost is still the job's hub."""
    assert back_to_lost_hub("n2", ORDER, 1, "10.0.0.0:4000", RECORD) == Step(Move.FOLLOW, 0, "10.0.0.0:4000")
    assert back_to_lost_hub("n2", ORDER, 1, "10.0.0.0:4000", None).move == Move.ASK
    assert back_to_lost_hub("n1", ORDER, 1, "10.0.0.0:4000", not_hub("n0")).move == Move.BECOME_HUB
