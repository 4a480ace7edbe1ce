"""A viewer's two tracks over a session's `SessionMedia`: video frames and 20 ms of Opus-bound speech, both on the
session's frame timeline, so they stay in sync whatever the generation speed (a frame is sent only once made,
never before its time on the viewer's clock)."""

from __future__ import annotations

import asyncio
import fractions

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from node.webrtc.hub import SessionMedia

VIDEO_CLOCK = 90_000
OPUS_RATE = 48_000
PACKET_S = 0.02  # 20 ms audio frames, Opus's usual
CATCH_UP_SLACK = 2  # frames past a chunk a viewer may trail the edge before it skips ahead


class ViewerClock:
    """Where a viewer joined (the live edge: the newest released frame) and when, shared by its two tracks.

    A viewer that falls behind (the session's chunks came late, then caught up) skips ahead, video and speech
    together, to within a chunk of the edge: in a conversation late frames are worth less than no frames, and
    a clock that only ever plays at real time would keep every delay it met for the rest of the session."""

    def __init__(self, media: SessionMedia) -> None:
        self.media = media
        self.start_frame: int | None = None
        self.start_time = 0.0
        self.skipped_frames = 0

    def catch_up(self, number: int) -> int:
        """The frame to send instead of `number`: later by what the viewer trails the edge past one chunk."""
        behind = self.media.ready_until - 1 - number - (self.media.largest_chunk + CATCH_UP_SLACK)
        if behind <= 0:
            return number
        self.start_time -= behind / self.media.fps
        self.skipped_frames += behind
        return number + behind

    async def start(self) -> int:
        if self.start_frame is None:
            if not await self.media.wait_for((self.media.first or 0) + 1):
                raise MediaStreamError("the session's media ended")
            self.start_frame = max(self.media.ready_until - 1, self.media.oldest())
            self.start_time = asyncio.get_running_loop().time()
        return self.start_frame

    async def at(self, media_s: float) -> None:
        """Sleep until `media_s` past the viewer's start."""
        delay = self.start_time + media_s - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)


class SessionVideoTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, clock: ViewerClock) -> None:
        super().__init__()
        self._clock = clock
        self._sent = 0

    async def recv(self) -> av.VideoFrame:
        start, media = await self._clock.start(), self._clock.media
        number = self._clock.catch_up(max(start + self._sent, media.oldest()))
        if not await media.wait_for(number + 1):
            self.stop()
            raise MediaStreamError("the session's media ended")
        self._sent = number - start + 1
        await self._clock.at((number - start) / media.fps)
        frame = av.VideoFrame.from_ndarray(media.frames[number], format="rgb24")
        frame.pts = (number - start) * VIDEO_CLOCK // media.fps
        frame.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        return frame


class SessionAudioTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, clock: ViewerClock) -> None:
        super().__init__()
        self._clock = clock
        self._packets = 0
        self._skipped = 0  # packets skipped with the clock's video

    async def recv(self) -> av.AudioFrame:
        start, media = await self._clock.start(), self._clock.media
        per_packet = int(media.rate * PACKET_S)
        skip = round(self._clock.skipped_frames / media.fps / PACKET_S) - self._skipped
        self._packets, self._skipped = self._packets + skip, self._skipped + skip
        first = media.sample(start) + self._packets * per_packet
        end = first + per_packet
        last_frame = (end * media.fps + media.rate - 1) // media.rate  # frames covering [first, end)
        if not await media.wait_for(last_frame):
            self.stop()
            raise MediaStreamError("the session's media ended")
        await self._clock.at(self._packets * PACKET_S)
        pcm = _speech(media, first, end)
        upsampled = np.interp(np.arange(len(pcm) * 3) / 3, np.arange(len(pcm)), pcm).astype(np.int16)
        frame = av.AudioFrame.from_ndarray(upsampled.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OPUS_RATE
        frame.pts = self._packets * len(upsampled)
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        self._packets += 1
        return frame


def _speech(media: SessionMedia, first: int, end: int) -> np.ndarray:
    """16 kHz samples [first, end) from the frames' speech (silence where a frame is no longer kept)."""
    out = np.zeros(end - first, dtype=np.float64)
    frame = first * media.fps // media.rate
    while media.sample(frame) < end:
        start = media.sample(frame)
        piece = media.audio.get(frame)
        if piece is not None:
            lo, hi = max(start, first), min(start + len(piece), end)
            if hi > lo:
                out[lo - first : hi - first] = piece[lo - start : hi - start]
        frame += 1
    return out
