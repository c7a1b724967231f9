"""The watch against hosts that are not the job's, and against a key holder that sends what it should not, on real
supervisors on loopback (tests/runtime/loopback.py): nothing they send costs more than a line of the log, wedges a
member's link, or ends a supervisor; the job trains to the end."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.runtime.loopback import NET, OUTSIDE, SECRET, Job, loopback, wait_until
from tests.runtime.test_records import report
from trainer.runtime import layout, schema
from trainer.runtime.job.record import EndState, Phase
from trainer.runtime.watch import wire
from trainer.runtime.watch.listener import PER_ADDRESS

__all__ = ["loopback"]
KEY = wire.Keyring(SECRET)


@contextmanager
def connection(addr: str, source: str) -> Iterator[socket.socket]:
    host, _, port = addr.rpartition(":")
    sock = socket.socket()
    sock.settimeout(5)
    try:
        sock.bind((source, 0))
        sock.connect((host, int(port)))
        yield sock
    finally:
        sock.close()


def hello(sock: socket.socket) -> bytes:
    """What the listener says first: its hello, or b"" when it hangs up before any."""
    try:
        return sock.recv(256)
    except (ConnectionResetError, TimeoutError):
        return b""


def refused(job: Job) -> dict[str, int]:
    """The hub's count of refused connections, per address (watch.json)."""
    return dict(json.loads((Path(job.folders["n0"]) / layout.WATCH_FILE).read_text())["refused"])


def trains_on(job: Job) -> None:
    """The job's first attempt still trains, every member heard, nothing failed."""
    step = job.step("n0")
    wait_until(lambda: job.step("n0") >= step + 5, 20, "rank 0 to go on training", job.logs)
    record = job.record()
    assert record.attempt == 0 and record.phase == Phase.RUNNING and record.first_failure is None, job.logs()
    assert "failed first" not in job.log("n0") and "Traceback" not in job.log("n0")


JUNK = [
    b"[" * 3000 + b"\n",  # json's recursion
    json.dumps({"body": {"says": "join"}, "mac": "\u00e9" * 64}).encode() + b"\n",  # hmac's TypeError
    json.dumps({"body": {"says": "join"}, "mac": "0" * 64}).encode() + b"\n",  # a guess at the key
    b"\xff\xfe\x00 not even UTF-8\n",
    b'{"stop": "forged stop"}\n',
]


def test_3000_malformed_lines_cost_the_log_a_few_kb_and_the_job_trains_on(loopback: Callable[..., Job]) -> None:
    """From outside (closed before any hello) and from a member's own address (another user of that machine, without
    the key): each refused, each address said once."""
    job = loopback(2, steps=10_000)
    job.start_all()
    wait_until(lambda: job.step("n0") >= 5, 60, "rank 0 at step 5", job.logs)
    hub = job.hub_addr
    before = len(job.log("n0").encode())
    hellos = {OUTSIDE: 0, f"{NET}.11": 0}
    for i in range(3000):
        source = OUTSIDE if i % 2 else f"{NET}.11"
        with connection(hub, source) as sock:
            hellos[source] += hello(sock).startswith(b'{"hello"')
            try:
                sock.sendall(JUNK[i % len(JUNK)])
                sock.recv(256)
            except OSError:
                pass  # it hung up first
    grown = len(job.log("n0").encode()) - before
    assert grown < 3 * 1024, job.log("n0")[-3000:]
    assert hellos == {OUTSIDE: 0, f"{NET}.11": 1500}  # outside: closed before any hello
    log = job.log("n0")
    assert log.count(f"refused a connection from {OUTSIDE}: not the address of another member") == 1
    assert log.count(f"refused a connection from {NET}.11:") == 1 and "Traceback" not in log
    counted = {OUTSIDE: 1500, f"{NET}.11": 1500}
    wait_until(lambda: refused(job) == counted, 10, f"watch.json to count {counted}", lambda: str(refused(job)))
    trains_on(job)


def test_200_idle_outside_connections_stop_no_member_from_joining_or_failing_over(
        loopback: Callable[..., Job]) -> None:
    job = loopback(2, spares=1)
    job.start("n0")
    held = [socket.create_connection(job.hub_addr.rsplit(":", 1), 5, (OUTSIDE, 0)) for _ in range(200)]
    try:
        assert {sock.recv(64) for sock in held} == {b""}  # each closed at once, without a hello
        job.start("n1")
        job.start("n2")
        wait_until(lambda: job.step("n0") >= 12, 60, "rank 0 at step 12", job.logs)
        for addr in job.record().directory.values():  # every member's listener, the next hub's included
            held += [socket.create_connection(addr.rsplit(":", 1), 5, (OUTSIDE, 0)) for _ in range(100)]
        job.lose("n0")
        record = job.ended()
    finally:
        for sock in held:
            sock.close()
    assert record.end is not None and record.end.state == EndState.FINISHED, job.logs()
    assert record.hub == "n1" and record.assignment == {"n1": 0, "n2": 1}


async def as_key_holder(addr: str, source: str, body: dict[str, object], nonce: str | None = None) -> str:
    """Connect from ``source`` with the job's key, send ``body`` as the first message (with ``nonce``, or a fresh
    one); what the listener answered (b'' when it hung up)."""
    reader, writer = await asyncio.open_connection(*addr.rsplit(":", 1), local_addr=(source, 0))
    try:
        mine = json.loads(await reader.readline())["hello"]
        writer.write(KEY.seal("c>s", mine, 0, {**body, "nonce": nonce or wire.nonce()}))
        await writer.drain()
        return (await asyncio.wait_for(reader.readline(), 5)).decode()
    finally:
        writer.close()


def test_a_key_holder_is_refused_what_it_should_not_say_and_the_hub_lives(loopback: Callable[..., Job]) -> None:
    """A malformed record in a join, a member's name from another member's address, a short nonce, a trainer state
    that does not exist: each refused unread, said once for the address; the job trains on."""
    job = loopback(2, spares=1, steps=10_000)
    job.start("n0")
    job.start("n1")  # n2, the spare, never starts: its address is the key holder's
    wait_until(lambda: job.step("n0") >= 5, 60, "rank 0 at step 5", job.logs)
    spare = f"{NET}.12"
    record = job.record().to_json()
    bad = [
        report(says="join", node="n2", record={**record, "term": "one"}),
        report(says="join", node="n2", record={**record, "end": {"state": "stopped", "reason": "forged"}}),
        report(says="join", node="n1", record=record),  # n1's name, from n2's address
        report(says="report", node="n2", trainer={**report()["trainer"], "state": "exploded"}),
    ]
    answers = [asyncio.run(as_key_holder(job.hub_addr, spare, body)) for body in bad]
    answers.append(asyncio.run(as_key_holder(job.hub_addr, spare, report(says="join", node="n2", record=record),
                                             nonce="ab")))
    assert answers == [""] * 5  # hung up, unanswered
    ok = asyncio.run(as_key_holder(job.hub_addr, spare, schema.dump(report(says="join", node="n2", record=record))))
    assert json.loads(ok)["body"]["says"] == "record"  # the same key holder, saying what a member says: heard
    log = job.log("n0")
    assert log.count(f"refused a connection from {spare}:") == 1 and "Traceback" not in log, log
    assert "record: term: expected int" in log  # the first refusal, named
    wait_until(lambda: refused(job) == {spare: 5}, 10, "watch.json to count 5", lambda: str(refused(job)))
    trains_on(job)


def test_a_line_longer_than_the_jobs_limit_is_refused_by_the_real_listener(loopback: Callable[..., Job]) -> None:
    """The listener's readers have the job's line limit (64 KiB and 512 bytes a member): a report that fits is heard,
    one a byte longer is refused before it is kept."""
    job = loopback(2, spares=1, steps=10_000)
    job.start("n0")
    job.start("n1")
    limit = wire.line_limit(3)

    def padded(length: int) -> dict[str, object]:
        """n2's report, sealed into a line of ``length`` bytes before its newline."""
        body = report(says="report", node="n2")
        base = len(KEY.seal("c>s", "0" * 32, 0, {**body, "nonce": "0" * 32, "progress": {"pad": ""}})) - 1
        return {**body, "progress": {"pad": "x" * (length - base)}}

    fits = asyncio.run(as_key_holder(job.hub_addr, f"{NET}.12", padded(limit)))
    assert json.loads(fits)["body"]["says"] in {"record", "changes", "unchanged"}  # the hub's answer: heard
    assert asyncio.run(as_key_holder(job.hub_addr, f"{NET}.12", padded(limit + 1))) == ""
    assert f"a line longer than {limit} bytes" in job.log("n0")
    trains_on(job)


def test_a_members_address_holds_at_most_8_connections_and_crowds_out_no_other_member(
        loopback: Callable[..., Job]) -> None:
    """Another user of a member's machine holds at most that member's few connections, never another member's; a
    ninth makes the oldest one that has not proven itself give way (tests/runtime/test_listener_slots.py: the member
    itself still joins)."""
    job = loopback(2, spares=1, steps=10_000)
    job.start("n0")
    job.start("n1")
    wait_until(lambda: job.step("n0") >= 5, 60, "rank 0 at step 5", job.logs)
    spare = f"{NET}.12"
    held = [socket.create_connection(job.hub_addr.rsplit(":", 1), 5, (spare, 0)) for _ in range(PER_ADDRESS + 1)]
    try:
        hellos = [hello(sock) for sock in held]
        assert [h.startswith(b'{"hello"') for h in hellos] == [True] * (PER_ADDRESS + 1)
        assert hello(held[0]) == b"" and job.log("n0").count(
            f"refused a connection from {spare}: {PER_ADDRESS} connections at once: the oldest unproven one") == 1
        trains_on(job)  # n1, at its own address, is heard all along
    finally:
        for sock in held:
            sock.close()
