"""One live session's audio socket: decoding, resampling and storing the audio it brings, acknowledging it, telling
the workflow, and watching the idle timeout, the lifetime, the key and the session (the framing is in
`api/routes/sessions.py`'s docstring).

A socket holds its session while it brings audio (`repo.claim_audio_socket`; a second socket is refused, with
`retry_after_s`, until the first has been silent for TAKEOVER_S: a client that reconnects after a drop the server
has not noticed yet gets in then, and the old socket closes). When a socket closes without `end`, the session is
not ended: the client may reconnect (a fresh ticket, or its key) within the idle timeout and continue after the
last acknowledged sample, which the new socket's `ready` message names; otherwise the workflow's own idle timeout
ends the session with the audio stored (`stored_audio`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import datetime
from typing import Any

from fastapi import WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect, WebSocketState

from monologue import contracts as c, repo
from monologue.live_audio import TAKEOVER_S, stored_live_audio
from monologue.plan import AUDIO_RATE
from monologue.repo.nodes import aware

from . import streams
from .deps import Principal, Services
from .errors import TooManyStreams
from .inputs import parse_json
from .live_audio_stream import (
    CLOSE_CONFLICT,
    CLOSE_NOT_FOUND,
    CLOSE_TOO_MANY,
    CLOSE_UNAUTHORIZED as CLOSE_UNAUTHORIZED,
    AudioRefused as AudioRefused,
    AudioStream,
    SessionEnds,
    log,
    unless_database_down,
)
from .submit import TERMINAL

MAX_MESSAGE_BYTES = 1 << 20  # one audio message: 1 MiB (about 32 s of 16 kHz mono)
REALTIME_TICK_S = 0.1  # how often a realtime socket looks whether silence is due
# A socket that brought no audio for TAKEOVER_S loses its session to a new socket (monologue.live_audio); its claim is
# refreshed at most once a second while audio comes.
CLAIM_REFRESH_S = 1.0


async def _receive_audio(websocket: WebSocket, stream: AudioStream, watch: SocketWatch) -> None:
    """Take the socket's messages until the session's audio is over; then end it, say so and close."""
    try:
        while True:
            await watch.check()
            await stream.keep_up()
            message = await watch.receive(websocket, tick_s=REALTIME_TICK_S if stream.realtime else None)
            if message is None:  # a check is due
                continue
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await _take_audio(websocket, stream, watch, message["bytes"])
                continue
            command = _parse_text(message.get("text") or "")
            if command.get("type") == "start":
                stream.configure(command)
            elif command.get("type") == "interrupt":
                await websocket.send_json(await stream.interrupt())
            elif command.get("type") == "end":
                raise SessionEnds()
            else:
                raise AudioRefused(
                    f"unknown message type {command.get('type')!r}; expected 'start', 'interrupt' or 'end'"
                )
    except SessionEnds as ending:
        stored = await stream.end()
        reply: dict[str, Any] = {"type": "ended", "samples": stored, "seconds": stored / AUDIO_RATE}
        if str(ending):
            reply["message"] = str(ending)
        log.info("audio stream ended", session_id=watch.session_id, samples=stored, reason=str(ending) or "end")
        await websocket.send_json(reply)
        await websocket.close(1000)


async def _take_audio(websocket: WebSocket, stream: AudioStream, watch: SocketWatch, data: bytes) -> None:
    if len(data) > MAX_MESSAGE_BYTES:
        raise AudioRefused(f"a message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
    if data:  # an empty message holds no audio: it does not keep the session from idling out
        await stream.add(data)
        watch.heard_audio()
    await websocket.send_json({"type": "ack", "samples": stream.stored, "seconds": stream.stored / AUDIO_RATE})


class SocketWatch:
    """What an open audio socket watches besides its messages: the idle timeout and the session's lifetime (the
    session ends: SessionEnds) and, every MONOLOGUE_API__KEY_RECHECK_S, its session ending elsewhere and its key
    being revoked (the socket closes: AudioRefused)."""

    def __init__(
        self, services: Services, session_id: str, key_id: str | None, created_at: datetime, holder: str
    ) -> None:
        self._services, self.session_id, self._key_id, self._holder = services, session_id, key_id, holder
        self._audio_unclaimed = False  # audio came since the claim was last refreshed
        self._claim_refresh_at = time.monotonic() + CLAIM_REFRESH_S
        self._idle_s = services.settings.render.live_idle_timeout_s
        self._lifetime_s = services.settings.limits.max_live_seconds
        self._recheck_s = services.settings.api.key_recheck_s
        now = time.monotonic()
        self._idle_until = now + self._idle_s
        # The lifetime counts from the session's creation: the wall clock, as another API process may have made it.
        self._lifetime_until = now + self._lifetime_s - (time.time() - aware(created_at).timestamp())
        self._recheck_at = now + self._recheck_s

    def heard_audio(self) -> None:
        """Audio arrived: only that keeps the session from idling out (and this socket's claim on it fresh)."""
        self._idle_until = time.monotonic() + self._idle_s
        self._audio_unclaimed = True

    async def receive(self, websocket: WebSocket, *, tick_s: float | None = None) -> Message | None:
        """The socket's next message, or None when a check (or, with `tick_s`, a tick) is due first."""
        wait_s = min(self._idle_until, self._lifetime_until, self._recheck_at) - time.monotonic()
        if tick_s is not None:
            wait_s = min(wait_s, tick_s)
        if wait_s <= 0:
            return None
        try:
            return await asyncio.wait_for(websocket.receive(), timeout=wait_s)
        except TimeoutError:
            return None

    async def check(self) -> None:
        """Raise SessionEnds or AudioRefused if the socket must stop (the database only when a re-check is due)."""
        now = time.monotonic()
        if now >= self._lifetime_until:
            raise SessionEnds(
                f"the session reached its lifetime of {self._lifetime_s:g} s (MONOLOGUE_LIMITS__MAX_LIVE_SECONDS):"
                " it ends with the audio it has"
            )
        if now >= self._idle_until:
            raise SessionEnds(f"no audio for {self._idle_s:g} s: the session ends with the audio it has")
        if self._audio_unclaimed and now >= self._claim_refresh_at:
            self._audio_unclaimed, self._claim_refresh_at = False, now + CLAIM_REFRESH_S
            if await unless_database_down(self.session_id, self._refresh_claim) is False:
                raise _taken_over(self.session_id)
        if now >= self._recheck_at:
            await unless_database_down(self.session_id, self._recheck)
            self._recheck_at = time.monotonic() + self._recheck_s

    def _refresh_claim(self) -> bool:
        with self._services.sessions() as db:
            return repo.refresh_audio_socket(db, session_id=self.session_id, holder=self._holder)

    def _recheck(self) -> None:
        if self._key_id is not None and streams.key_revoked(self._services, self._key_id):
            raise AudioRefused(streams.REVOKED, CLOSE_UNAUTHORIZED)
        with self._services.sessions() as db:
            row = repo.get_session(db, session_id=self.session_id)
            current = "gone" if row is None else row.status
            holds = row is not None and row.audio_socket == self._holder
        if current == "gone" or current in TERMINAL:  # cancelled, or failed or completed without this socket
            raise AudioRefused(f"live session {self.session_id} is {current}: it takes no more audio", CLOSE_CONFLICT)
        if not holds:  # silent past TAKEOVER_S, and a new socket of the session took over
            raise _taken_over(self.session_id)


async def serve(websocket: WebSocket, services: Services, session_id: str, principal: Principal) -> None:
    """Take one accepted socket's audio for `session_id` until the session's audio is over or the socket closes."""
    holder = uuid.uuid4().hex
    stream: AudioStream | None = None
    claimed = False
    try:
        with _take_slot(websocket, principal):
            opened, watch = await run_in_threadpool(_open_stream, services, session_id, principal, holder)
            stream, claimed = opened, True
            stored = opened.stored
            await websocket.send_json({"type": "ready", "samples": stored, "seconds": stored / AUDIO_RATE})
            await _receive_audio(websocket, opened, watch)
    except AudioRefused as refused:
        log.info("audio stream refused", session_id=session_id, reason=str(refused), code=refused.code)
        if websocket.client_state == WebSocketState.CONNECTED:
            await websocket.send_json(refused.message())
            await websocket.close(refused.code)
        if stream is not None and not stream.ended and refused.ends_session:
            with contextlib.suppress(AudioRefused):  # bad input or a revoked key ends the session's audio
                await stream.end()
    except WebSocketDisconnect:
        pass  # the client may reconnect; else the workflow's idle timeout ends the session
    finally:
        if stream is not None:
            stream.signaller.outlive()  # what Temporal has not heard yet is still sent
        if claimed:
            await run_in_threadpool(_release, services, session_id, holder)


def _taken_over(session_id: str) -> AudioRefused:
    return AudioRefused(f"live session {session_id} has another audio socket now", CLOSE_CONFLICT, ends_session=False)


def _take_slot(websocket: WebSocket, principal: Principal) -> streams.StreamSlot:
    services: Services = websocket.app.state.services
    try:
        return streams.stream_slots(websocket.app.state).take(
            principal.key_id, services.settings.limits.max_streams_per_key
        )
    except TooManyStreams as err:
        raise AudioRefused(str(err), CLOSE_TOO_MANY, ends_session=False) from None


def _open_stream(
    services: Services, session_id: str, principal: Principal, holder: str
) -> tuple[AudioStream, SocketWatch]:
    """Claim the session for this socket and continue its audio where storage holds it."""
    with services.sessions() as db:
        row = repo.get_session(db, session_id=session_id)
        if row is None or row.kind != c.SessionKind.LIVE or row.tenant != principal.tenant:
            raise AudioRefused(f"live session {session_id!r} not found", CLOSE_NOT_FOUND, ends_session=False)
        if row.status in TERMINAL:
            raise AudioRefused(f"live session {session_id} is already {row.status}", CLOSE_CONFLICT, ends_session=False)
        if not repo.claim_audio_socket(db, session_id=session_id, holder=holder, takeover_s=TAKEOVER_S):
            raise AudioRefused(
                f"live session {session_id} already has an audio socket open; a session takes one at a time (a"
                f" reconnect gets in once the other has been silent for {TAKEOVER_S:g} s)",
                CLOSE_CONFLICT,
                ends_session=False,
                retry_after_s=TAKEOVER_S,
            )
        options = c.render_options(row.options)
        watch = SocketWatch(services, session_id, principal.key_id, row.created_at, holder)
    samples, ended = stored_live_audio(services.store, session_id)
    if ended:
        _release(services, session_id, holder)
        raise AudioRefused(
            f"live session {session_id}'s audio has ended; it takes no more", CLOSE_CONFLICT, ends_session=False
        )
    return AudioStream(services, session_id, options, stored=samples), watch


def _release(services: Services, session_id: str, holder: str) -> None:
    with services.sessions() as db:
        repo.release_audio_socket(db, session_id=session_id, holder=holder)


def _parse_text(text: str) -> dict[str, Any]:
    try:
        command = parse_json(text)
    except ValueError:
        command = None
    if not isinstance(command, dict):
        raise AudioRefused(
            'text messages must be JSON objects: {"type": "start", ...}, {"type": "interrupt"} or {"type": "end"}'
        )
    return command
