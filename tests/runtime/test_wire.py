"""The watch's protocol (trainer.runtime.watch.wire): only a holder of the job's secret is heard, nothing can be
replayed, reordered or reflected, and a line too long is refused before it is kept."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from trainer.runtime.watch import wire

KEY = wire.Keyring(b"0123456789abcdef0123456789abcdef")


def test_a_sealed_message_opens_only_with_the_key_its_nonce_its_place_and_its_direction() -> None:
    body = {"type": "report", "node": "n1", "failure": {"kind": "killed"}}
    line = KEY.seal("c>s", "nonce-s", 3, body)
    assert KEY.open("c>s", "nonce-s", 3, line) == body
    refused = [
        (wire.Keyring(b"another secret of the same length!"), "c>s", "nonce-s", 3),  # not this job's secret
        (KEY, "c>s", "nonce-other", 3),  # another connection: replayed
        (KEY, "c>s", "nonce-s", 4),  # out of order, or replayed on this connection
        (KEY, "s>c", "nonce-s", 3),  # reflected back to its sender
    ]
    for keyring, direction, nonce, seq in refused:
        with pytest.raises(wire.WireError, match="wrong MAC"):
            keyring.open(direction, nonce, seq, line)
    forged = json.dumps({"body": {**body, "node": "n2"}, "mac": json.loads(line)["mac"]}).encode()
    with pytest.raises(wire.WireError, match="wrong MAC"):
        KEY.open("c>s", "nonce-s", 3, forged)  # the body was changed under its MAC
    for junk in (b"not json\n", b'{"node": "n1", "failure": {"kind": "killed"}}\n', b"[]\n"):
        with pytest.raises(wire.WireError):
            KEY.open("c>s", "nonce-s", 0, junk)


def test_whatever_a_line_holds_it_is_refused_as_a_wire_error_and_nothing_else() -> None:
    """A line of '[' x 3000 (json's recursion), a MAC of non-ASCII characters (hmac's TypeError), bad UTF-8: each a
    WireError, which the listener logs once per address, never a traceback."""
    body = {"says": "report"}
    for junk in (b"[" * 3000 + b"\n", json.dumps({"body": body, "mac": "é" * 64}).encode(),
                 json.dumps({"body": body, "mac": "0" * 63}).encode(), b"\xff\xfe{}\n",
                 json.dumps({"body": {"x": [[[[1]]]] * 3}, "mac": 7}).encode()):
        with pytest.raises(wire.WireError):
            KEY.open("c>s", "nonce-s", 0, junk)
    deep = '{"body": ' + '{"d": ' * 3000 + "{}" + "}" * 3000 + ', "mac": "' + "0" * 64 + '"}'
    with pytest.raises(wire.WireError):
        KEY.open("c>s", "nonce-s", 0, deep.encode())


async def _exchange(client_key: wire.Keyring, payload: bytes | None = None, rounds: int = 1,
                    nonce: str | None = None) -> tuple[list[Any], str]:
    """A listener that answers every sealed message, and a client that says hello with ``client_key`` (or sends raw
    ``payload``, or its first message with ``nonce``) and goes ``rounds`` rounds: what the listener heard, and how
    its connection ended."""
    heard: list[Any] = []
    ended: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            link, body = await wire.accept(reader, writer, KEY, wire.MAX_LINE)
            heard.append(body)
            for _ in range(rounds):
                await link.send({"says": "record", "you": body["node"]})
                body = await link.recv(5)
                heard.append(body)
            ended.append("ok")
        except wire.WireError as exc:
            ended.append(str(exc))
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, limit=wire.MAX_LINE)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    if payload is None and nonce is None:
        link = await wire.connect(address, client_key, {"says": "join", "node": "n1"}, 5)
        try:
            for i in range(rounds):
                reply = await link.recv(5)
                await link.send({"says": "report", "node": "n1", "got": reply["you"], "round": i})
        except wire.Closed:
            pass  # the listener hung up on it, which the tests below check from the listener's side
        link.close()
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(address.split(":")[1]))
        hello = json.loads(await reader.readline())["hello"]
        if payload is None:  # a key holder whose first message carries a nonce of another form
            payload = client_key.seal("c>s", hello, 0, {"says": "join", "node": "n1", "nonce": nonce})
        writer.write(payload)
        await writer.drain()
        writer.close()
    for _ in range(50):
        if ended:
            break
        await asyncio.sleep(0.1)
    server.close()
    return heard, (ended or ["still open"])[0]


def test_members_that_hold_the_secret_talk_and_others_are_dropped_unheard() -> None:
    heard, how = asyncio.run(_exchange(KEY))
    assert how == "ok" and heard[0] == {"says": "join", "node": "n1"}  # the nonce is the protocol's, not the body's
    assert heard[1] == {"says": "report", "node": "n1", "got": "n1", "round": 0}
    heard, how = asyncio.run(_exchange(wire.Keyring(b"a guess at the secret, long enough")))
    assert heard == [] and "wrong MAC" in how
    forged = json.dumps({"body": {"node": "n1", "failure": {"kind": "killed"}, "nonce": "0" * 32},
                         "mac": "0" * 64}).encode() + b"\n"
    heard, how = asyncio.run(_exchange(KEY, forged))
    assert heard == [] and "wrong MAC" in how


def test_a_link_carries_many_messages_each_way() -> None:
    """Each side counts its messages: a link that did not would break at its second message, and every member would
    reconnect after every report (the job still ends: only this counts it)."""
    heard, how = asyncio.run(_exchange(KEY, rounds=5))
    assert how == "ok" and [body["round"] for body in heard[1:]] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("nonce", ["ab", "", "0" * 31, "0" * 33, "g" * 32, "A" * 32, 12345])
def test_a_key_holder_whose_nonce_is_not_a_fresh_ones_form_is_refused(nonce: Any) -> None:
    """The answers to a member are sealed with its nonce: one of another form (a short or a constant one) would let
    answers be replayed from one connection to another."""
    heard, how = asyncio.run(_exchange(KEY, nonce=nonce))
    assert heard == [] and "nonce of 32 hex digits" in how, how
    assert wire.is_nonce(wire.nonce())


def test_a_line_longer_than_the_limit_is_refused_without_keeping_it() -> None:
    heard, how = asyncio.run(_exchange(KEY, b"x" * (wire.MAX_LINE * 8) + b"\n"))
    assert heard == [] and f"a line longer than {wire.MAX_LINE} bytes" in how


def test_a_read_cancelled_as_its_line_arrives_is_cancelled() -> None:
    """A member's link is cancelled (its supervisor stops following the hub) just as the hub's answer arrives: the
    cancel wins. (asyncio.wait_for on Python 3.11 returned the line instead, and the member went on reporting: the
    watch bench's silent member, never named lost under load.)"""

    async def cancel_as_the_line_arrives() -> str:
        reader = asyncio.StreamReader()
        read = asyncio.ensure_future(wire.read_line(reader, 5, 1000))
        await asyncio.sleep(0.01)  # waiting in its readline
        reader.feed_data(b"{}\n")
        read.cancel()
        try:
            return f"read {await read!r}"
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(cancel_as_the_line_arrives()) == "cancelled"
