"""Who failed first (trainer.runtime.job.verdict) and what the job does next (trainer.runtime.job.policy): pure
rules."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.runtime import schema
from trainer.runtime.job.policy import decide, grow
from trainer.runtime.job.record import Failure, Kind
from trainer.runtime.job.verdict import exit_failure, first_failure, words


def test_the_cause_comes_first_whatever_the_clocks_say() -> None:
    # node1 was killed; node0 noticed its peer was gone (exit 1) a moment *before* node1's supervisor saw the kill.
    lost_peer = Failure("node0", *exit_failure(1), at=100.0, rc=1)
    killed = Failure("node1", *exit_failure(-9), at=100.4, rc=-9)
    assert first_failure([lost_peer, killed]).node == "node1"
    said = words(first_failure([lost_peer, killed]))
    assert said == "node1 failed first: its trainer was killed by signal 9 (SIGKILL)"
    bad_input = Failure("node2", *exit_failure(2), at=101.0, rc=2)  # a bad input explains everything
    assert first_failure([lost_peer, killed, bad_input]).kind == "rejected"
    frozen = Failure("node0", Kind.FROZEN, "no heartbeat for 61 s", at=50.0)
    assert first_failure([killed, frozen]).node == "node0"  # same rank of kinds: the earlier one
    assert first_failure([]) is None
    assert exit_failure(75)[0] == "preempted" and exit_failure(None)[0] == "killed"
    with pytest.raises(schema.SchemaError, match="failure: kind: 'crashed' is not one of rejected, stopped"):
        schema.parse(Failure, {"node": "node0", "kind": "crashed", "reason": "?", "at": 0.0, "rc": None}, "failure")


def choose(first: Failure, previous: Failure | None = None, lost: dict[str, str] | None = None,
           available: tuple[str, ...] = (), used: int = 0, most: int = 3, waited: bool = False, min_nodes: int = 3,
           drop_slow: bool = False) -> Any:
    return decide(first=first, previous=previous, assignment={"node0": 0, "node1": 1, "node2": 2},
                  lost=lost or {}, available=available, restarts_used=used, max_restarts=most, waited=waited,
                  node_wait=300, min_nodes=min_nodes, drop_slow=drop_slow)


KILLED = Failure("node1", *exit_failure(-9), at=1.0, rc=-9)


def test_a_failure_restarts_the_same_nodes_in_the_same_ranks() -> None:
    decision = choose(KILLED)
    assert decision.action == "restart" and decision.replaced == {}
    assert decision.assignment == {"node0": 0, "node1": 1, "node2": 2}
    assert decision.reason.endswith("restart 1 of 3")


def test_what_a_restart_cannot_fix_ends_the_job() -> None:
    rejected = choose(Failure("node2", *exit_failure(2), at=1.0, rc=2), available=("spare",))
    assert (rejected.action, rejected.end_state) == ("end", "failed")
    assert "a restart cannot fix a bad input" in rejected.reason
    stopped = choose(Failure("node0", Kind.STOPPED, "stopped by user: stop-training.yml", at=1.0))
    assert (stopped.action, stopped.end_state) == ("end", "stopped")
    used = choose(KILLED, used=3)
    assert used.action == "end" and "no restart left (3 of 3 used)" in used.reason
    assert "restarts are off (max_restarts 0)" in choose(KILLED, most=0).reason


def test_a_node_failing_again_is_replaced_by_a_spare_or_given_up_on() -> None:
    again = choose(KILLED, previous=KILLED, available=("spare",), used=1)
    assert again.action == "restart" and again.replaced == {"node1": "spare"}
    assert again.assignment == {"node0": 0, "spare": 1, "node2": 2}  # the healthy nodes keep their ranks
    no_spare = choose(KILLED, previous=KILLED, used=1)
    assert no_spare.action == "end" and "the same way as in the attempt before" in no_spare.reason
    other_way = choose(KILLED, previous=Failure("node1", Kind.FROZEN, "no heartbeat", at=0.0), used=1)
    assert other_way.action == "restart" and other_way.replaced == {}


def test_a_lost_node_is_replaced_and_rank_0_moves_to_the_node_with_the_second_copy() -> None:
    lost = Failure("node0", Kind.LOST, "it stopped answering the hub", at=1.0)
    decision = choose(lost, lost={"node0": "it stopped answering the hub"}, available=("node1", "spare"))
    assert decision.action == "restart" and decision.replaced == {"node0": "spare"}
    assert decision.assignment == {"node1": 0, "spare": 1, "node2": 2}
    waiting = choose(lost, lost={"node0": "it stopped answering the hub"})
    assert waiting.action == "wait" and waiting.waiting_for == ("node0",)
    assert "no spare: waiting up to 300 s for it to come back" in waiting.reason
    over = choose(lost, lost={"node0": "it stopped answering the hub"}, waited=True)
    assert over.action == "end" and "did not come back within 300 s" in over.reason


def test_the_same_node_failing_with_another_status_is_given_another_try() -> None:
    """"The same way" is the same kind and the same exit status: a crash (1) after another crash (3) is not a loop."""
    crashed = Failure("node1", *exit_failure(3), at=1.0, rc=3)
    again = Failure("node1", *exit_failure(1), at=2.0, rc=1)
    assert choose(again, previous=crashed, used=1).action == "restart"
    assert choose(again, previous=again, used=1).action == "end"


LOST1 = Failure("node1", Kind.LOST, "it stopped answering the hub", at=1.0)


def test_a_lost_node_without_a_spare_leaves_the_world_down_to_min_nodes() -> None:
    shrunk = choose(LOST1, lost={"node1": "silent"}, min_nodes=2)
    assert (shrunk.action, shrunk.left, shrunk.replaced) == ("restart", ("node1",), {})
    assert shrunk.assignment == {"node0": 0, "node2": 1}  # ranks compacted, in their order
    assert shrunk.reason.endswith("node1 leaves the world, no spare taking its rank: 3 nodes -> 2")
    spare_first = choose(LOST1, lost={"node1": "silent"}, available=("spare",), min_nodes=1)
    assert spare_first.replaced == {"node1": "spare"} and spare_first.left == ()  # a free spare still takes the rank
    two = choose(LOST1, lost={"node1": "silent", "node2": "silent"}, min_nodes=1)
    assert two.left == ("node1", "node2") and two.assignment == {"node0": 0}


def test_rank_0_lost_goes_to_the_node_with_the_second_copy_and_the_ranks_close_up() -> None:
    lost0 = Failure("node0", Kind.LOST, "it stopped answering the hub", at=1.0)
    decision = choose(lost0, lost={"node0": "silent"}, min_nodes=2)
    assert decision.left == ("node0",) and decision.assignment == {"node1": 0, "node2": 1}


def test_below_min_nodes_a_lost_node_is_waited_for_then_the_job_ends() -> None:
    both = {"node1": "silent", "node2": "silent"}
    waiting = choose(LOST1, lost=both, min_nodes=2)
    assert (waiting.action, waiting.waiting_for, waiting.left) == ("wait", ("node1", "node2"), ())
    assert "(the job trains on 2 nodes at least, 1 would be left)" in waiting.reason
    over = choose(LOST1, lost=both, min_nodes=2, waited=True)
    assert over.action == "end" and over.end_state == "failed" and "did not come back within 300 s" in over.reason


def test_min_nodes_of_every_trainer_keeps_the_wait_as_before() -> None:
    waiting = choose(LOST1, lost={"node1": "silent"}, min_nodes=3)
    assert waiting.action == "wait" and waiting.left == ()
    assert waiting.reason == "node1 was lost (silent); no spare: waiting up to 300 s for it to come back"


def test_a_dropped_straggler_leaves_the_world_without_taking_a_spare() -> None:
    slow = Failure("node0", Kind.SLOW, "a straggler", at=1.0)
    dropped = choose(slow, available=("spare",), min_nodes=2, drop_slow=True)
    assert (dropped.action, dropped.left, dropped.replaced) == ("restart", ("node0",), {})
    assert dropped.assignment == {"node1": 0, "node2": 1}
    kept = choose(slow, min_nodes=3, drop_slow=True)  # too few would be left: it trains on
    assert kept.action == "restart" and kept.left == () and kept.assignment == {"node0": 0, "node1": 1, "node2": 2}


def test_a_smaller_world_grows_back_to_its_full_size_every_node_keeping_its_rank() -> None:
    """node1 left a 4-node world (ranks closed up); node1, back, and a spare join it: they take the next ranks, in
    the order given, up to the full size, and nodes already in the world are never joiners."""
    shrunk = {"node0": 0, "node2": 1}
    back = grow(shrunk, 4, ("node2", "node1", "spare"))
    assert back is not None and back.action == "restart" and back.joined == ("node1", "spare")
    assert back.assignment == {"node0": 0, "node2": 1, "node1": 2, "spare": 3}
    assert (back.left, back.replaced) == ((), {})
    assert back.reason == "node1, spare join the world: 2 nodes -> 4"
    capped = grow(shrunk, 3, ("node1", "spare"))
    assert capped is not None and capped.joined == ("node1",) and capped.assignment == {**shrunk, "node1": 2}
    assert capped.reason == "node1 joins the world: 2 nodes -> 3"


def test_a_full_world_or_one_with_no_free_member_does_not_grow() -> None:
    assert grow({"node0": 0, "node1": 1, "node2": 2}, 3, ("spare",)) is None  # full
    assert grow({"node0": 0, "node1": 1}, 2, ("spare",)) is None  # full after a drop (the full size is less)
    assert grow({"node0": 0, "node1": 1}, 3, ()) is None
    assert grow({"node0": 0, "node1": 1}, 3, ("node1",)) is None  # in the world already


def test_a_joiners_first_failure_is_not_its_second() -> None:
    """The attempt before began with node1 joining (no failure): node1 killed now is a first failure, given another
    try in its rank, not a repeat that takes the spare or ends the job."""
    joined = Failure("node1", Kind.JOINED, "node1 joins the world: 2 nodes -> 3", at=0.5)
    decision = choose(KILLED, previous=joined, available=("spare",), used=1)
    assert decision.action == "restart" and decision.replaced == {}
    assert decision.assignment == {"node0": 0, "node1": 1, "node2": 2}
    assert choose(KILLED, previous=KILLED, available=("spare",), used=1).replaced == {"node1": "spare"}
