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
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

import numpy as np
import structlog
from fastapi import WebSocket
from fastapi.concurrency import run_in_threadpool
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect, WebSocketState

from monologue import contracts as c, repo
from monologue.errors import StorageUnavailable
from monologue.live_audio import LIVE_PIECE_SAMPLES, TAKEOVER_S, LiveAudioWriter, stored_live_audio
from monologue.plan import AUDIO_RATE, IncrementalPlanner, chunk_sizes, live_frames
from monologue.repo.nodes import aware
from monologue.storage import retrying_for

from . import streams
from .deps import Principal, Services
from .errors import TooManyStreams
from .inputs import parse_json
from .live_resample import PcmResampler, ResamplerMissing
from .live_signal import WorkflowSignaller
from .outages import database_down
from .submit import TERMINAL

STORAGE_RETRY_S = 1.0  # while storage is down, how often a socket tries to store the audio it holds
MAX_MESSAGE_BYTES = 1 << 20  # one audio message: 1 MiB (about 32 s of 16 kHz mono)
END_SIGNAL_WAIT_S = 5.0  # how long `end` waits for the workflow to hear of it before telling the client `ended`
# WebSocket close codes (4000-4999 are the application's own).
CLOSE_NOT_FOUND, CLOSE_CONFLICT, CLOSE_BAD_AUDIO, CLOSE_UNAUTHORIZED = 4404, 4409, 4400, 4401
CLOSE_TOO_MANY = 4429
# With `start`'s `realtime`, silence is stored once the client's audio trails the wall clock by this much: what a client
# streaming in real time may lag by (network, scheduling) without a gap being filled in its speech.
REALTIME_SLACK_S = 0.5
REALTIME_TICK_S = 0.1  # how often a realtime socket looks whether silence is due
# A socket that brought no audio for TAKEOVER_S loses its session to a new socket (monologue.live_audio); its claim is
# refreshed at most once a second while audio comes.
CLAIM_REFRESH_S = 1.0
log = structlog.get_logger("api.sessions")
T = TypeVar("T")


class AudioRefused(Exception):
    """Bad audio or a refused stream: told to the client, then the socket closes with `code`. `ends_session`: the
    session's audio ends with what is stored (bad audio, a revoked key); not when another socket took over."""

    def __init__(
        self,
        message: str,
        code: int = CLOSE_BAD_AUDIO,
        *,
        ends_session: bool = True,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.ends_session = ends_session
        self.retry_after_s = retry_after_s  # a socket refused for now (another is open) may try again after this

    def message(self) -> dict[str, Any]:
        """The `error` message the client gets."""
        extra = {} if self.retry_after_s is None else {"retry_after_s": self.retry_after_s}
        return {"type": "error", "message": str(self)} | extra


class SessionEnds(Exception):
    """The session's audio is over (an `end` message, the idle timeout, the lifetime): it completes with the
    audio it has, and the socket closes with 1000 after an `ended` message (with this message, if any)."""


class AudioStream:
    """One socket's incoming audio: decode, resample, store in pieces, acknowledge, tell the workflow. `stored`: the
    samples a previous socket of the session stored (this one continues after them)."""

    def __init__(self, services: Services, session_id: str, options: c.RenderOptions, *, stored: int = 0) -> None:
        self._services = services
        self._session_id = session_id
        self._writer = LiveAudioWriter(services.store, session_id, stored=stored)
        self._planner = IncrementalPlanner(**chunk_sizes(options))
        # The chunks the stored audio allows are planned already: this socket signals only what its audio adds.
        list(self._planner.advance(live_frames(stored, options, ended=False), final=False))
        self._options = options  # the workflow plans live chunks from the same (lip sync: the look-ahead)
        self._marks: list[list[float]] = []
        self._signalled = stored  # the workflow may know of the stored audio (an earlier socket's signals)
        self.signaller = WorkflowSignaller(services.temporal, session_id)
        self._rate, self._channels = AUDIO_RATE, 1
        self._resampler: PcmResampler | None = None
        self._max_samples = int(services.settings.limits.max_live_seconds * AUDIO_RATE)
        self._accepted = stored  # samples (16 kHz) taken, stored or still buffered
        self._first_audio = stored == 0  # the session's clock (TTFF) starts with its first audio
        self.received_audio = False  # on this socket
        self._held: list[np.ndarray] = []  # audio taken while storage was down, not yet handed to the writer
        self._realtime: tuple[float, int] | None = None  # `start`'s realtime: (monotonic, samples taken) at its start
        self._store_again_at = 0.0  # monotonic: storage failed; until then, audio is only held

    def configure(self, header: dict[str, Any]) -> None:
        """The optional `start` message: the PCM's rate and channel count."""
        if self.received_audio:
            raise AudioRefused("'start' must be the first message on a socket, before any audio")
        if header.get("format", "s16le") != "s16le":
            raise AudioRefused(f"format {header.get('format')!r} is not supported; send PCM 's16le'")
        rate, channels = header.get("sample_rate", AUDIO_RATE), header.get("channels", 1)
        realtime = header.get("realtime", False)
        if not isinstance(realtime, bool):
            raise AudioRefused(f"realtime {realtime!r} must be true or false")
        if realtime:
            self._realtime = (time.monotonic(), self._accepted)
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
        self.received_audio = True
        return await self._take(self._to_mono16k(np.frombuffer(data, dtype="<i2")))

    async def keep_up(self) -> None:
        """With `start`'s `realtime`: while the client sends nothing, store silence, so the session's audio keeps up
        with the wall clock (less REALTIME_SLACK_S, in whole pieces) and its avatar idles (blinks, sway) instead of
        stalling. The silence is stored audio like the rest: the frames stay a function of what is stored."""
        if self._realtime is None or self.ended:
            return
        since, taken = self._realtime
        due = taken + int((time.monotonic() - since - REALTIME_SLACK_S) * AUDIO_RATE)
        missing = (due - self._accepted) // LIVE_PIECE_SAMPLES * LIVE_PIECE_SAMPLES
        if missing > 0:
            await self._take(np.zeros(missing, dtype="<i2"))

    async def _take(self, pcm: np.ndarray) -> int:
        """Store 16 kHz mono samples (the client's, or `keep_up`'s silence); returns the samples stored so far."""
        if self._first_audio:
            self._first_audio = False
            await _unless_database_down(self._session_id, self._record, 0)
        samples, full = self._fit(pcm)
        stored = await self._store(samples)
        await self._progress(stored, ended=False)
        if full:
            limit = self._services.settings.limits.max_live_seconds
            raise SessionEnds(
                f"the session's audio reached its limit of {limit:g} s (MONOLOGUE_LIMITS__MAX_LIVE_SECONDS):"
                " it ends with the audio it has"
            )
        return stored

    async def _store(self, samples: np.ndarray) -> int:
        """Store the audio held so far with this message's; returns the samples stored. While storage is down the
        socket keeps reading (a socket that stalls misses its keepalive pings and drops): the audio waits in memory,
        unacknowledged, and storing is tried again every STORAGE_RETRY_S, for a request's short while each time. What
        waits is bounded: with no audio stored the workflow hears of none, ends the session after its idle timeout,
        and the socket's recheck closes it."""
        self._held.append(samples)
        if time.monotonic() < self._store_again_at:
            return self._writer.stored
        held, self._held = self._held, []
        try:  # the writer keeps what it could not store (LiveAudioWriter.append), so nothing is lost or doubled
            return await run_in_threadpool(self._writer.append, np.concatenate(held))
        except StorageUnavailable as err:
            self._store_again_at = time.monotonic() + STORAGE_RETRY_S
            log.warning("live audio held: storage is unavailable", session_id=self._session_id, error=str(err))
            return self._writer.stored

    def _patiently(self, write: Callable[..., T], *args: Any) -> T:
        """The last write (the end of the audio) waits out a storage outage as a node does
        (MONOLOGUE_STORAGE__RETRY_FOR_S), not a request's short while: the client is told `ended` once every sample it
        sent is stored."""
        with retrying_for(self._services.settings.storage.retry_for_s):
            return write(*args)

    async def end(self) -> int:
        """No more audio: store the rest, mark it ended and tell the workflow."""
        if self._resampler is not None:
            tail = self._resampler.flush()
            if len(tail):
                self._held.append(self._fit(tail)[0])
        held, self._held = self._held, []
        await run_in_threadpool(self._patiently, self._writer.append, np.concatenate([np.zeros(0, "<i2"), *held]))
        stored = await run_in_threadpool(self._patiently, self._writer.finish)
        await self._progress(stored, ended=True)
        # Normally the workflow has heard of the end before the client is told `ended`; while Temporal is down
        # the client is told anyway (the audio and its end are stored) and the signal follows once it is back.
        if not await self.signaller.flush(END_SIGNAL_WAIT_S) and self.signaller.refused is not None:
            raise AudioRefused(self.signaller.refused, CLOSE_CONFLICT)
        return stored

    async def interrupt(self) -> dict[str, Any]:
        """Barge-in: drop the audio the workflow has not been told of, so not yet planned (`LiveAudioWriter.interrupt`:
        stored as a cut, read as silence), and what this socket holds unstored (never acknowledged). Returns the
        `interrupted` message: the interrupt point and how many stored samples were dropped."""
        self._held = []
        cut = await run_in_threadpool(self._patiently, self._writer.interrupt, self._signalled)
        point = self._writer.stored if cut is None else cut.start
        dropped = 0 if cut is None else cut.end - cut.start
        log.info("live audio interrupted", session_id=self._session_id, at=point, dropped=dropped)
        return {"type": "interrupted", "samples": self._writer.stored, "at": point, "dropped": dropped}

    @property
    def ended(self) -> bool:
        return self._writer.ended

    @property
    def realtime(self) -> bool:
        return self._realtime is not None

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
        signal per chunk, so a long session's history stays small) or has ended. The signal goes in the background
        (`api/live_signal.py`): an outage of Temporal holds no acknowledgement up."""
        if self.signaller.refused is not None:
            raise AudioRefused(self.signaller.refused, CLOSE_CONFLICT)
        now_ms = time.time() * 1000
        if not self._marks or self._marks[-1][0] < stored:
            self._marks.append([float(stored), now_ms])
        frames = live_frames(stored, self._options, ended=ended)
        unlocked = len(list(self._planner.advance(frames, final=ended))) > 0
        if not (unlocked or ended) or (stored == self._signalled and not ended):
            return
        self.signaller.offer(stored, ended=ended, marks=self._marks)
        self._marks, self._signalled = [], stored
        await _unless_database_down(self._session_id, self._record, stored)

    def _record(self, stored: int) -> None:
        with self._services.sessions() as db:
            repo.record_live_audio(db, session_id=self._session_id, samples=stored, rate=AUDIO_RATE)


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
            if await _unless_database_down(self.session_id, self._refresh_claim) is False:
                raise _taken_over(self.session_id)
        if now >= self._recheck_at:
            await _unless_database_down(self.session_id, self._recheck)
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


async def _unless_database_down(session_id: str, work: Callable[..., T], *args: Any) -> T | None:
    """`work(*args)` on the thread pool; None when the database is down (logged): the socket keeps taking and
    acknowledging audio, which storage holds, and the bookkeeping or check is done again later."""
    try:
        return await run_in_threadpool(work, *args)
    except Exception as err:
        if not database_down(err):
            raise
        log.warning("live socket: the database is down", session_id=session_id, step=work.__name__)
        return None


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
