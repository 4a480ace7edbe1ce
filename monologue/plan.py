"""The chunk plan: a pure function from a frame count and chunk sizes to chunk specs.

Standard library only (workflow code runs it inside Temporal's sandbox).

The timeline alternates N and I chunks, `N0 I0 N1 I1 N2 …`. N chunks carry the timeline (N0 may be
shorter than the rest, `first_frames`, so the first segment goes out sooner); I chunk k
fills the seam between N(k) and N(k+1) and can only be generated once both exist, so the generation
order is `N0 N1 I0 N2 I1 N3 I2 …`. Every frame belongs to exactly one chunk; the audio of frame f is
samples [f*rate/fps, (f+1)*rate/fps).

Near the end an I chunk shrinks so that at least one frame is left for the N chunk after it; a seam
with no room for an I frame has no I chunk. With a `stride` (the dit family's 4: its VAE makes one latent
of every 4 frames) every size is a multiple of it and a shortened I chunk stays one, so every chunk starts
on a multiple of the stride and only the last chunk can end off it. A `lead` (infinitetalk's 1: the Wan
VAE's first latent stands for the first frame alone) makes the first chunk lead + a multiple of the stride,
so every later boundary falls on lead + a multiple of it. The incremental planner (live sessions, audio still
arriving) emits exactly the chunks the finite plan would, as soon as their frames exist.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from monologue.contracts import Chunk, ChunkKind, Family, LipSync, RenderOptions
from monologue.phone_windows import PHONE_WINDOWS


def frame_count(samples: int, *, rate: int, fps: int) -> int:
    """round(seconds * fps), in integers so no float rounding can move a frame."""
    return (2 * samples * fps + rate) // (2 * rate)


AUDIO_RATE = 16_000  # stored speech: 16 kHz mono s16le (monologue.media normalises everything to it)

# A live session plans a chunk only once the audio this far past its last frame is stored: the context's
# look-ahead (warp: 2 frames, 80 ms at 25 fps) and the AAC encoder's post-roll (about 90 ms) read past the
# chunk, and must read the same samples whenever the chunk is regenerated. The node's LiveAudio refuses
# to read past what is stored, so a family that looks further ahead fails loudly instead of drifting.
LIVE_LOOKAHEAD_S = 0.1


def _visemes(options: RenderOptions) -> bool:
    return options.family is Family.WARP and options.lip_sync is LipSync.VISEMES


def live_frames(samples: int, options: RenderOptions, *, ended: bool, rate: int = AUDIO_RATE) -> int:
    """Frames of a live session that can be generated from `samples` stored audio samples: every frame once
    the audio has ended (as for a render), else those whose audio and look-ahead are stored: 0.1 s, and with
    warp's visemes every phone window their mouth reads (0.3 to 1.3 s past the frame, `monologue.phone_windows`).
    Sessions from before visemes have loudness in their options, so their workflows decide as they always did."""
    if ended:
        return frame_count(samples, rate=rate, fps=options.fps)
    frames = max(0, (samples - int(LIVE_LOOKAHEAD_S * rate)) * options.fps // rate)
    if _visemes(options):
        frames = min(frames, PHONE_WINDOWS.frames_ready(samples, options.fps))
    return frames


def live_samples_needed(end_frame: int, options: RenderOptions, *, rate: int = AUDIO_RATE) -> int:
    """Stored samples at which `live_frames` first reaches `end_frame` (while the audio has not ended)."""
    needed = -(-end_frame * rate // options.fps) + int(LIVE_LOOKAHEAD_S * rate)
    if _visemes(options):
        needed = max(needed, PHONE_WINDOWS.audio_for(end_frame - 1, end_frame, options.fps)[1])
    return needed


def audio_range(first_frame: int, n_frames: int, *, rate: int, fps: int) -> tuple[int, int]:
    """The [start, end) audio samples that frames [first_frame, first_frame + n_frames) cover."""
    return first_frame * rate // fps, (first_frame + n_frames) * rate // fps


def _check_sizes(n_frames: int, i_frames: int, first_frames: int, stride: int, lead: int = 0) -> None:
    if n_frames < 1:
        raise ValueError(f"N chunks need at least one frame, got n_frames={n_frames}")
    if i_frames < 0:
        raise ValueError(f"i_frames must be 0 or more, got {i_frames}")
    if stride < 1:
        raise ValueError(f"the stride must be 1 or more, got {stride}")
    off_grid = {
        name: size
        for name, size, offset in (
            ("n_frames", n_frames, 0),
            ("i_frames", i_frames, 0),
            ("first_frames", first_frames, lead),
        )
        if (size - offset) % stride
    }
    if off_grid:
        first = f" (first_frames: {lead} + a multiple)" if lead else ""
        raise ValueError(f"chunk sizes must be multiples of the stride {stride}{first}, got {off_grid}")


def chunk_sizes(options: Any) -> dict[str, int]:
    """The plan's keyword arguments from a session's options: RenderOptions, the API's model, or the stored
    options of a session row (a mapping)."""
    values = options if isinstance(options, Mapping) else vars(options)
    n_frames = values["chunk_frames"]
    family = Family(str(values.get("family", Family.WARP)))
    return {
        "n_frames": n_frames,
        "i_frames": values["i_frames"],
        # 0 derives the first chunk from chunk_frames, plus the frames a family's first latent stands for alone.
        "first_frames": values.get("first_chunk_frames") or n_frames + family.leading_frames,
        "stride": family.temporal_stride,
        "lead": family.leading_frames,
    }


def plan_timeline(
    total_frames: int,
    *,
    n_frames: int,
    i_frames: int,
    first_frames: int | None = None,
    stride: int = 1,
    lead: int = 0,
) -> list[Chunk]:
    """All chunks in timeline order for a video of `total_frames` frames."""
    if total_frames < 1:
        raise ValueError(f"a plan needs at least one frame, got total_frames={total_frames}")
    planner = IncrementalPlanner(
        n_frames=n_frames, i_frames=i_frames, first_frames=first_frames, stride=stride, lead=lead
    )
    return sorted(planner.advance(total_frames, final=True), key=lambda spec: spec.first_frame)


def plan_chunks(
    total_frames: int,
    *,
    n_frames: int,
    i_frames: int = 0,
    first_frames: int | None = None,
    stride: int = 1,
    lead: int = 0,
) -> list[Chunk]:
    """All chunks in generation order: N0 N1 I0 N2 I1 …"""
    if total_frames < 1:
        raise ValueError(f"a plan needs at least one frame, got total_frames={total_frames}")
    planner = IncrementalPlanner(
        n_frames=n_frames, i_frames=i_frames, first_frames=first_frames, stride=stride, lead=lead
    )
    return list(planner.advance(total_frames, final=True))


def timeline_order(chunks: list[Chunk]) -> list[Chunk]:
    return sorted(chunks, key=lambda spec: spec.first_frame)


class IncrementalPlanner:
    """Plans chunks as frames become available, in generation order.

    `advance(available, final)` returns the chunks that can now be generated: an N chunk once all its
    frames exist (or the audio has ended), and the I chunk before it at the same moment (it needs both
    neighbours). The planner's state is two integers, so a workflow can carry it across continue-as-new.
    """

    def __init__(
        self,
        *,
        n_frames: int,
        i_frames: int,
        first_frames: int | None = None,
        stride: int = 1,
        lead: int = 0,
        next_frame: int = 0,
        next_index: int = 0,
    ) -> None:
        _check_sizes(n_frames, i_frames, first_frames or n_frames + lead, stride, lead)
        self.first_frames = first_frames or n_frames + lead  # N0 may be shorter: a faster first frame
        if self.first_frames < 1:
            raise ValueError(f"the first chunk needs at least one frame, got first_frames={first_frames}")
        self.n_frames = n_frames
        self.i_frames = i_frames
        self.stride = stride  # chunk boundaries (all but the last frame's) fall on multiples of it
        self.next_frame = next_frame  # first frame not yet in any chunk
        self.next_index = next_index  # index of the next N chunk
        self.finished = False

    def advance(self, available: int, *, final: bool) -> Iterator[Chunk]:
        """Chunks whose frames all exist among the first `available` frames; `final` when no more will come."""
        if available < self.next_frame:
            raise ValueError(f"available frames went backwards: {available} < {self.next_frame}")
        while not self.finished:
            remaining = available - self.next_frame
            if self.next_index == 0:
                size = min(self.first_frames, remaining)
                if size < 1 or (size < self.first_frames and not final):
                    return
                yield from self._emit_n(size, final, available)
                continue
            if remaining == 0:
                if final:
                    self.finished = True
                return
            # The seam after N(k-1): an I chunk, then N(k). Both go out together, N first. A shortened seam
            # stays a whole number of strides and leaves at least one frame for the N chunk.
            gap = min(self.i_frames, (remaining - 1) // self.stride * self.stride)
            size = min(self.n_frames, remaining - gap)
            if (gap < self.i_frames or size < self.n_frames) and not final:
                return  # a shortened seam or N chunk is only right once the total is known
            seam_start = self.next_frame
            self.next_frame += gap
            yield from self._emit_n(size, final, available)
            if gap > 0:
                yield Chunk(ChunkKind.I, self.next_index - 2, seam_start, gap)

    def _emit_n(self, size: int, final: bool, available: int) -> Iterator[Chunk]:
        spec = Chunk(ChunkKind.N, self.next_index, self.next_frame, size)
        self.next_frame += size
        self.next_index += 1
        if final and self.next_frame == available:
            self.finished = True
        yield spec
