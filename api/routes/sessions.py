"""`/v1/sessions`: live sessions. The client streams speech in over a WebSocket while viewers watch the
HLS stream a few seconds behind.

Audio framing on `WS /v1/sessions/{id}/audio`:
- optional first text message `{"type": "start", "sample_rate": 16000, "channels": 1, "format": "s16le"}`
  (other rates and stereo are resampled to 16 kHz mono; without it the stream must be 16 kHz mono);
- binary messages: raw PCM, signed 16-bit little-endian, channels interleaved, whole samples only;
- text `{"type": "end"}`: no more audio; the session finishes its last chunks and completes.
The server answers `{"type": "ack", "samples": n, "seconds": s}` once audio up to n samples (16 kHz) is
stored (it stores 0.1 s pieces, so up to 0.1 s may wait for the next message), `{"type": "ended", ...}`
after `end`, and `{"type": "error", "message": ...}` before closing on bad input. A closed socket also
ends the session; so does no audio for `MONOLOGUE_RENDER__LIVE_IDLE_TIMEOUT_S`. A session takes one
audio stream: a second socket (or a reconnect) is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Annotated, Any

import av
import numpy as np
import structlog
from fastapi import APIRouter, File, HTTPException, Request, UploadFile, WebSocket, status
from fastapi.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect, WebSocketState
from temporalio.service import RPCError

from monologue import contracts as c
from monologue import repo
from monologue.errors import InputError
from monologue.live_audio import LiveAudioWriter
from monologue.plan import AUDIO_RATE, IncrementalPlanner, chunk_sizes, live_frames

from ..deps import DbDep, Principal, Services, ServicesDep, TenantDep, principal_from_headers
from ..schemas import Problem, RenderOptionsCreate, RenderPublic
from ..submit import TERMINAL, start_live, validate_portrait
from .renders import OptionFields, _find, _public, _read_limited, validated_options

router = APIRouter(prefix="/v1/sessions", tags=["live sessions"])
log = structlog.get_logger("api.sessions")

MAX_MESSAGE_BYTES = 1 << 20  # one audio message: 1 MiB (about 32 s of 16 kHz mono)
MAX_MARKS = 64  # arrival marks per signal (latency figures); older ones are thinned out
# WebSocket close codes (4000-4999 are the application's own).
CLOSE_NOT_FOUND, CLOSE_CONFLICT, CLOSE_BAD_AUDIO, CLOSE_UNAUTHORIZED = 4404, 4409, 4400, 4401


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
    options = validated_options(services, fields)
    portrait_bytes = await _read_limited(portrait, "portrait", services.settings.limits.max_upload_bytes)
    try:
        image = await run_in_threadpool(
            validate_portrait, portrait=portrait_bytes, family=options.family, settings=services.settings
        )
    except InputError as err:
        raise HTTPException(422, str(err)) from err
    session_id = await start_live(services, portrait=image, options=options, tenant=principal.tenant or "local")
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


class AudioStream:
    """One live session's incoming audio: decode, resample, store in pieces, acknowledge, tell the workflow."""

    def __init__(self, services: Services, session_id: str, options: RenderOptionsCreate) -> None:
        self._services = services
        self._session_id = session_id
        self._writer = LiveAudioWriter(services.store, session_id)
        self._planner = IncrementalPlanner(**chunk_sizes(options))
        self._fps = options.fps
        self._marks: list[list[float]] = []
        self._signalled = 0
        self._rate, self._channels = AUDIO_RATE, 1
        self._resampler: av.AudioResampler | None = None
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
            self._resampler = av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE)

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
        samples = self._to_mono16k(np.frombuffer(data, dtype="<i2"))
        limit = self._services.settings.limits.max_audio_seconds
        if limit is not None and self._writer.stored + len(samples) > limit * AUDIO_RATE:
            raise AudioRefused(
                f"the session's audio would pass the {limit:g} s limit (MONOLOGUE_LIMITS__MAX_AUDIO_SECONDS);"
                " it ends with the audio it has"
            )
        stored = await run_in_threadpool(self._writer.append, samples)
        await self._progress(stored, ended=False)
        return stored

    async def end(self) -> int:
        """No more audio: store the rest, mark it ended and tell the workflow."""
        if self._resampler is not None:
            tail = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(None)]
            if tail:
                await run_in_threadpool(self._writer.append, np.concatenate(tail))
        stored = await run_in_threadpool(self._writer.finish)
        await self._progress(stored, ended=True)
        return stored

    @property
    def ended(self) -> bool:
        return self._writer.ended

    def _to_mono16k(self, pcm: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return pcm
        layout = "mono" if self._channels == 1 else "stereo"
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=layout)
        frame.sample_rate = self._rate
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(out) if out else np.zeros(0, dtype="<i2")

    async def _progress(self, stored: int, *, ended: bool) -> None:
        """Record the arrival, and signal the workflow when the stored audio lets it plan new chunks (about one
        signal per chunk, so a long session's history stays small) or has ended."""
        now_ms = time.time() * 1000
        if not self._marks or self._marks[-1][0] < stored:
            self._marks.append([float(stored), now_ms])
        frames = live_frames(stored, rate=AUDIO_RATE, fps=self._fps, ended=ended)
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
        stream = _open_stream(services, session_id, principal)
        idle = services.settings.render.live_idle_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(websocket.receive(), timeout=idle)
            except TimeoutError:
                raise AudioRefused(f"no audio for {idle:g} s: the session ends with the audio it has", 1000) from None
            if message["type"] == "websocket.disconnect":
                break
            if message.get("bytes") is not None:
                data: bytes = message["bytes"]
                if len(data) > MAX_MESSAGE_BYTES:
                    raise AudioRefused(f"a message of {len(data)} bytes is over the {MAX_MESSAGE_BYTES}-byte limit")
                stored = await stream.add(data)
                await websocket.send_json({"type": "ack", "samples": stored, "seconds": stored / AUDIO_RATE})
                continue
            command = _parse_text(message.get("text") or "")
            if command.get("type") == "start":
                stream.configure(command)
            elif command.get("type") == "end":
                stored = await stream.end()
                await websocket.send_json({"type": "ended", "samples": stored, "seconds": stored / AUDIO_RATE})
                await websocket.close(1000)
                return
            else:
                raise AudioRefused(f"unknown message type {command.get('type')!r}; expected 'start' or 'end'")
    except AudioRefused as refused:
        log.info("audio stream refused", session_id=session_id, reason=str(refused))
        if websocket.client_state == WebSocketState.CONNECTED:
            if refused.code != 1000 or str(refused):
                kind = "ended" if refused.code == 1000 else "error"
                await websocket.send_json({"type": kind, "message": str(refused)})
            await websocket.close(refused.code)
    except WebSocketDisconnect:
        pass
    finally:
        if stream is not None and not stream.ended:
            with contextlib.suppress(AudioRefused):  # a closed socket (or bad input) ends the session
                await stream.end()


def _open_stream(services: Services, session_id: str, principal: Principal) -> AudioStream:
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
        options = RenderOptionsCreate.model_validate(row.options)
    return AudioStream(services, session_id, options)


def _parse_text(text: str) -> dict[str, Any]:
    try:
        command = json.loads(text)
    except json.JSONDecodeError:
        command = None
    if not isinstance(command, dict):
        raise AudioRefused('text messages must be JSON objects: {"type": "start", ...} or {"type": "end"}')
    return command
