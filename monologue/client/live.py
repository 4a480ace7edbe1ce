"""Streaming speech into a live session (`Client.stream_audio`, `AsyncClient.stream_audio`): 16 kHz mono s16le PCM in
20 ms messages at `speed` × real time (0: as fast as the socket takes them), then `end`.

The socket opens with a single-use ticket (the session's `audio_ticket`, then a fresh one per reconnect), so the
same code works where no header can be sent. If the connection drops, the helper reconnects with a new ticket and
continues from the sample the server's `ready` message names: what it stored, which is what it acknowledged. A
socket refused for now (the server has not yet noticed the dropped one: `retry_after_s`) is tried again. With
`interrupt_at_s` it sends `interrupt` (barge-in) at that point of the speech instead of the rest of it."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from websockets.exceptions import ConnectionClosed

from monologue.errors import ClientError
from monologue.schemas import RenderPublic

if TYPE_CHECKING:
    from .aio import AsyncClient
    from .sync import Client

RATE = 16_000
MESSAGE_SAMPLES = RATE // 50  # 20 ms per message, like a telephony/WebRTC frame
RECONNECTS = 5


@dataclass
class LiveStream:
    """What streaming a session's audio did."""

    session_id: str
    samples: int  # in the PCM given
    acknowledged: int = 0  # samples the server said it stored
    acks: int = 0
    reconnects: int = 0
    send_seconds: float = 0.0
    ended: dict[str, Any] | None = None  # the server's `ended` message
    interrupted: dict[str, Any] | None = None  # the server's `interrupted` message (`interrupt_at_s`)
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Sending:
    """How one socket sends: `speed` × real time from `started` (monotonic), then `interrupt` and/or `end`; `realtime`
    asks the server to store silence while nothing is sent."""

    speed: float
    started: float
    end: bool
    interrupt: bool
    realtime: bool


class _Retry(Exception):
    """This socket is over before the audio is: connect again (after `wait_s`)."""

    def __init__(self, wait_s: float = 0.2) -> None:
        super().__init__()
        self.wait_s = wait_s


def stream_audio(
    client: Client,
    session: RenderPublic,
    pcm: bytes,
    *,
    speed: float = 1.0,
    end: bool = True,
    connect: Callable[..., Any] | None = None,
    interrupt_at_s: float | None = None,
    realtime: bool = False,
) -> LiveStream:
    """Stream `pcm` into the live session; returns once the server has said `ended` (or, with `end=False`, once
    everything is acknowledged). `connect` opens a socket (websockets.sync.client.connect; a test injects one).
    `interrupt_at_s`: send the speech up to there, then `interrupt` (the server drops what it has not spoken).
    `realtime`: the server stores silence while this sends nothing (the `start` message's `realtime`)."""
    from websockets.sync.client import connect as default_connect

    opened = connect or default_connect
    report = LiveStream(session.id, len(pcm) // 2)
    pcm = _until_interrupt(pcm, interrupt_at_s)
    url = session.audio_ticket.url if session.audio_ticket else client.ticket(session.id).url
    started = time.monotonic()
    while True:
        try:
            with opened(url, max_size=None) as socket:
                _one_socket(socket, pcm, report, _Sending(speed, started, end, interrupt_at_s is not None, realtime))
                report.send_seconds = time.monotonic() - started
                return report
        except _Retry as retry:
            time.sleep(retry.wait_s)
        except (ConnectionClosed, OSError) as err:
            report.errors.append(f"connection lost: {err}")
        if report.reconnects == RECONNECTS:
            raise ClientError(f"session {session.id}: the audio socket dropped {RECONNECTS + 1} times: {report.errors}")
        report.reconnects += 1
        url = client.ticket(session.id).url


def _one_socket(socket: Any, pcm: bytes, report: LiveStream, how: _Sending) -> None:
    position = _ready(json.loads(socket.recv(timeout=30)), report)
    if how.realtime:
        socket.send(json.dumps({"type": "start", "realtime": True}))
    done = threading.Event()
    lost: list[BaseException] = []

    def read() -> None:
        try:
            for message in socket:
                if _take(json.loads(message), report):
                    break
        except ConnectionClosed as err:
            lost.append(err)
        finally:
            done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    total = len(pcm) // 2
    for offset in range(position, total, MESSAGE_SAMPLES):
        if how.speed > 0:
            time.sleep(max(0.0, how.started + offset / RATE / how.speed - time.monotonic()))
        if done.is_set():
            break
        socket.send(pcm[2 * offset : 2 * min(total, offset + MESSAGE_SAMPLES)])
    if how.interrupt and not done.is_set():
        socket.send(json.dumps({"type": "interrupt"}))
    if how.end and not done.is_set():
        socket.send(json.dumps({"type": "end"}))
    done.wait(timeout=120)
    _refused(report, lost)
    if report.ended is None and (lost or _unfinished(report, total, how.interrupt)):
        raise _Retry()  # the socket went before the audio was all stored: continue on a new one


async def stream_audio_async(
    client: AsyncClient,
    session: RenderPublic,
    pcm: bytes,
    *,
    speed: float = 1.0,
    end: bool = True,
    interrupt_at_s: float | None = None,
    realtime: bool = False,
) -> LiveStream:
    """`stream_audio` on asyncio (websockets.asyncio.client), reconnecting the same way."""
    from websockets.asyncio.client import connect

    report = LiveStream(session.id, len(pcm) // 2)
    pcm = _until_interrupt(pcm, interrupt_at_s)
    url = session.audio_ticket.url if session.audio_ticket else (await client.ticket(session.id)).url
    started = time.monotonic()
    while True:
        try:
            async with connect(url, max_size=None) as socket:
                await _one_socket_async(
                    socket, pcm, report, _Sending(speed, started, end, interrupt_at_s is not None, realtime)
                )
                report.send_seconds = time.monotonic() - started
                return report
        except _Retry as retry:
            await asyncio.sleep(retry.wait_s)
        except (ConnectionClosed, OSError) as err:
            report.errors.append(f"connection lost: {err}")
        if report.reconnects == RECONNECTS:
            raise ClientError(f"session {session.id}: the audio socket dropped {RECONNECTS + 1} times: {report.errors}")
        report.reconnects += 1
        url = (await client.ticket(session.id)).url


async def _one_socket_async(socket: Any, pcm: bytes, report: LiveStream, how: _Sending) -> None:
    position = _ready(json.loads(await asyncio.wait_for(socket.recv(), timeout=30)), report)
    if how.realtime:
        await socket.send(json.dumps({"type": "start", "realtime": True}))

    async def read() -> None:
        async for message in socket:
            if _take(json.loads(message), report):
                return

    reader = asyncio.create_task(read())
    total = len(pcm) // 2
    for offset in range(position, total, MESSAGE_SAMPLES):
        if how.speed > 0:
            await asyncio.sleep(max(0.0, how.started + offset / RATE / how.speed - time.monotonic()))
        if reader.done():
            break
        await socket.send(pcm[2 * offset : 2 * min(total, offset + MESSAGE_SAMPLES)])
    if how.interrupt and not reader.done():
        await socket.send(json.dumps({"type": "interrupt"}))
    if how.end and not reader.done():
        await socket.send(json.dumps({"type": "end"}))
    lost: list[BaseException] = []
    try:
        await asyncio.wait_for(reader, timeout=120)
    except ConnectionClosed as err:
        lost.append(err)
    _refused(report, lost)
    if report.ended is None and _unfinished(report, total, how.interrupt):
        raise _Retry()


def _until_interrupt(pcm: bytes, interrupt_at_s: float | None) -> bytes:
    """The speech sent before an interrupt: all of it without one."""
    return pcm if interrupt_at_s is None else pcm[: 2 * max(0, round(interrupt_at_s * RATE))]


def _unfinished(report: LiveStream, total: int, interrupt: bool) -> bool:
    """Whether the socket went before its work was done: all audio acknowledged, or the interrupt answered (it
    drops what was not stored)."""
    return report.interrupted is None if interrupt else report.acknowledged < total


def _refused(report: LiveStream, lost: list[BaseException]) -> None:
    """ClientError when the server closed the socket with a refusal (4400 bad audio, 4401, 4404, 4409…): trying
    again would be refused again. A dropped connection (no close code) is a reason to reconnect."""
    for err in lost:
        code = err.rcvd.code if isinstance(err, ConnectionClosed) and err.rcvd is not None else None
        if code is not None and code >= 4000:
            raise ClientError(f"session {report.session_id}: the audio socket was closed ({code}): {report.errors}")


def _ready(message: dict[str, Any], report: LiveStream) -> int:
    """The sample to continue from (the server's `ready`); _Retry when the socket is refused for now."""
    if message.get("type") == "error":
        retry_after = message.get("retry_after_s")
        if retry_after is not None:
            raise _Retry(float(retry_after))
        raise ClientError(f"session {report.session_id}: the audio socket was refused: {message.get('message')}")
    if message.get("type") != "ready":
        raise ClientError(f"session {report.session_id}: expected a 'ready' message, got {message}")
    samples = int(message["samples"])
    report.acknowledged = max(report.acknowledged, samples)
    return samples


def _take(message: dict[str, Any], report: LiveStream) -> bool:
    """One server message; True once the session's audio is over (`ended`)."""
    kind = message.get("type")
    if kind == "ack":
        report.acks += 1
        report.acknowledged = int(message["samples"])
    elif kind == "interrupted":
        report.interrupted = message
        report.acknowledged = int(message["samples"])
    elif kind == "error":
        report.errors.append(str(message.get("message")))
    elif kind == "ended":
        report.ended = message
        report.acknowledged = int(message["samples"])
        return True
    return False
