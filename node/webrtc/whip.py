"""The node's WHIP ingress: a browser's microphone (Opus over WebRTC) into a live session's audio, stored exactly as the
API's audio socket stores it (api/live_socket.py): resampled to 16 kHz mono s16 (PyAV's AudioResampler, stateful, so
packet boundaries do not matter), written in the same 0.1 s pieces (`monologue.live_audio.LiveAudioWriter`), stored
before anything else is done with it, and the workflow told with the same AUDIO_AVAILABLE signals, about once per
chunk (the same incremental planner decides). WHIP has no acknowledgement channel: what is stored is what a sender
that reconnects continues after (whole pieces, `stored_live_audio`), as on the socket.

A sender holds its session as a socket does (`repo.claim_audio_socket`: one sender at a time, WebSocket or WHIP;
refreshed at most once a second while audio comes, so a silent one is taken over after `TAKEOVER_S`). `DELETE` of its
resource ends the session's audio (as `end` on the socket: the rest and the end are stored, the workflow told); a
connection that fails or closes does not (the sender may come back; else the workflow's idle timeout ends it). A
microphone sends silence too, so a session fed over WHIP keeps its timeline going while nobody speaks: the avatar's
idle motion (blinks, sway) is in the video, recorded in the stored audio like the speech."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import av
import numpy as np
import structlog
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError
from sqlalchemy.orm import sessionmaker
from temporalio.client import Client
from temporalio.service import RPCError

from monologue import contracts as c, repo
from monologue.live_audio import TAKEOVER_S, LiveAudioWriter, stored_live_audio
from monologue.plan import AUDIO_RATE, IncrementalPlanner, chunk_sizes, live_frames
from monologue.settings import IceSettings
from monologue.storage import ObjectStore
from node.webrtc.ice import rtc_configuration
from node.webrtc.peers import OfferRefused

log = structlog.get_logger("webrtc")
# aiortc's audio receiver releases an Opus packet only once 4 more have come (its jitter buffer's prefetch): 80 ms of
# speech held back, a cushion against reordering that a conversation pays in latency. One is enough here (a packet is
# known complete when the next one comes); a packet that comes after its successor is dropped, as a lost one is.
AUDIO_PREFETCH = 1
_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # aiortc's own (tests/node/test_webrtc_whip.py checks it is there)
CLAIM_REFRESH_S = 1.0
STOP_WAIT_S = 10.0  # a closing sender's last write (a storage retry) may take this long before the end is stored


class SessionOver(Exception):
    """The sender's session has ended (its workflow refuses the audio): the sender is closed."""


@dataclass
class _Sender:
    """One WHIP sender: its connection, its session's audio writer and the planner that decides when to signal."""

    session_id: str
    holder: str
    pc: RTCPeerConnection
    writer: LiveAudioWriter
    planner: IncrementalPlanner
    options: c.RenderOptions
    signalled: int
    first_audio: bool
    resampler: Any = field(default_factory=lambda: av.AudioResampler(format="s16", layout="mono", rate=AUDIO_RATE))
    track: MediaStreamTrack | None = None
    task: asyncio.Task[None] | None = None
    receiving = False  # its task waits for the next packet (nothing half done: it may be cancelled)
    marks: list[list[float]] = field(default_factory=list)
    claimed_at: float = 0.0


def prompt_audio(pc: RTCPeerConnection) -> None:
    """Let the connection's audio receivers release each packet once the next has come (AUDIO_PREFETCH)."""
    for transceiver in pc.getTransceivers():
        if transceiver.kind == "audio" and hasattr(transceiver.receiver, _JITTER_BUFFER):
            setattr(transceiver.receiver, _JITTER_BUFFER, JitterBuffer(capacity=16, prefetch=AUDIO_PREFETCH))


class WhipIngress:
    """The node's WHIP senders, on its event loop. `count()` says how many connections are open."""

    def __init__(
        self, *, store: ObjectStore, sessions: sessionmaker[Any], temporal: Client, ice: IceSettings | None = None
    ) -> None:
        self._store, self._sessions, self._temporal = store, sessions, temporal
        self._ice = ice or IceSettings()
        self._senders: dict[str, _Sender] = {}

    def count(self, session_id: str | None = None) -> int:
        return sum(1 for s in self._senders.values() if session_id is None or s.session_id == session_id)

    def session_of(self, resource: str) -> str | None:
        sender = self._senders.get(resource)
        return None if sender is None else sender.session_id

    async def answer(self, session_id: str, offer: str) -> tuple[str, str]:
        """(resource id, SDP answer) for a sender's offer; OfferRefused 404/409 for a session that takes no audio."""
        holder = uuid.uuid4().hex
        options, stored = await asyncio.to_thread(self._claim, session_id, holder)
        planner = IncrementalPlanner(**chunk_sizes(options))
        list(planner.advance(live_frames(stored, options, ended=False), final=False))  # the workflow may know these
        pc = RTCPeerConnection(rtc_configuration(self._ice, f"whip-{session_id}"))
        resource = secrets.token_urlsafe(16)
        writer = LiveAudioWriter(self._store, session_id, stored=stored)
        sender = _Sender(session_id, holder, pc, writer, planner, options, stored, stored == 0)
        self._senders[resource] = sender

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "audio":
                sender.track = track

        @pc.on("connectionstatechange")
        async def changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close(resource, end=False)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            if {t.kind for t in pc.getTransceivers()} != {"audio"}:
                raise OfferRefused(400, "a WHIP offer sends audio (Opus) and nothing else")
            prompt_audio(pc)
            await pc.setLocalDescription(await pc.createAnswer())
        except OfferRefused:
            await self.close(resource, end=False)
            raise
        except (ValueError, RuntimeError) as err:  # aiortc's words for an offer it cannot answer
            await self.close(resource, end=False)
            raise OfferRefused(400, f"the SDP offer cannot be answered: {err}") from None
        if sender.track is not None:
            sender.task = asyncio.create_task(self._take(resource, sender, sender.track))
        log.info("WHIP sender joined", session_id=session_id, resource=resource, continues_after=stored)
        return resource, pc.localDescription.sdp

    async def close(self, resource: str, *, end: bool) -> bool:
        """Close a sender; with `end` (its DELETE) the session's audio ends with what it stored. False if none."""
        sender = self._senders.pop(resource, None)
        if sender is None:
            return False
        await sender.pc.close()
        task = sender.task
        if task is not None and task is not asyncio.current_task():
            if sender.receiving:  # waiting for a packet: nothing half stored
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), STOP_WAIT_S)  # else it finishes its write, then stops
        try:
            if end and not sender.writer.ended:
                tail = self._pcm(sender.resampler.resample(None))  # what the resampler still holds
                await asyncio.to_thread(sender.writer.append, tail)
                stored = await asyncio.to_thread(sender.writer.finish)
                with contextlib.suppress(SessionOver):  # stored all the same; the workflow has ended meanwhile
                    await self._progress(sender, stored, ended=True)
        finally:
            await asyncio.to_thread(self._release, sender)
        log.info("WHIP sender left", session_id=sender.session_id, resource=resource, ended=end)
        return True

    async def close_all(self) -> None:
        for resource in list(self._senders):
            await self.close(resource, end=False)

    async def _take(self, resource: str, sender: _Sender, track: MediaStreamTrack) -> None:
        """Store the track's audio as it comes; the sender is closed when the track ends or another takes over."""
        try:
            while resource in self._senders:
                sender.receiving = True
                frame = await track.recv()
                sender.receiving = False
                pcm = self._pcm(sender.resampler.resample(frame))
                if not len(pcm):
                    continue
                if sender.first_audio:
                    sender.first_audio = False
                    await asyncio.to_thread(self._record, sender.session_id, 0)
                stored = await asyncio.to_thread(sender.writer.append, pcm)
                await self._progress(sender, stored, ended=False)
                if not await self._refresh(sender):
                    log.info("WHIP sender taken over", session_id=sender.session_id, resource=resource)
                    break
        except (MediaStreamError, SessionOver):
            pass  # the track ended, or the session did: the connection closes and the sender with it
        await self.close(resource, end=False)

    @staticmethod
    def _pcm(frames: list[av.AudioFrame]) -> np.ndarray:
        parts = [frame.to_ndarray().reshape(-1).astype("<i2", copy=False) for frame in frames]
        return np.concatenate([np.zeros(0, dtype="<i2"), *parts])

    async def _progress(self, sender: _Sender, stored: int, *, ended: bool) -> None:
        """Signal the workflow when the stored audio lets it plan new chunks, or has ended (as the socket does)."""
        now_ms = time.time() * 1000
        if not sender.marks or sender.marks[-1][0] < stored:
            sender.marks.append([float(stored), now_ms])
        frames = live_frames(stored, sender.options, ended=ended)
        unlocked = bool(list(sender.planner.advance(frames, final=ended)))
        if not (unlocked or ended) or (stored == sender.signalled and not ended):
            return
        audio = c.AudioAvailable(samples=stored, ended=ended, marks=sender.marks[-64:])
        handle = self._temporal.get_workflow_handle(c.render_workflow_id(sender.session_id))
        try:
            await handle.signal(c.AUDIO_AVAILABLE, audio)
        except RPCError as err:  # the audio is stored: the next signal (or the idle timeout's `stored_audio`) tells it
            log.warning("WHIP audio signal failed", session_id=sender.session_id, error=err.message)
            if await asyncio.to_thread(self._over, sender.session_id):
                raise SessionOver(sender.session_id) from None  # ended (its lifetime, a cancel): it takes no more
            return
        sender.marks, sender.signalled = [], stored
        await asyncio.to_thread(self._record, sender.session_id, stored)

    def _claim(self, session_id: str, holder: str) -> tuple[c.RenderOptions, int]:
        with self._sessions() as db:
            row = repo.get_session(db, session_id=session_id)
            if row is None or row.kind != c.SessionKind.LIVE:
                raise OfferRefused(404, f"live session {session_id!r} not found")
            if row.status in c.TERMINAL:
                raise OfferRefused(409, f"live session {session_id} is already {row.status}")
            if not repo.claim_audio_socket(db, session_id=session_id, holder=holder, takeover_s=TAKEOVER_S):
                raise OfferRefused(409, f"live session {session_id} already has an audio sender (socket or WHIP)")
            options = c.render_options(row.options)
        stored, ended = stored_live_audio(self._store, session_id)
        if ended:
            self._release_holder(session_id, holder)
            raise OfferRefused(409, f"live session {session_id}'s audio has ended; it takes no more")
        return options, stored

    async def _refresh(self, sender: _Sender) -> bool:
        now = time.monotonic()
        if now - sender.claimed_at < CLAIM_REFRESH_S:
            return True
        sender.claimed_at = now

        def refresh() -> bool:
            with self._sessions() as db:
                return repo.refresh_audio_socket(db, session_id=sender.session_id, holder=sender.holder)

        return await asyncio.to_thread(refresh)

    def _over(self, session_id: str) -> bool:
        with self._sessions() as db:
            row = repo.get_session(db, session_id=session_id)
            return row is None or row.status in c.TERMINAL

    def _record(self, session_id: str, stored: int) -> None:
        with self._sessions() as db:
            repo.record_live_audio(db, session_id=session_id, samples=stored, rate=AUDIO_RATE)

    def _release(self, sender: _Sender) -> None:
        self._release_holder(sender.session_id, sender.holder)

    def _release_holder(self, session_id: str, holder: str) -> None:
        with self._sessions() as db:
            repo.release_audio_socket(db, session_id=session_id, holder=holder)
