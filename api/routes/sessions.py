"""`/v1/sessions`: live sessions. The client streams speech in over a WebSocket while viewers watch the
HLS stream a few seconds behind.

Audio framing on `WS /v1/sessions/{id}/audio`:
- optional first text message `{"type": "start", "sample_rate": 16000, "channels": 1, "format": "s16le"}`
  (other rates and stereo are resampled to 16 kHz mono; without it the stream must be 16 kHz mono);
- binary messages: raw PCM, signed 16-bit little-endian, channels interleaved, whole samples only;
- text `{"type": "end"}`: no more audio; the session finishes its last chunks and completes.
The server answers `{"type": "ack", "samples": n, "seconds": s}` once audio up to n samples (16 kHz) is
stored (it stores 0.1 s pieces, so up to 0.1 s may wait for the next message), and
`{"type": "ended", "samples": n, "seconds": s}` (with a `message` saying why when the client did not send
`end`) before closing with 1000 once the session's audio is over. The session then completes with the audio it
has. Besides `end`, that happens after no audio (non-empty binary messages; `start` and empty ones do not
count) for MONOLOGUE_RENDER__LIVE_IDLE_TIMEOUT_S, and once the session has lived, or its audio lasts,
MONOLOGUE_LIMITS__MAX_LIVE_SECONDS (its workflow enforces the lifetime too). A closed socket also ends the
session. Otherwise the server sends `{"type": "error", "message": ...}` and closes with 4400 (bad input),
4401 (no valid key, or the key was revoked while the socket was open), 4404 (no such live session), 4409
(the session already has a socket, or ended: cancelled, failed or completed) or 4429 (the key holds
MONOLOGUE_LIMITS__MAX_STREAMS_PER_KEY streams already). The open socket re-checks its key and its session
every MONOLOGUE_API__KEY_RECHECK_S. A session takes one audio stream: a second socket (or a reconnect) is
refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from datetime import datetime
from typing import Annotated, Any

import numpy as np
import structlog
from fastapi import APIRouter, File, HTTPException, Request, UploadFile, WebSocket, status
from fastapi.concurrency import run_in_threadpool
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect, WebSocketState
from temporalio.service import RPCError

from monologue import contracts as c
from monologue import repo
from monologue.errors import InputError
from monologue.live_audio import LiveAudioWriter
from monologue.plan import AUDIO_RATE, IncrementalPlanner, chunk_sizes, live_frames
from monologue.repo_nodes import aware

from .. import streams
from ..deps import DbDep, Principal, Services, ServicesDep, TenantDep, principal_from_headers
from ..inputs import OptionFields, validated_options
from ..live_resample import PcmResampler, ResamplerMissing
from ..schemas import Problem, RenderPublic
from ..submit import TERMINAL, start_live
from .renders import _find, _public, _read_limited

router = APIRouter(prefix="/v1/sessions", tags=["live sessions"])
log = structlog.get_logger("api.sessions")

MAX_MESSAGE_BYTES = 1 << 20  # one audio message: 1 MiB (about 32 s of 16 kHz mono)
MAX_MARKS = 64  # arrival marks per signal (latency figures); older ones are thinned out
# WebSocket close codes (4000-4999 are the application's own).
CLOSE_NOT_FOUND, CLOSE_CONFLICT, CLOSE_BAD_AUDIO, CLOSE_UNAUTHORIZED = 4404, 4409, 4400, 4401
CLOSE_TOO_MANY = 4429


@router.post("", status_code=status.HTTP_201_CREATED, response_model=RenderPublic, responses={422: {"model": Problem}})
async def create_session(
    request: Request,
    services: ServicesDep,
    db: DbDep,
    principal: TenantDep,
    portrait: Annotated[UploadFile, File(description="Portrait image: PNG, JPEG, WebP…")],
    fields: OptionFields,
) -> RenderPublic:
    """Start a live session; stream its audio to `links.audio` and watch `links.stream`.

    Everything else about the session (progress, events, cancel, resume, the final video) is under
    `/v1/renders/{id}`, as for a render."""
    # A live session's first chunk waits for its own audio: keep it short (a setting) unless told.
    fields.setdefault("first_chunk_frames", services.settings.render.live_first_chunk_frames)
    options = validated_options(services, fields, tenant=principal.tenant or "local")
    portrait_bytes = await _read_limited(portrait, "portrait", services.settings.limits.max_upload_bytes)
    try:
        session_id = await start_live(
            services, portrait=portrait_bytes, options=options, tenant=principal.tenant or "local"
        )
    except InputError as err:
        raise HTTPException(422, str(err)) from err
    row = _find(db, session_id, principal)
    return _public(request, services, db, row)


@router.get("/{session_id}", response_model=RenderPublic)
def get_session(
    session_id: str, request: Request, services: ServicesDep, db: DbDep, principal: TenantDep
) -> RenderPublic:
    """The live session (the same as `/v1/renders/{id}`), with its latency figures."""
    return _public(request, services, db, _find(db, session_id, principal))


class AudioRefused(Exception):
    """Bad audio or a refused stream: told to the client, then the socket closes with `code`."""

    def __init__(self, message: str, code: int = CLOSE_BAD_AUDIO) -> None:
        super().__init__(message)
        self.code = code


class SessionEnds(Exception):
    """The session's audio is over (an `end` message, the idle timeout, the lifetime): it completes with the
    audio it has, and the socket closes with 1000 after an `ended` message (with this message, if any)."""


class AudioStream:
    """One live session's incoming audio: decode, resample, store in pieces, acknowledge, tell the workflow."""

    def __init__(self, services: Services, session_id: str, options: c.RenderOptions) -> None:
        self._services = services
        self._session_id = session_id
        self._writer = LiveAudioWriter(services.store, session_id)
        self._planner = IncrementalPlanner(**chunk_sizes(options))
        self._options = options  # the workflow plans live chunks from the same (lip sync: the look-ahead)
        self._marks: list[list[float]] = []
        self._signalled = 0
        self._rate, self._channels = AUDIO_RATE, 1
        self._resampler: PcmResampler | None = None
        self._max_samples = int(services.settings.limits.max_live_seconds * AUDIO_RATE)
        self._accepted = 0  # samples (16 kHz) taken, stored or still buffered
        self.received_audio = False

    def configure(self, header: dict[str, Any]) -> None:
        """The optional `start` message: the PCM's rate and channel count."""
        if self.received_audio:
            raise AudioRefused("'start' must be the first message, before any audio")
        if header.get("format", "s16le") != "s16le":
            raise AudioRefused(f"format {header.get('format')!r} is not supported; send PCM 's16le'")
        rate, channels = header.get("sample_rate", AUDIO_RATE), header.get("channels", 1)
        if not isinstance(rate, int) or not 8000 <= rate <= 192_000:
            raise AudioRefused(f"sample_rate {rate!r} must be an integer from 8000 to 192000 Hz")
        if channels not in (1, 2):
            raise AudioRefused(f"channels {channels!r} must be 1 or 2")
        self._rate, self._channels = rate, channels
        if (rate, channels) != (AUDIO_RATE, 1):
            try:
                self._resampler = PcmResampler(rate, channels)
            except ResamplerMissing as err:
                raise AudioRefused(str(err)) from None

    async def add(self, data: bytes) -> int:
        """Store a binary message's audio; returns the samples stored so far (16 kHz)."""
        if len(data) % (2 * self._channels):
            raise AudioRefused(
                f"a binary message of {len(data)} bytes does not hold whole samples: expected s16le PCM,"
                f" {self._channels} channel(s), a multiple of {2 * self._channels} bytes"
            )
        if not self.received_audio:  # the session's clock (TTFF) starts with its first audio
            self.received_audio = True
            await run_in_threadpool(self._record, 0)
        samples, full = self._fit(self._to_mono16k(np.frombuffer(data, dtype="<i2")))
        stored = await run_in_threadpool(self._writer.append, samples)
        await self._progress(stored, ended=False)
        if full:
            limit = self._services.settings.limits.max_live_seconds
            raise SessionEnds(
                f"the session's audio reached its limit of {limit:g} s (MONOLOGUE_LIMITS__MAX_LIVE_SECONDS):"
                " it ends with the audio it has"
            )
        return stored

    async def end(self) -> int:
        """No more audio: store the rest, mark it ended and tell the workflow."""
        if self._resampler is not None:
            tail = self._resampler.flush()
            if len(tail):
                await run_in_threadpool(self._writer.append, self._fit(tail)[0])
        stored = await run_in_threadpool(self._writer.finish)
        await self._progress(stored, ended=True)
        return stored

    @property
    def ended(self) -> bool:
        return self._writer.ended

    @property
    def stored(self) -> int:
        return self._writer.stored

    def _fit(self, samples: np.ndarray) -> tuple[np.ndarray, bool]:
        """The part of `samples` the session's audio limit leaves room for, and whether the limit is reached."""
        room = max(0, self._max_samples - self._accepted)
        samples = samples[:room]
        self._accepted += len(samples)
        return samples, self._accepted >= self._max_samples

    def _to_mono16k(self, pcm: np.ndarray) -> np.ndarray:
        return pcm if self._resampler is None else self._resampler.resample(pcm)

    async def _progress(self, stored: int, *, ended: bool) -> None:
        """Record the arrival, and signal the workflow when the stored audio lets it plan new chunks (about one
        signal per chunk, so a long session's history stays small) or has ended."""
        now_ms = time.time() * 1000
        if not self._marks or self._marks[-1][0] < stored:
            self._marks.append([float(stored), now_ms])
        frames = live_frames(stored, self._options, ended=ended)
        unlocked = len(list(self._planner.advance(frames, final=ended))) > 0
        if not (unlocked or ended) or (stored == self._signalled and not ended):
            return
        if len(self._marks) > MAX_MARKS:  # keep the newest marks and thin out the rest
            self._marks = self._marks[-MAX_MARKS:]
        signal = c.AudioAvailable(samples=stored, ended=ended, marks=self._marks)
        handle = self._services.temporal.get_workflow_handle(c.render_workflow_id(self._session_id))
        try:
            await handle.signal(c.AUDIO_AVAILABLE, signal)
        except RPCError as err:
            raise AudioRefused(f"the session is no longer running ({err.message})", CLOSE_CONFLICT) from err
        self._marks, self._signalled = [], stored
        await run_in_threadpool(self._record, stored)

    def _record(self, stored: int) -> None:
        with self._services.sessions() as db:
            repo.record_live_audio(db, session_id=self._session_id, samples=stored, rate=AUDIO_RATE)


@router.websocket("/{session_id}/audio")
async def session_audio(websocket: WebSocket, session_id: str) -> None:
    """Stream a live session's speech in (framing in this module's docstring)."""
    services: Services = websocket.app.state.services
    await websocket.accept()
    stream: AudioStream | None = None
    try:
        try:
            principal = principal_from_headers(services, websocket.headers.get("authorization"))
        except HTTPException as err:
            raise AudioRefused(str(err.detail), CLOSE_UNAUTHORIZED) from None
        with _take_slot(websocket, principal):
            stream, watch = _open_stream(services, session_id, principal)
            await _receive_audio(websocket, stream, watch)
    except AudioRefused as refused:
        log.info("audio stream refused", session_id=session_id, reason=str(refused), code=refused.code)
        if websocket.client_state == WebSocketState.CONNECTED:
            await websocket.send_json({"type": "error", "message": str(refused)})
            await websocket.close(refused.code)
    except WebSocketDisconnect:
        pass
    finally:
        if stream is not None and not stream.ended:
            with contextlib.suppress(AudioRefused):  # a closed socket (or bad input) ends the session
                await stream.end()


async def _receive_audio(websocket: WebSocket, stream: AudioStream, watch: SocketWatch) -> None:
    """Take the socket's messages until the session's audio is over; then end it, say so and close."""
    try:
        while True:
            await watch.check()
            message = await watch.receive(websocket)
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
            elif command.get("type") == "end":
                raise SessionEnds()
            else:
                raise AudioRefused(f"unknown message type {command.get('type')!r}; expected 'start' or 'end'")
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

    def __init__(self, services: Services, session_id: str, key_id: str | None, created_at: datetime) -> None:
        self._services, self.session_id, self._key_id = services, session_id, key_id
        self._idle_s = services.settings.render.live_idle_timeout_s
        self._lifetime_s = services.settings.limits.max_live_seconds
        self._recheck_s = services.settings.api.key_recheck_s
        now = time.monotonic()
        self._idle_until = now + self._idle_s
        # The lifetime counts from the session's creation: the wall clock, as another API process may have made it.
        self._lifetime_until = now + self._lifetime_s - (time.time() - aware(created_at).timestamp())
        self._recheck_at = now + self._recheck_s

    def heard_audio(self) -> None:
        """Audio arrived: only that keeps the session from idling out."""
        self._idle_until = time.monotonic() + self._idle_s

    async def receive(self, websocket: WebSocket) -> Message | None:
        """The socket's next message, or None when a check is due first."""
        wait_s = min(self._idle_until, self._lifetime_until, self._recheck_at) - time.monotonic()
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
        if now >= self._recheck_at:
            await run_in_threadpool(self._recheck)
            self._recheck_at = time.monotonic() + self._recheck_s

    def _recheck(self) -> None:
        if self._key_id is not None and streams.key_revoked(self._services, self._key_id):
            raise AudioRefused(streams.REVOKED, CLOSE_UNAUTHORIZED)
        with self._services.sessions() as db:
            row = repo.get_session(db, session_id=self.session_id)
            current = "gone" if row is None else row.status
        if current == "gone" or current in TERMINAL:  # cancelled, or failed or completed without this socket
            raise AudioRefused(f"live session {self.session_id} is {current}: it takes no more audio", CLOSE_CONFLICT)


def _take_slot(websocket: WebSocket, principal: Principal) -> streams.StreamSlot:
    services: Services = websocket.app.state.services
    try:
        return streams.stream_slots(websocket.app.state).take(
            principal.key_id, services.settings.limits.max_streams_per_key
        )
    except streams.TooManyStreams as err:
        raise AudioRefused(str(err), CLOSE_TOO_MANY) from None


def _open_stream(services: Services, session_id: str, principal: Principal) -> tuple[AudioStream, SocketWatch]:
    with services.sessions() as db:
        row = repo.get_session(db, session_id=session_id)
        if row is None or row.kind != "live" or row.tenant != principal.tenant:
            raise AudioRefused(f"live session {session_id!r} not found", CLOSE_NOT_FOUND)
        if row.status in TERMINAL:
            raise AudioRefused(f"live session {session_id} is already {row.status}", CLOSE_CONFLICT)
        if not repo.claim_audio_socket(db, session_id=session_id):
            raise AudioRefused(
                f"live session {session_id} already has (or had) an audio stream; a session takes one",
                CLOSE_CONFLICT,
            )
        options = c.render_options(row.options)
        watch = SocketWatch(services, session_id, principal.key_id, row.created_at)
    return AudioStream(services, session_id, options), watch


def _parse_text(text: str) -> dict[str, Any]:
    try:
        command = json.loads(text)
    except json.JSONDecodeError:
        command = None
    if not isinstance(command, dict):
        raise AudioRefused('text messages must be JSON objects: {"type": "start", ...} or {"type": "end"}')
    return command
