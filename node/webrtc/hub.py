"""The per-session media buffer a live session's viewers read from: each chunk's frames and speech as the node makes
them (activities/node.py hands them over through `MediaHub.chunk_made`, on an activity thread), released to viewers
in display order (generation order is `N0 N1 I0 N2 …`: N1's frames wait for I0's).

It keeps only the last `KEEP_S` seconds of released frames: a viewer joins at the live edge, never at the start. It
never blocks a chunk: the hand-over is a copy and a `call_soon_threadsafe`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

KEEP_S = 2.0  # released frames kept for viewers that lag a little (a 512² frame is 768 KiB: 50 frames, 38 MiB)


@dataclass
class SessionMedia:
    """One session's frames (RGB, (H, W, 3) uint8) and each frame's speech (16 kHz int16), by frame number."""

    fps: int
    rate: int
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    audio: dict[int, np.ndarray] = field(default_factory=dict)
    first: int | None = None  # the first frame this node released (a moved session starts past 0)
    ready_until: int = 0  # frames [first, ready_until) are released, in display order
    ended: bool = False
    largest_chunk: int = 1  # frames of the largest chunk handed over: how far a viewer on time may trail the edge
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    touched: int = 0  # the hub's count when a chunk last came: the session that moved away stops coming
    announced: bool = False  # the hub's on_start listeners were told of it (at its init, or else its first chunk)

    def add(self, first_frame: int, frames: np.ndarray, audio: np.ndarray) -> None:
        if self.first is None:
            self.first = self.ready_until = first_frame
        self.largest_chunk = max(self.largest_chunk, len(frames))
        bounds = [self.sample(first_frame + i) - self.sample(first_frame) for i in range(len(frames) + 1)]
        for offset, frame in enumerate(frames):
            number = first_frame + offset
            if number >= self.ready_until:  # frames before what this node released come too late to show
                self.frames[number] = frame
                self.audio[number] = audio[bounds[offset] : bounds[offset + 1]]
        while self.ready_until in self.frames:
            self.ready_until += 1
        for number in [n for n in self.frames if n < self.ready_until - KEEP_S * self.fps]:
            del self.frames[number], self.audio[number]
        self.changed.set()
        self.changed = asyncio.Event()

    def sample(self, frame: int) -> int:
        """The first speech sample of `frame` (monologue/plan.py: frame f's audio is [f*rate/fps, (f+1)*rate/fps))."""
        return frame * self.rate // self.fps

    async def wait_for(self, until: int) -> bool:
        """Wait until frames up to `until` (excluded) are released; False once the session's media has ended."""
        while self.ready_until < until:
            if self.ended:
                return False
            await self.changed.wait()
        return True

    def oldest(self) -> int:
        """The oldest frame still kept."""
        return min(self.frames, default=self.ready_until)


class MediaHub:
    """The node's live sessions' media, owned by its event loop; `chunk_made` may be called from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, max_sessions: int = 8) -> None:
        """`max_sessions`: buffers kept at once (a few more than the node's slots). A session that moved to another
        node sends no `session_ended` here; when a new session needs room, the buffer whose last chunk is oldest
        ends (its viewers reconnect through the API to the session's new node)."""
        self._loop = loop
        self._max_sessions = max(1, max_sessions)
        self._chunks = 0
        self._sessions: dict[str, SessionMedia] = {}
        # Told on the loop: a session is here (its init ran, or else its first chunk came); its media ended (True: the
        # session finished, False: it stopped coming here, e.g. it moved to another node).
        self.on_start: list[Callable[[str, SessionMedia], None]] = []
        self.on_end: list[Callable[[str, bool], None]] = []

    def session(self, session_id: str, *, fps: int, rate: int) -> SessionMedia:
        """The session's buffer (made empty if the node has none yet: a viewer may come before the first chunk)."""
        media = self._sessions.get(session_id)
        if media is None or media.fps != fps:
            if media is None and len(self._sessions) >= self._max_sessions:
                self._end(min(self._sessions, key=lambda other: self._sessions[other].touched), False)
            media = self._sessions[session_id] = SessionMedia(fps=fps, rate=rate, touched=self._chunks)
        return media

    def chunk_made(self, session_id: str, first_frame: int, frames: np.ndarray, audio: np.ndarray, fps: int) -> None:
        """A chunk's frames (T, H, W, 3) and its speech (16 kHz float32, from frame `first_frame`'s first sample)."""
        pcm = (np.clip(audio, -1.0, 1.0) * 32767).astype(np.int16)
        copied = np.array(frames, copy=True)
        self._loop.call_soon_threadsafe(self._add, session_id, first_frame, copied, pcm, fps)

    def session_started(self, session_id: str, fps: int) -> None:
        """The session's init ran on this node: its buffer is made and the on_start listeners told (an SFU mountpoint
        is ready before the first chunk, as a direct viewer's connection may be)."""
        self._loop.call_soon_threadsafe(self._begin, session_id, fps)

    def session_ended(self, session_id: str) -> None:
        """The session completed or moved away: its viewers' tracks end."""
        self._loop.call_soon_threadsafe(self._end, session_id, True)

    def _add(self, session_id: str, first_frame: int, frames: np.ndarray, pcm: np.ndarray, fps: int) -> None:
        self._chunks += 1
        media = self.session(session_id, fps=fps, rate=16_000)
        media.touched = self._chunks
        media.add(first_frame, frames, pcm)
        self._announce(session_id, media)

    def _begin(self, session_id: str, fps: int) -> None:
        self._announce(session_id, self.session(session_id, fps=fps, rate=16_000))

    def _announce(self, session_id: str, media: SessionMedia) -> None:
        if not media.announced:
            media.announced = True
            for listener in self.on_start:
                listener(session_id, media)

    def _end(self, session_id: str, finished: bool) -> None:
        media = self._sessions.pop(session_id, None)
        if media is not None:
            media.ended = True
            media.changed.set()
        for listener in self.on_end:
            listener(session_id, finished)
