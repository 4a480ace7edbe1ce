"""A fault proxy in front of an S3 server, for the outage tests (tests/test_s3_faults.py).

It forwards HTTP/1.1 requests one at a time per client connection, keeping the client's connection alive between
them (boto3 reuses its connections), and, while faults are switched on (`throttle`), answers a seeded-random fraction
of the requests with S3's `503 SlowDown`, a `500 InternalError`, or a reset connection: either before the request
reaches S3, or after S3 has carried it out and before its answer comes back (the case that makes a client send the
same write twice). It counts what it did, so a test can check that the faults really happened.

Request boundaries are parsed, not guessed: a body is read by its Content-Length or, for `Transfer-Encoding:
chunked` (boto3's aws-chunked uploads), chunk by chunk, and forwarded byte for byte; `Expect: 100-continue` is
answered here, so the body is read before a fault is drawn. Each request goes to S3 on a fresh connection
(`Connection: close`), so a connection S3 closed while idle is never mistaken for a fault. Headers pass unchanged
but for those two, so SigV4 signatures made for the proxy's URL hold (neither is signed). Standard library only;
loopback only; the event loop runs in its own thread, so synchronous tests drive it directly.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

HEAD_LIMIT = 1 << 20  # the longest request or response head read (S3's are a few KiB)
NO_BODY_STATUSES = {204, 304}


class FaultKind(StrEnum):
    """What the proxy does instead of relaying a request."""

    SLOW_DOWN = "slow_down"  # 503 SlowDown, as S3 throttles; the request never reaches S3
    INTERNAL_ERROR = "internal_error"  # 500 InternalError; the request never reaches S3
    RESET = "reset"  # the client's connection is reset before the request reaches S3
    RESET_AFTER = "reset_after"  # S3 carries the request out, then the client's connection is reset


ERROR_REPLIES = {
    FaultKind.SLOW_DOWN: (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
    FaultKind.INTERNAL_ERROR: (500, "Internal Server Error", "InternalError", "We encountered an internal error."),
}


@dataclass(frozen=True)
class Exchange:
    """One request the proxy handled: its method and path, and S3's status or the fault injected instead."""

    method: str
    path: str  # without the query string
    query: str
    outcome: int | FaultKind
    # S3's own status whenever S3 carried the request out (also when its answer was then reset); None if it never saw it
    s3_status: int | None = None


@dataclass(frozen=True)
class ProxyCounts:
    passed: int  # requests relayed with S3's answer
    injected: dict[FaultKind, int] = field(default_factory=dict)

    @property
    def faults(self) -> int:
        return sum(self.injected.values())


@dataclass
class _Message:
    """An HTTP message as read: its start line, headers (in order) and raw body (chunk framing kept)."""

    start: str
    headers: list[tuple[str, str]]
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name), None)

    def encode(self, *, drop: frozenset[str] = frozenset(), add: tuple[tuple[str, str], ...] = ()) -> bytes:
        kept = [(key, value) for key, value in self.headers if key.lower() not in drop]
        lines = [self.start, *(f"{key}: {value}" for key, value in [*kept, *add])]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class S3FaultProxy:
    """The proxy on a free loopback port (`url`), forwarding to `target_url`, until `close` (or the `with` ends)."""

    def __init__(self, target_url: str, *, seed: int = 0) -> None:
        target = urllib.parse.urlsplit(target_url)
        self._target = (target.hostname or "127.0.0.1", target.port or 80)
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._fraction = 0.0
        self._kinds: tuple[FaultKind, ...] = ()
        self._passed = 0
        self._injected: Counter[FaultKind] = Counter()
        self.exchanges: list[Exchange] = []
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0, limit=HEAD_LIMIT)
        )
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._loop.run_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()

    def __enter__(self) -> S3FaultProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def throttle(self, fraction: float, kinds: tuple[FaultKind, ...] = tuple(FaultKind)) -> None:
        """From now on, answer `fraction` of the requests (drawn at random, seeded) with one of `kinds`."""
        if not 0.0 <= fraction <= 1.0 or not kinds:
            raise ValueError(f"a fraction in [0, 1] and at least one kind, not {fraction} and {kinds}")
        with self._lock:
            self._fraction, self._kinds = fraction, tuple(kinds)

    def clear(self) -> None:
        """Relay every request again."""
        with self._lock:
            self._fraction, self._kinds = 0.0, ()

    def counts(self) -> ProxyCounts:
        with self._lock:
            return ProxyCounts(self._passed, dict(self._injected))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _draw(self) -> FaultKind | None:
        with self._lock:
            if self._fraction and self._random.random() < self._fraction:
                return self._random.choice(self._kinds)
            return None

    def _record(self, request: _Message, outcome: int | FaultKind, s3_status: int | None = None) -> None:
        method, target = request.start.split(" ")[:2]
        path, _, query = target.partition("?")
        with self._lock:
            if isinstance(outcome, FaultKind):
                self._injected[outcome] += 1
            else:
                self._passed += 1
            status = outcome if isinstance(outcome, int) else s3_status
            self.exchanges.append(Exchange(method, path, query, outcome, status))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One client connection: its requests in turn, until it closes or a fault resets it."""
        try:
            while await self._one_request(reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away mid-message, or sent something that is not HTTP: drop the connection
        except asyncio.CancelledError:
            pass  # the proxy is closing: end quietly (asyncio would log a cancelled connection task as an error)
        finally:
            writer.close()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Relay (or fault) one request; False when the client's connection is over."""
        request = await _read_head(reader)
        if request is None:
            return False
        if (request.header("expect") or "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
        request.body = await _read_body(reader, request, to_eof=False)
        fault = self._draw()
        if fault in ERROR_REPLIES:
            self._record(request, fault)
            writer.write(_error_reply(fault, request))
            await writer.drain()
            return True
        if fault is FaultKind.RESET:
            self._record(request, fault)
            _reset(writer)
            return False
        response, delimited = await self._forward(request)
        if fault is FaultKind.RESET_AFTER:
            self._record(request, fault, int(response.start.split(" ")[1]))
            _reset(writer)
            return False
        self._record(request, int(response.start.split(" ")[1]))
        writer.write(response.encode(drop=frozenset({"connection"})))
        await writer.drain()
        return delimited  # an answer that ran to the end of S3's connection ends the client's too

    async def _forward(self, request: _Message) -> tuple[_Message, bool]:
        """S3's answer to `request` on a fresh connection, and whether its end was marked (length or chunks)."""
        up_reader, up_writer = await asyncio.open_connection(*self._target, limit=HEAD_LIMIT)
        try:
            up_writer.write(request.encode(drop=frozenset({"expect", "connection"}), add=(("Connection", "close"),)))
            await up_writer.drain()
            while True:
                response = await _read_head(up_reader)
                if response is None:
                    raise ConnectionError("S3 closed the connection without answering")
                if not response.start.split(" ")[1].startswith("1"):
                    break  # skip interim answers (100 Continue)
            status = int(response.start.split(" ")[1])
            method = request.start.split(" ")[0]
            delimited = True
            if method != "HEAD" and status not in NO_BODY_STATUSES:
                delimited = response.header("content-length") is not None or _chunked(response)
                response.body = await _read_body(up_reader, response, to_eof=True)
            return response, delimited
        finally:
            up_writer.close()


async def _read_head(reader: asyncio.StreamReader) -> _Message | None:
    """The next message's start line and headers; None if the peer closed cleanly before one began."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            return None
        raise
    start, *lines = raw[:-4].decode("latin-1").split("\r\n")
    headers = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"not an HTTP header line: {line!r}")
        headers.append((name.strip(), value.strip()))
    return _Message(start, headers)


def _chunked(message: _Message) -> bool:
    return "chunked" in (message.header("transfer-encoding") or "").lower()


async def _read_body(reader: asyncio.StreamReader, message: _Message, *, to_eof: bool) -> bytes:
    """The message's body as sent (chunk framing and trailers kept): chunked, by Content-Length, or, for an answer
    with neither (`to_eof`), up to the end of the connection."""
    if _chunked(message):
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            body += size_line
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    body += trailer
                return bytes(body + b"\r\n")
            body += await reader.readexactly(size + 2)  # the chunk and its CRLF
    length = message.header("content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    return await reader.read() if to_eof else b""


def _error_reply(fault: FaultKind, request: _Message) -> bytes:
    """S3's XML error answer for `fault`, keeping the connection alive (the request's body was read whole)."""
    status, phrase, code, message = ERROR_REPLIES[fault]
    resource = request.start.split(" ")[1].split("?")[0]
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
        "<RequestId>s3-fault-proxy</RequestId></Error>"
    ).encode()
    body = b"" if request.start.startswith("HEAD ") else xml
    head = (
        f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/xml\r\nContent-Length: {len(body)}\r\n"
        "x-amz-request-id: s3-fault-proxy\r\n\r\n"
    )
    return head.encode("latin-1") + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close the client's connection with a TCP reset (SO_LINGER 0), as a crashed or overloaded server does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
