"""The watch bench's small form (bench/watch_scale.py): a real hub process and 16 stand-in members on loopback
addresses. Its figures are real: the killed trainer and the silent member are named by the hub, the hub's sockets
carried bytes both ways, and members that hold the record are answered ``unchanged`` instead of being sent it."""

from __future__ import annotations

import asyncio

from bench import watch_scale

HEARTBEAT_S = 4.0  # as the loopback tests' jobs (tests/runtime/loopback.py): a report every 0.67 s


def test_16_members_a_killed_trainer_and_a_silent_member_are_named_and_steady_reports_get_unchanged() -> None:
    found = asyncio.run(watch_scale.measure(16, HEARTBEAT_S, periods=6))
    members = 15  # the hub is the 16th
    # the kill: the hub named the killed member's trainer (bench checks the cause's node and SIGKILL) and started
    # the next attempt, which every member came to hold
    assert 0 <= found["detect_s"] < HEARTBEAT_S + 30
    assert 0 <= found["propagate_median_s"] <= found["propagate_max_s"] < 30
    # the silent member: named lost after the loss time (the heartbeat timeout) of silence, not before
    assert HEARTBEAT_S <= found["silent_s"] < HEARTBEAT_S + 30
    # the steady watch: every member reported, the hub's sockets carried bytes both ways, the hub used CPU
    assert found["reports"] >= members / 2 and found["from_members_B"] > 0 and found["to_members_B"] > 0
    assert found["hub_cpu"] > 0
    # members holding the record got "unchanged", not the record: most steady answers, and far fewer bytes
    assert found["unchanged"] >= found["reports"] / 2 and found["unchanged_sent"] > 0
    assert found["record_sent"] >= members  # every join got the record
    assert found["changes_sent"] > 0  # the joins' addresses and the attempts' timelines came as changes
    assert found["to_members_B"] < found["reports"] * found["record_B"] / 2
