"""How the supervisors of a job talk: JSON lines over TCP, every message proving it knows the launch's secret.

The secret is made on the controller for each launch and lives only in each node's job folder (mode 0600), so only the
job's own nodes can take part; the secret itself never crosses the network. A connection:

1. the listening side sends ``{"hello": N_s}``, a fresh random nonce;
2. every message after that is ``{"body": {...}, "mac": HMAC-SHA256(secret, direction|nonce|seq|body)}``, where
   ``direction`` is "c>s" or "s>c", ``nonce`` the nonce the *receiving* side chose (N_s for what the connecting side
   sends; the connecting side's N_c, carried in its first body, for the answers), ``seq`` counts the sender's messages
   from 0, and ``body`` is the body as canonical JSON.
So a message cannot be forged without the secret, replayed on another connection (other nonces), reordered or
replayed on the same one (seq), or reflected back (direction). Anything that fails a check ends the connection
unread; the listener says so once per address. Lines longer than ``MAX_LINE`` end the connection too, before they
are buffered, and a connection that does not prove itself within ``HELLO_TIMEOUT`` seconds is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
from typing import Any

MAX_LINE = 64 * 1024
HELLO_TIMEOUT = 5.0


class WireError(Exception):
    """A message that fails the protocol: not a line of JSON, too long, a wrong MAC or sequence number."""


class Closed(WireError):
    """The other side closed the connection (not a breach of the protocol)."""


def nonce() -> str:
    return secrets.token_hex(16)


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class Keyring:
    """Seals and opens messages with the launch's secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the job's secret is too short")
        self._secret = secret

    def _mac(self, direction: str, peer_nonce: str, seq: int, body: Any) -> str:
        head = f"{direction}|{peer_nonce}|{seq}|".encode()
        return hmac.new(self._secret, head + canonical(body), hashlib.sha256).hexdigest()

    def seal(self, direction: str, peer_nonce: str, seq: int, body: Any) -> bytes:
        return json.dumps({"body": body, "mac": self._mac(direction, peer_nonce, seq, body)}).encode() + b"\n"

    def open(self, direction: str, my_nonce: str, seq: int, line: bytes) -> dict[str, Any]:
        try:
            message = json.loads(line)
        except ValueError:
            raise WireError("not a line of JSON") from None
        if not isinstance(message, dict) or set(message) != {"body", "mac"} or not isinstance(message["body"], dict):
            raise WireError("not a sealed message")
        expected = self._mac(direction, my_nonce, seq, message["body"])
        if not isinstance(message["mac"], str) or not hmac.compare_digest(message["mac"], expected):
            raise WireError("wrong MAC (not sealed with this job's secret, replayed or out of order)")
        return message["body"]


async def read_line(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """One line, at most MAX_LINE bytes (the reader's limit), within ``timeout`` seconds."""
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except ValueError:  # asyncio's limit: the line is longer than MAX_LINE; the rest was never kept
        raise WireError(f"a line longer than {MAX_LINE} bytes") from None
    except TimeoutError:
        raise WireError(f"nothing within {timeout:.0f} s") from None
    if not line.endswith(b"\n"):
        raise Closed("the connection closed")
    return line


class Link:
    """One authenticated connection, from either side."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keyring: Keyring, *,
                 connecting: bool, my_nonce: str, peer_nonce: str) -> None:
        self.reader, self.writer, self.keyring = reader, writer, keyring
        self.send_dir, self.recv_dir = ("c>s", "s>c") if connecting else ("s>c", "c>s")
        self.my_nonce, self.peer_nonce = my_nonce, peer_nonce
        self.sent = self.received = 0

    async def send(self, body: dict[str, Any]) -> None:
        self.writer.write(self.keyring.seal(self.send_dir, self.peer_nonce, self.sent, body))
        self.sent += 1
        await self.writer.drain()

    async def recv(self, timeout: float) -> dict[str, Any]:
        line = await read_line(self.reader, timeout)
        body = self.keyring.open(self.recv_dir, self.my_nonce, self.received, line)
        self.received += 1
        return body

    def close(self) -> None:
        self.writer.close()


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keyring: Keyring
                 ) -> tuple[Link, dict[str, Any]]:
    """The listening side's handshake: send our nonce, read the first sealed message (which carries the peer's)."""
    mine = nonce()
    writer.write(json.dumps({"hello": mine}).encode() + b"\n")
    await writer.drain()
    line = await read_line(reader, HELLO_TIMEOUT)
    body = keyring.open("c>s", mine, 0, line)
    peer = body.get("nonce")
    if not isinstance(peer, str) or len(peer) < 16:
        raise WireError("the first message carries no nonce")
    link = Link(reader, writer, keyring, connecting=False, my_nonce=mine, peer_nonce=peer)
    link.received = 1
    return link, body


async def connect(address: str, keyring: Keyring, first: dict[str, Any], timeout: float) -> Link:
    """Connect to ``host:port`` (IPv6 in brackets) and send ``first`` (our nonce is added to it)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(host.strip("[]"), int(port), limit=MAX_LINE), timeout)
    try:
        hello = json.loads(await read_line(reader, timeout))
        peer = hello.get("hello") if isinstance(hello, dict) else None
        if not isinstance(peer, str):
            raise WireError("no hello from the other side")
        mine = nonce()
        link = Link(reader, writer, keyring, connecting=True, my_nonce=mine, peer_nonce=peer)
        await link.send({**first, "nonce": mine})
        return link
    except (WireError, ValueError, OSError):
        writer.close()
        raise
