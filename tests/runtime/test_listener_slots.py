"""A member's address holds at most PER_ADDRESS connections at the real listener (on loopback, in this process):
idle connections from that address (another user of the member's machine, without the job's key) give way, oldest
first, to a newer one, so the member itself still joins; only connections that proved themselves hold their slot."""

from __future__ import annotations

import asyncio

from tests.runtime.test_plan import job, plans
from tests.runtime.test_records import report
from trainer.runtime.watch import wire
from trainer.runtime.watch.listener import PER_ADDRESS, Listener
from trainer.runtime.watch.messages import NotHub, RecordReply, Reply, Says

KEY = wire.Keyring(b"a-test-secret-of-this-slots-test")
MEMBER = "127.0.0.12"  # n2's address (the spare of a 2-node job on 127.0.0.x)
NOT_HUB = NotHub(says=Says.NOT_HUB, hub="n0", term=0, searching=False, addr=None)
UNCHANGED = RecordReply(says=Says.UNCHANGED, record=None, changes=None, progress=None)

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def listening(answer: Reply) -> tuple[Listener, list[str], str]:
    """n0's listener, answering every report with ``answer``; its log lines and its address."""
    said: list[str] = []
    listener = Listener(plans(job(["/h/a", "/h/b", "/h/c"], spares=1, net="127.0.0"))["n0"], KEY,
                        lambda node, got: answer, lambda node: None, said.append)
    return listener, said, await listener.start()


async def idle(addr: str) -> Stream:
    """A connection from the member's address that reads the hello and says nothing (no key)."""
    host, _, port = addr.rpartition(":")
    stream = await asyncio.open_connection(host, int(port), local_addr=(MEMBER, 0))
    assert (await asyncio.wait_for(stream[0].readline(), 5)).startswith(b'{"hello"')
    return stream


async def join(addr: str) -> str | None:
    """n2 joins as its supervisor does (wire.connect, with the key); the answer's says, or None when refused."""
    try:
        link = await wire.connect(addr, KEY, report(says="join", node="n2"), 5, source=MEMBER)
    except (wire.WireError, OSError):
        return None
    try:
        return (await link.recv(5))["says"]
    except wire.WireError:
        return None
    finally:
        link.close()


async def closed(stream: Stream) -> bool:
    return await asyncio.wait_for(stream[0].read(), 5) == b""


def test_idle_connections_at_a_members_address_give_way_oldest_first_and_the_member_joins_every_time() -> None:
    async def scenario() -> None:
        listener, said, addr = await listening(NOT_HUB)
        held = [await idle(addr) for _ in range(PER_ADDRESS)]  # every slot of the address
        joined = []
        for _ in range(8):
            joined.append(await join(addr))
            assert await closed(held.pop(0))  # the oldest idle one gave way
            held.append(await idle(addr))  # and the other user takes the slot again
        assert joined == ["not_hub"] * 8
        assert all(not stream[0].at_eof() for stream in held)  # the newer idle ones are still open
        assert listener.refusals.snapshot() == {MEMBER: 8}  # each join made way for one; each refill found its slot
        assert [line for line in said if MEMBER in line] == [
            f"refused a connection from {MEMBER}: {PER_ADDRESS} connections at once: the oldest unproven one closed "
            "for a newer one (said once per address)"]
        for _, writer in held:
            writer.close()
        listener.close()

    asyncio.run(scenario())


def test_connections_that_proved_themselves_keep_their_slots() -> None:
    async def scenario() -> None:
        listener, said, addr = await listening(UNCHANGED)  # the listener then waits for each one's next report
        links = [await wire.connect(addr, KEY, report(says="join", node="n2"), 5, source=MEMBER)
                 for _ in range(PER_ADDRESS)]
        assert [(await link.recv(5))["says"] for link in links] == ["unchanged"] * PER_ADDRESS
        host, _, port = addr.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port), local_addr=(MEMBER, 0))
        assert await asyncio.wait_for(reader.read(), 5) == b""  # refused before any hello
        assert f"refused a connection from {MEMBER}: more than {PER_ADDRESS} connections at once, all of them proven" \
            in " ".join(said)
        writer.close()
        for link in links:
            link.close()
        listener.close()

    asyncio.run(scenario())
