"""A live session's audio as one socket (or WHIP connection) brings it: decoded, resampled to 16 kHz mono, stored in
pieces (acknowledged = stored), the workflow told, and the interrupt and realtime rules (`AudioStream`). The socket
itself, its framing and its watch are `api/live_socket.py`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import structlog
from fastapi.concurrency import run_in_threadpool

from monologue import contracts as c, repo
from monologue.errors import StorageUnavailable
from monologue.live_audio import LIVE_PIECE_SAMPLES, LiveAudioWriter
from monologue.plan import AUDIO_RATE, IncrementalPlanner, chunk_sizes, live_frames
from monologue.storage import retrying_for

from .deps import Services
from .live_resample import PcmResampler, ResamplerMissing
from .live_signal import WorkflowSignaller
from .outages import database_down

# WebSocket close codes (4000-4999 are the application's own), which a refusal carries.
CLOSE_NOT_FOUND, CLOSE_CONFLICT, CLOSE_BAD_AUDIO, CLOSE_UNAUTHORIZED = 4404, 4409, 4400, 4401
CLOSE_TOO_MANY = 4429
STORAGE_RETRY_S = 1.0  # while storage is down, how often a socket tries to store the audio it holds
END_SIGNAL_WAIT_S = 5.0  # how long `end` waits for the workflow to hear of it before telling the client `ended`
# With `start`'s `realtime`, silence is stored once the client's audio trails the wall clock by this much: what a client
# streaming in real time may lag by (network, scheduling) without a gap being filled in its speech.
REALTIME_SLACK_S = 0.5
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
            await unless_database_down(self._session_id, self._record, 0)
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
        await unless_database_down(self._session_id, self._record, stored)

    def _record(self, stored: int) -> None:
        with self._services.sessions() as db:
            repo.record_live_audio(db, session_id=self._session_id, samples=stored, rate=AUDIO_RATE)


async def unless_database_down(session_id: str, work: Callable[..., T], *args: Any) -> T | None:
    """`work(*args)` on the thread pool; None when the database is down (logged): the socket keeps taking and
    acknowledging audio, which storage holds, and the bookkeeping or check is done again later."""
    try:
        return await run_in_threadpool(work, *args)
    except Exception as err:
        if not database_down(err):
            raise
        log.warning("live socket: the database is down", session_id=session_id, step=work.__name__)
        return None
