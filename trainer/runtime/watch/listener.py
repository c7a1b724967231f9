"""The listening side of a supervisor's watch: every supervisor listens on an ephemeral port of its cluster address;
members connect to say ``join`` and ``report`` (trainer.runtime.watch.messages) and get the supervisor's answer. On the
hub, what it posts (``post``: an attempt stopping or started, the job's end) is pushed down every member's link at
once, between the member's reports.

What an outside host can do to it, and what it costs:
- a connection from an address that is not one of the plan's members is closed at once, before any hello;
- a member's address holds at most ``PER_ADDRESS`` connections at once, never another member's; when they are all
  held, the oldest that has not proven itself (trainer.runtime.watch.wire) yet is closed for the newcomer, so another
  user of a member's machine holding idle connections cannot keep that member out (only connections that prove
  themselves, which needs the job's key, or a flood that opens a slot's worth of connections within one handshake,
  could);
- a connection that does not prove itself within the hello timeout is closed; lines are at most the job's line
  limit;
- a body that does not follow its schema, a member claiming a name that is not its address's, a second name on one
  connection: refused;
- every refusal and every unexpected error is logged once per address (``Refusals``: at most ``REFUSED_KEPT``
  addresses are named, the rest are counted together), and nothing a peer sends ends the listener.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections import Counter
from collections.abc import Callable
from typing import Any

from trainer.runtime import layout, schema
from trainer.runtime.log import Once, Say
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch import wire
from trainer.runtime.watch.messages import NotHub, RecordReply, Reply, Report, read_report

PER_ADDRESS = 8  # connections at once from one member's address: its link to the hub, a search's asks, stale ones
REFUSED_KEPT = 64  # addresses whose refusals are counted one by one in watch.json

Answer = Callable[[str, Report], Reply]
Push = Callable[[str], RecordReply | None]  # what the hub pushes to a member now (None: nothing it lacks)


def same_address(address: str) -> str:
    """One spelling per address (fd00:0::1 and fd00::1, ::ffff:10.0.0.1 and 10.0.0.1 are the same)."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


class Refusals:
    """Connections refused, per address: at most ``kept`` addresses, the others counted as one."""

    def __init__(self, say: Say, kept: int = REFUSED_KEPT) -> None:
        self.counts: dict[str, int] = {}
        self.others = 0
        self.kept = kept
        self.once = Once(say, kept)

    def refuse(self, peer: str, why: str) -> None:
        if peer in self.counts or len(self.counts) < self.kept:
            self.counts[peer] = self.counts.get(peer, 0) + 1
        else:
            self.others += 1
        self.once(peer, f"refused a connection from {peer}: {why} (said once per address)")

    def snapshot(self) -> dict[str, int]:
        return {**self.counts, **({"others": self.others} if self.others else {})}


class Listener:
    def __init__(self, plan: NodePlan, keyring: wire.Keyring, answer: Answer, push: Push, say: Say) -> None:
        self.plan = plan
        self.keyring = keyring
        self.answer = answer
        self.push = push
        self.posts = 0  # the hub's posts so far (``post``): a link that has passed fewer on pushes to its member
        self.posted = asyncio.Event()  # set at each post (and replaced)
        self.timings = plan.timings
        self.limit = wire.line_limit(len(plan.members))
        self.names: dict[str, set[str]] = {}  # member address -> the members planned there (others than this one)
        for m in plan.members:
            if m.name != plan.node:
                self.names.setdefault(same_address(m.ip), set()).add(m.name)
        self.proven: Counter[str] = Counter()  # member address -> its proven connections open now
        self.unproven: dict[str, list[asyncio.StreamWriter]] = {}  # member address -> the others, oldest first
        self.joins: Counter[str] = Counter()  # member -> connections it opened (a healthy member keeps one)
        self.refusals = Refusals(say)
        self.errors = Once(say)
        self.server: asyncio.Server | None = None
        self.addr = ""
        self.payload_text: tuple[object, bytes] = (None, b"")  # the last record or changes sent, in canonical JSON

    async def start(self) -> str:
        """Listen on an ephemeral port of this node's cluster address; ``host:port``."""
        ip = self.plan.me.ip
        self.server = await asyncio.start_server(self.serve, host=ip, port=0, limit=self.limit)
        self.addr = f"{layout.url_host(ip)}:{self.server.sockets[0].getsockname()[1]}"
        return self.addr

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    def post(self) -> None:
        """The hub's record has news every member must act on at once: each link pushes it to its member."""
        self.posts += 1
        self.posted.set()
        self.posted = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = same_address(str((writer.get_extra_info("peername") or ("?",))[0]))
        try:
            if peer not in self.names:
                self.refusals.refuse(peer, "not the address of another member of this job")
            elif self._full(peer) and not self._make_way(peer):
                self.refusals.refuse(peer, f"more than {PER_ADDRESS} connections at once, all of them proven")
            else:
                await self._hold(peer, reader, writer)
        except (wire.Closed, wire.Silent):
            pass  # a member that hung up or fell silent; an unproven connection costs nothing more than its time
        except (wire.WireError, schema.SchemaError) as exc:
            self.refusals.refuse(peer, str(exc))
        except (OSError, asyncio.IncompleteReadError):
            pass  # the peer went away
        except Exception as exc:  # a bug: said once per kind, and the listener goes on
            self.errors(f"serve {type(exc).__name__}", f"error while answering {peer}: {type(exc).__name__}: {exc}")
        finally:
            writer.close()

    def encode(self, reply: Reply) -> bytes:
        """The reply as canonical JSON; a record, or a record's changes, is encoded once and its text kept for the next
        member it goes to (the hub sends one record, or one change, to every member: encoding it for each cost the hub
        members² work)."""
        payload = reply.record or reply.changes if isinstance(reply, RecordReply) else None
        if payload is None:
            return wire.canonical(schema.dump(reply))
        if self.payload_text[0] is not payload:
            self.payload_text = (payload, wire.canonical(schema.dump(payload)))
        key = "record" if payload is reply.record else "changes"
        parts = {f.name: wire.canonical(schema.dump(getattr(reply, f.name))) for f in dataclasses.fields(reply)
                 if f.name != key}
        parts[key] = self.payload_text[1]
        return b"{" + b",".join(wire.canonical(name) + b":" + parts[name] for name in sorted(parts)) + b"}"

    def _full(self, peer: str) -> bool:
        return self.proven[peer] + len(self.unproven.get(peer, ())) >= PER_ADDRESS * len(self.names[peer])

    def _make_way(self, peer: str) -> bool:
        """Close ``peer``'s oldest connection that has not proven itself, if it has one, for a newer one."""
        waiting = self.unproven.get(peer)
        if not waiting:
            return False
        waiting.pop(0).transport.abort()  # its handshake reads the end of the stream: wire.Closed
        self.refusals.refuse(peer, f"{PER_ADDRESS} connections at once: the oldest unproven one closed for a newer one")
        return True

    async def _hold(self, peer: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One of ``peer``'s slots: unproven (the first to give way) until the handshake, then proven until it ends."""
        waiting = self.unproven.setdefault(peer, [])
        waiting.append(writer)
        try:
            link, body = await wire.accept(reader, writer, self.keyring, self.limit)
        finally:
            if writer in waiting:
                waiting.remove(writer)
        self.proven[peer] += 1
        try:
            await self._talk(peer, link, body)
        finally:
            self.proven[peer] -= 1

    async def _talk(self, peer: str, link: wire.Link, body: dict[str, Any]) -> None:
        report = read_report(body)
        node = report.node
        if node not in self.names[peer]:
            raise wire.WireError(f"it claims to be {node!r}, which is not the member at this address")
        self.joins[node] += 1
        while True:
            seen = self.posts
            reply = self.answer(node, report)
            await link.send(self.encode(reply))
            if isinstance(reply, NotHub):
                return
            report = read_report(await self._next_report(node, link, seen))
            if report.node != node:
                raise wire.WireError(f"{node} speaks as {report.node!r} on its own connection")

    async def _next_report(self, node: str, link: wire.Link, seen: int) -> Any:
        """The member's next message, within ``next_report``; meanwhile the hub's posts beyond ``seen`` (the count
        its last answer already carried) are pushed to it."""
        incoming = asyncio.ensure_future(link.recv(self.timings.next_report))
        posted: asyncio.Future[Any] | None = None
        try:
            while True:
                if self.posts == seen:
                    posted = asyncio.ensure_future(self.posted.wait())
                    await asyncio.wait((incoming, posted), return_when=asyncio.FIRST_COMPLETED)
                    posted.cancel()
                if incoming.done():
                    return incoming.result()
                seen = self.posts
                push = self.push(node)
                if push is not None:
                    await link.send(self.encode(push))
        finally:
            incoming.cancel()
            if posted is not None:
                posted.cancel()
