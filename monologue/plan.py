"""The chunk plan: a pure function from a frame count and chunk sizes to chunk specs.

Standard library only (workflow code runs it inside Temporal's sandbox). Every frame belongs to
exactly one chunk; the audio of frame f is samples [f*rate/fps, (f+1)*rate/fps)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChunkSpec:
    kind: str  # "N": carries the timeline
    index: int
    first_frame: int
    n_frames: int

    @property
    def end_frame(self) -> int:
        return self.first_frame + self.n_frames


def frame_count(samples: int, *, rate: int, fps: int) -> int:
    """round(seconds * fps), in integers so no float rounding can move a frame."""
    return (2 * samples * fps + rate) // (2 * rate)


def audio_range(first_frame: int, n_frames: int, *, rate: int, fps: int) -> tuple[int, int]:
    """The [start, end) audio samples that frames [first_frame, first_frame + n_frames) cover."""
    return first_frame * rate // fps, (first_frame + n_frames) * rate // fps


def plan_chunks(total_frames: int, *, chunk_frames: int) -> list[ChunkSpec]:
    """N chunks of `chunk_frames` frames; the last one may be shorter."""
    if total_frames < 1:
        raise ValueError(f"a plan needs at least one frame, got total_frames={total_frames}")
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be positive, got {chunk_frames}")
    return [
        ChunkSpec("N", index, first, min(chunk_frames, total_frames - first))
        for index, first in enumerate(range(0, total_frames, chunk_frames))
    ]
