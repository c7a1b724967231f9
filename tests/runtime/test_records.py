"""The job's record and the watch's messages are typed values, read through one schema check
(trainer.runtime.schema): they go to JSON and back unchanged, and anything malformed is refused naming the key."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest

from tests.runtime.test_plan import job, plans
from trainer.runtime import schema
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.record import SCHEMA, Cause, End, EndState, JobRecord, Kind, Phase, RecordError
from trainer.runtime.watch import wire
from trainer.runtime.watch.listener import Listener
from trainer.runtime.watch.messages import (
    IDLE,
    Mode,
    NodeState,
    NotHub,
    RecordReply,
    Report,
    Says,
    joined_with,
    read_reply,
    read_report,
)

IDLE_REPLY = NotHub(says=Says.NOT_HUB, hub="n0", term=0, searching=False, addr=None)


def a_record(**fields: Any) -> JobRecord:
    """A launch's record of a 2-node job with a spare, after one restart (n1 killed)."""
    record = new_record(plans(job(["/home/a", "/home/b", "/home/c"], spares=1))["n0"], 1.7e9)
    cause = Cause("n1", Kind.KILLED, "its trainer was killed by signal 9 (SIGKILL)", 1.7e9 + 60, -9,
                  detected_at=1.7e9 + 61, detect_s=1.0, failed_step=120)
    again = dataclasses.replace(record.attempts[0], attempt=1, started_at=1.7e9 + 70, cause=cause)
    return dataclasses.replace(record.changed(attempt=1, restarts=1, attempts=(*record.attempts, again)), **fields)


def test_a_record_goes_to_json_and_back_unchanged() -> None:
    record = a_record(directory={"n0": "10.9.0.10:4000"}, lost={"n2": "it never joined"})
    back = JobRecord.read(json.loads(json.dumps(record.to_json())))
    assert back == record and back.phase is Phase.RUNNING and back.cause == record.attempts[1].cause
    assert isinstance(back.attempts[1].cause, Cause) and back.cause is not None and back.cause.kind is Kind.KILLED
    assert back.newer_than(dataclasses.replace(record, version=record.version - 1)) and not back.newer_than(back)
    assert record.changed(restarts=2).version == record.version + 1
    assert back.rank0 == "n0" and back.rank_of("n2") is None and not back.ended


def broken(path: list[str | int], value: Any) -> dict[str, Any]:
    data = a_record().to_json()
    place = data
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    return data


@pytest.mark.parametrize(("path", "value", "said"), [
    (["term"], "1", "record: term: expected int, got str '1'"),
    (["term"], True, "record: term: expected int, got bool 'True'"),
    (["phase"], "paused", "record: phase: 'paused' is not one of running, stopping, waiting, ended"),
    (["attempts", 1, "cause", "at"], math.inf, r"record: attempts\[1\]: cause: at: expected float"),
    (["assignment", "n1"], None, "record: assignment: n1: expected int, got NoneType"),
    (["world_urls"], "10.9.0.10", "record: world_urls: expected a list, got str"),
    (["schema"], SCHEMA + 1, f"record: schema {SCHEMA + 1}, this runtime reads schema {SCHEMA}"),
    (["end"], {"state": "stopped", "reason": "forged"}, "record: end: missing first_failure"),
])  # fmt: skip
def test_a_malformed_record_is_refused_naming_the_key(path: list[str | int], value: Any, said: str) -> None:
    with pytest.raises(RecordError, match=said):
        JobRecord.read(broken(path, value))


def test_a_record_with_a_key_too_many_or_a_malformed_attempt_is_refused() -> None:
    data = a_record().to_json()
    data["reelection"] = 1
    with pytest.raises(RecordError, match="record: unknown reelection"):
        JobRecord.read(data)
    del data["reelection"]
    data["attempts"] = [{"a": [[[[["deeper"]]]]]}]
    with pytest.raises(RecordError, match=r"record: attempts\[0\]: missing attempt, .*; unknown a"):
        JobRecord.read(data)


def report(**fields: Any) -> dict[str, Any]:
    body = schema.dump(Report(says=Says.REPORT, node="n1", term=0, addr="10.9.0.11:4000", version=3, trainer=IDLE,
                              trouble=None, progress={"state": "running", "step": 5}, port_offer=None, record=None,
                              pace=None, timeline=None))
    return {**body, **fields}


def answer(says: str, **fields: Any) -> dict[str, Any]:
    """The hub's answer as the wire carries it."""
    return {"says": says, "record": None, "changes": None, "progress": None, "pushed": False, **fields}


def test_a_members_message_is_checked_at_the_door() -> None:
    assert read_report(report()).progress == {"state": "running", "step": 5}
    join = read_report(report(says="join", record=a_record().to_json()))
    assert join.record == a_record()
    assert read_report(report(says="join")).record is None  # a member holding the launch's record sends none
    for bad, said in [(report(record=a_record().to_json()), "a join carries the member's record"),
                      (report(trainer={**schema.dump(IDLE), "state": "exploded"}), "trainer: state: 'exploded'"),
                      (report(says="record"), "a member says join or report"),
                      (report(progress=[1, 2]), "progress: expected an object"),
                      (report(node=["n1"]), "node: expected str")]:
        with pytest.raises(schema.SchemaError, match=said):
            read_report(bad)
    assert read_reply(answer("record", record=a_record().to_json(), pushed=True)).pushed
    reply = read_reply(answer("record", record=a_record().to_json()))
    assert reply.record == a_record()
    with pytest.raises(schema.SchemaError, match="the answer: record: phase"):
        read_reply(answer("record", record=broken(["phase"], 3)))
    assert read_reply(answer("unchanged", progress={"step": 5})).record is None
    changes = {"term": 0, "base": 2, "version": 3, "directory": {"n1": "10.9.0.11:4000"}, "timelines": {},
               "attempts": [], "fields": {"phase": "stopping", "restarts": 1}}
    read = read_reply(answer("changes", changes=changes)).changes
    assert read.base == 2 and read.fields == {"phase": Phase.STOPPING, "restarts": 1}
    for fields, said in [({"phase": "lost"}, "fields: phase: 'lost' is not one of"),
                         ({"restarts": "1"}, "fields: restarts: expected int"),
                         ({"version": 9}, "fields: unknown version"), ({"directory": {}}, "fields: unknown directory")]:
        with pytest.raises(schema.SchemaError, match=f"the answer: changes: {said}"):
            read_reply(answer("changes", changes={**changes, "fields": fields}))
    for bad in (answer("unchanged", record=a_record().to_json()), answer("record"), answer("changes")):
        with pytest.raises(schema.SchemaError, match="a record answer carries the record, a changes answer the"):
            read_reply(bad)
    with pytest.raises(schema.SchemaError, match="the answer: changes: directory: n1: expected str"):
        read_reply(answer("changes", changes={**changes, "directory": {"n1": 4000}}))


def test_a_nodes_state_reads_back() -> None:
    end = End(EndState.STOPPED, "stopped by user", None)
    state = NodeState(pid=1, node="n0", mode=Mode.HUB, term=0, addr="a:1", trainer=IDLE, record=a_record(),
                      progress=None, end=end, updated=1.0)
    back = NodeState.read(json.loads(json.dumps(schema.dump(state))), "state.json")
    assert back == state and back.mode is Mode.HUB and back.end == end


def test_the_listener_encodes_each_record_once_and_every_answer_as_its_canonical_json() -> None:
    """The hub sends one record to every member: its text is made once (the next answer reuses it), and every
    answer, record or not, is the canonical JSON its MAC covers, which a member reads back to the same answer."""
    p = plans(job(["/home/a", "/home/b", "/home/c"], spares=1))["n0"]
    listener = Listener(p, wire.Keyring(b"0123456789abcdef0123456789abcdef"), lambda node, report: IDLE_REPLY,
                        lambda node: None, lambda line: None)
    record = a_record()
    answers = [RecordReply(says=Says.RECORD, record=record, changes=None, progress={"step": 5, "record": None}),
               RecordReply(says=Says.RECORD, record=record, changes=None, progress=None),
               RecordReply(says=Says.UNCHANGED, record=None, changes=None, progress={"loss": 1.5}),
               IDLE_REPLY]
    for answer in answers:
        text = listener.encode(answer)
        assert text == wire.canonical(schema.dump(answer))
        line = listener.keyring.seal("s>c", "n" * 32, 0, text)
        assert read_reply(listener.keyring.open("s>c", "n" * 32, 0, line)) == answer
    kept = listener.payload_text
    listener.encode(answers[1])
    assert listener.payload_text is kept and kept[0] is record  # the same record: its text was not made again
    listener.encode(RecordReply(says=Says.RECORD, record=record.changed(), changes=None, progress=None))
    assert listener.payload_text[0] is not record  # a new version: encoded anew


def test_a_join_carries_the_members_record_unless_it_is_the_launchs() -> None:
    """Every node makes the launch's record from the plan and no hub adopts it: a launch's joins carry none (at 1,024
    members each would be 45 kB for the hub to read and check); a record that heard a hub goes with the join."""
    launch = new_record(plans(job(["/home/a", "/home/b"]))["n1"], 1.7e9)
    assert launch.from_launch() and joined_with(Says.JOIN, launch) is None
    heard = a_record()
    assert not heard.from_launch() and joined_with(Says.JOIN, heard) == heard
    assert joined_with(Says.REPORT, heard) is None
    assert not dataclasses.replace(launch, term=1).from_launch()  # a takeover's first record


def test_a_record_must_carry_every_field_even_one_with_a_default() -> None:
    """What a program writes carries every field: the defaults a description may leave out are no record's."""
    data = a_record().to_json()
    del data["attempts"][1]["cause"]["detected_at"]
    with pytest.raises(RecordError, match=r"record: attempts\[1\]: cause: missing detected_at$"):
        JobRecord.read(data)
