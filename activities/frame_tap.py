"""Where a live WebRTC session's frames go besides its segment: the node's media hub (node/webrtc/hub.py), which
sends them to the session's viewers as each chunk is made. Activities know it only as this protocol (they stand
below the node process that wires it)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gpu_worker.pipeline.types import AudioSource, FrameSink


class FrameTap(Protocol):
    def session_started(self, session_id: str, fps: int) -> None:
        """The session is on this node now (its init ran): what serves its viewers may get ready before its frames."""

    def chunk_made(self, session_id: str, first_frame: int, frames: np.ndarray, audio: np.ndarray, fps: int) -> None:
        """A chunk's frames (T, H, W, 3) uint8 and its speech (16 kHz float32 from `first_frame`'s first sample)."""

    def session_ended(self, session_id: str) -> None: ...


class TeeSink:
    """A FrameSink that keeps a copy of the frames (they are valid only during the call) and writes them to `sink`
    on `release`: the node hands a chunk to its viewers first and encodes its segment after (a viewer's frames do
    not wait for the segment's ~15-30 ms of H.264)."""

    def __init__(self, sink: FrameSink) -> None:
        self._sink = sink
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(np.array(frames, copy=True))

    def release(self) -> None:
        for frames in self.frames:
            self._sink.write(frames)


def chunk_speech(audio: AudioSource, first_frame: int, n_frames: int, fps: int) -> np.ndarray:
    """The speech of frames [first_frame, first_frame + n_frames): never past what a live session has stored."""
    start, end = first_frame * audio.rate // fps, (first_frame + n_frames) * audio.rate // fps
    available = getattr(audio, "available", None)
    if audio.total_samples is None and available is not None:
        end = max(start, min(end, available))
    return audio.read(start, end)
