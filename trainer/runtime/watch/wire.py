"""How the supervisors of a job talk: JSON lines over TCP, every message proving it knows the launch's secret.

The secret is made on the controller for each launch and lives only in each node's job folder (mode 0600), so only the
job's own nodes can take part; the secret itself never crosses the network. A connection:

1. the listening side sends ``{"hello": N_s}``, a fresh random nonce (``NONCE_HEX`` lowercase hex digits);
2. every message after that is ``{"body": {...}, "mac": HMAC-SHA256(secret, direction|nonce|seq|body)}``, where
   ``direction`` is "c>s" or "s>c", ``nonce`` the nonce the *receiving* side chose (N_s for what the connecting side
   sends; the connecting side's N_c, carried in its first body, for the answers), ``seq`` counts the sender's messages
   from 0, and ``body`` is the body as canonical JSON.
So a message cannot be forged without the secret, replayed on another connection (other nonces), reordered or
replayed on the same one (seq), or reflected back (direction). A nonce of any other form than a fresh one's is refused.
Anything that fails a check ends the connection unread, as a ``WireError`` (never another exception: a line of
``[`` × 3000 or a MAC of non-ASCII characters is refused like any other). Lines longer than the reader's limit
(``line_limit``: it grows with the job's members, as the job's record does) end the connection before they are
kept, and a connection that does not prove itself within ``HELLO_TIMEOUT`` seconds is closed.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import secrets
from typing import Any, TypeGuard

MAX_LINE = 64 * 1024  # a job's line limit, plus LINE_PER_MEMBER for each of its members
LINE_PER_MEMBER = 512  # what a member adds to the job's record (its rank, address, directory entry, attempts)
HELLO_TIMEOUT = 5.0
NONCE_HEX = 32
_NONCE = re.compile(rf"[0-9a-f]{{{NONCE_HEX}}}")
_MAC = re.compile(r"[0-9a-f]{64}")


class WireError(Exception):
    """A message that fails the protocol: not a line of JSON, too long, a wrong MAC, nonce or sequence number."""


class Closed(WireError):
    """The other side closed the connection (not a breach of the protocol)."""


class Silent(WireError):
    """The other side said nothing in time (a breach only before it proved itself)."""


def line_limit(members: int) -> int:
    """The longest line a job of ``members`` members accepts."""
    return MAX_LINE + LINE_PER_MEMBER * members


def nonce() -> str:
    return secrets.token_hex(NONCE_HEX // 2)


def is_nonce(value: Any) -> TypeGuard[str]:
    """Exactly the form ``nonce`` makes."""
    return isinstance(value, str) and _NONCE.fullmatch(value) is not None


def canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode(line: bytes) -> Any:
    """A line of JSON, or WireError: whatever the line holds (deep nesting, bad UTF-8) raises nothing else."""
    try:
        return json.loads(line)
    except (ValueError, RecursionError):
        raise WireError("not a line of JSON") from None


class Keyring:
    """Seals and opens messages with the launch's secret."""

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the job's secret is too short")
        self._secret = secret

    def _mac(self, direction: str, peer_nonce: str, seq: int, text: bytes) -> str:
        """The MAC of a body in canonical JSON."""
        head = f"{direction}|{peer_nonce}|{seq}|".encode()
        return hmac.new(self._secret, head + text, hashlib.sha256).hexdigest()

    def seal(self, direction: str, peer_nonce: str, seq: int, body: dict[str, Any] | bytes) -> bytes:
        """A message's line; ``body`` a JSON object, or one in canonical JSON already (``canonical``)."""
        text = body if isinstance(body, bytes) else canonical(body)
        return b'{"body":' + text + b',"mac":"' + self._mac(direction, peer_nonce, seq, text).encode() + b'"}\n'

    def open(self, direction: str, my_nonce: str, seq: int, line: bytes) -> dict[str, Any]:
        message = decode(line)
        if not isinstance(message, dict) or set(message) != {"body", "mac"} or not isinstance(message["body"], dict):
            raise WireError("not a sealed message")
        if not isinstance(message["mac"], str) or _MAC.fullmatch(message["mac"]) is None:
            raise WireError("not a sealed message (its MAC is not 64 hex digits)")
        try:
            expected = self._mac(direction, my_nonce, seq, canonical(message["body"]))
        except (ValueError, RecursionError):  # a body json cannot write back canonically
            raise WireError("not a sealed message") from None
        if not hmac.compare_digest(message["mac"], expected):
            raise WireError("wrong MAC (not sealed with this job's secret, replayed or out of order)")
        return message["body"]


async def read_line(reader: asyncio.StreamReader, timeout: float, limit: int) -> bytes:
    """One line, at most ``limit`` (the reader's own limit) long, within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can swallow a cancel (cpython#86296)
            line = await reader.readline()
    except ValueError:  # asyncio's limit: the line is longer than the reader's limit; the rest was never kept
        raise WireError(f"a line longer than {limit} bytes") from None
    except TimeoutError:
        raise Silent(f"nothing within {timeout:.0f} s") from None
    if not line.endswith(b"\n"):
        raise Closed("the connection closed")
    return line


class Link:
    """One authenticated connection, from either side: ``sent`` and ``received`` count its messages."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keyring: Keyring, *,
                 connecting: bool, my_nonce: str, peer_nonce: str, limit: int) -> None:
        self.reader, self.writer, self.keyring, self.limit = reader, writer, keyring, limit
        self.send_dir, self.recv_dir = ("c>s", "s>c") if connecting else ("s>c", "c>s")
        self.my_nonce, self.peer_nonce = my_nonce, peer_nonce
        self.sent = self.received = 0

    async def send(self, body: dict[str, Any] | bytes) -> None:
        self.writer.write(self.keyring.seal(self.send_dir, self.peer_nonce, self.sent, body))
        self.sent += 1
        await self.writer.drain()

    async def recv(self, timeout: float) -> dict[str, Any]:
        line = await read_line(self.reader, timeout, self.limit)
        body = self.keyring.open(self.recv_dir, self.my_nonce, self.received, line)
        self.received += 1
        return body

    def close(self) -> None:
        self.writer.close()


async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, keyring: Keyring, limit: int
                 ) -> tuple[Link, dict[str, Any]]:
    """The listening side's handshake: send our nonce, read the first sealed message (which carries the peer's).
    The first body comes back without its nonce. ``limit``: the limit the server's readers were made with."""
    mine = nonce()
    writer.write(json.dumps({"hello": mine}).encode() + b"\n")
    await writer.drain()
    link = Link(reader, writer, keyring, connecting=False, my_nonce=mine, peer_nonce="", limit=limit)
    body = await link.recv(HELLO_TIMEOUT)
    peer = body.pop("nonce", None)
    if not is_nonce(peer):
        raise WireError(f"the first message carries no nonce of {NONCE_HEX} hex digits")
    link.peer_nonce = peer
    return link, body


async def connect(address: str, keyring: Keyring, first: dict[str, Any], timeout: float, *,
                  source: str | None = None, limit: int = MAX_LINE) -> Link:
    """Connect to ``host:port`` (IPv6 in brackets) from the address ``source`` (the listener admits the job's
    members by their addresses), and send ``first`` (our nonce is added to it)."""
    host, _, port = address.rpartition(":")
    try:
        port_number = int(port)
    except ValueError:
        raise WireError(f"not an address: {address!r}") from None
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host.strip("[]"), port_number, limit=limit,
                                                       local_addr=(source, 0) if source else None)
    try:
        hello = decode(await read_line(reader, timeout, limit))
        peer = hello.get("hello") if isinstance(hello, dict) else None
        if not is_nonce(peer):
            raise WireError("no hello from the other side")
        mine = nonce()
        link = Link(reader, writer, keyring, connecting=True, my_nonce=mine, peer_nonce=peer, limit=limit)
        await link.send({**first, "nonce": mine})
        return link
    except BaseException:
        writer.close()
        raise
