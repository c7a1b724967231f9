"""The watch's protocol (trainer.runtime.wire): only a holder of the job's secret is heard, nothing can be replayed,
reordered or reflected, and a line too long is refused before it is kept."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from trainer.runtime import wire

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


async def _exchange(client_key: wire.Keyring, payload: bytes | None = None) -> tuple[list[Any], str]:
    """A listener that answers every sealed message, and a client that says hello with ``client_key`` (or sends raw
    ``payload``): what the listener heard, and how its connection ended."""
    heard: list[Any] = []
    ended: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            link, body = await wire.accept(reader, writer, KEY)
            heard.append(body)
            await link.send({"type": "record", "you": body["node"]})
            heard.append(await link.recv(5))
            ended.append("ok")
        except wire.WireError as exc:
            ended.append(str(exc))
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, limit=wire.MAX_LINE)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    if payload is None:
        link = await wire.connect(address, client_key, {"type": "join", "node": "n1"}, 5)
        try:
            reply = await link.recv(5)
            await link.send({"type": "report", "node": "n1", "got": reply["you"]})
        except wire.Closed:
            pass  # the listener hung up on it, which the tests below check from the listener's side
        link.close()
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", int(address.split(":")[1]))
        await reader.readline()
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
    assert how == "ok" and heard[0]["node"] == "n1" and heard[1] == {"type": "report", "node": "n1", "got": "n1"}
    heard, how = asyncio.run(_exchange(wire.Keyring(b"a guess at the secret, long enough")))
    assert heard == [] and "wrong MAC" in how
    forged = json.dumps({"body": {"node": "n1", "failure": {"kind": "killed"}, "nonce": "0" * 32},
                         "mac": "0" * 64}).encode() + b"\n"
    heard, how = asyncio.run(_exchange(KEY, forged))
    assert heard == [] and "wrong MAC" in how


def test_a_line_longer_than_the_limit_is_refused_without_keeping_it() -> None:
    heard, how = asyncio.run(_exchange(KEY, b"x" * (wire.MAX_LINE * 8) + b"\n"))
    assert heard == [] and f"a line longer than {wire.MAX_LINE} bytes" in how
