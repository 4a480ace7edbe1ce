"""The small types every stage and family shares: what a chunk is, where its audio comes from, where its
frames go, and the output format. numpy only (a torch family converts at its own edges)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from monologue.contracts import Chunk, ChunkKind, LipSync, RenderOptions, Resolution, SamplingPreset

# The options' defaults, read from their one definition: the engine declares none of its own.
_DEFAULTS = RenderOptions()
# Short and long side in pixels for each named resolution; SOURCE keeps the portrait's own size.
_SHORT_SIDE = {Resolution.SQUARE_512: 512, Resolution.HD_720: 720, Resolution.HD_1080: 1080}
_LONG_SIDE = {Resolution.SQUARE_512: 512, Resolution.HD_720: 1280, Resolution.HD_1080: 1920}


@dataclass(frozen=True)
class OutputSpec:
    """The session options that shape the output (`RenderOptions`' fps, resolution or width and height, and
    preview; the engine's own configuration lives with its modules). Preview renders fast for iterating on script
    and motion: half the resolution (and fewer sampling steps in diffusion families), the same motion for the
    same seed."""

    fps: int = _DEFAULTS.fps
    resolution: Resolution = _DEFAULTS.resolution
    width: int | None = _DEFAULTS.width
    height: int | None = _DEFAULTS.height
    preview: bool = _DEFAULTS.preview

    def __post_init__(self) -> None:
        object.__setattr__(self, "resolution", Resolution(self.resolution))  # ValueError naming any other size

    @classmethod
    def of(cls, options: RenderOptions) -> OutputSpec:
        """A session's output spec, from its options."""
        return cls(
            fps=options.fps,
            resolution=options.resolution,
            width=options.width,
            height=options.height,
            preview=options.preview,
        )

    @property
    def size(self) -> tuple[int, int] | None:
        """(width, height) the session asked for, or None: a named resolution (or the portrait's own size)."""
        return None if self.width is None or self.height is None else (self.width, self.height)


def frame_size(portrait_width: int, portrait_height: int, output: OutputSpec) -> tuple[int, int]:
    """(width, height) of the output frames, both even.

    A width and height asked for are the size; otherwise "source" keeps the portrait's size (rounded down to
    even); "512" is 512x512; "720p" and "1080p" are 16:9 frames, landscape unless the portrait is taller than
    wide. Preview halves each side, rounded down to even (482x642 previews at 240x320).
    """
    if output.size is not None:
        width, height = output.size
    elif output.resolution is Resolution.SOURCE:
        width, height = portrait_width, portrait_height
    elif output.resolution is Resolution.SQUARE_512:
        width = height = 512
    elif portrait_height > portrait_width:
        width, height = _SHORT_SIDE[output.resolution], _LONG_SIDE[output.resolution]
    else:
        width, height = _LONG_SIDE[output.resolution], _SHORT_SIDE[output.resolution]
    if output.preview:
        width, height = width // 2, height // 2
    width, height = width - width % 2, height - height % 2
    if width < 16 or height < 16:
        raise ValueError(
            f"output frames of {width}x{height} are too small (portrait {portrait_width}x"
            f"{portrait_height}, resolution {output.resolution.value!r}, preview={output.preview})"
        )
    return width, height


@dataclass(frozen=True)
class ChunkRequest:
    """A chunk to make: the timeline's `Chunk` (the one shape from the plan to here) and what the session adds
    to every chunk: its seed, its optional text/scene prompt, its denoising steps (0: the family's own) and
    preset, and how the lips move (warp). These are `RenderOptions`' fields, with its defaults (`of` takes them
    from a session's)."""

    chunk: Chunk
    seed: int = _DEFAULTS.seed
    prompt: str = _DEFAULTS.prompt
    sampling_steps: int = _DEFAULTS.sampling_steps
    sampling_preset: SamplingPreset = _DEFAULTS.sampling_preset
    lip_sync: LipSync = _DEFAULTS.lip_sync

    @classmethod
    def of(cls, chunk: Chunk, options: RenderOptions) -> ChunkRequest:
        """`chunk` of a session with these options."""
        return cls(
            chunk,
            seed=options.seed,
            prompt=options.prompt,
            sampling_steps=options.sampling_steps,
            sampling_preset=options.sampling_preset,
            lip_sync=options.lip_sync,
        )

    @property
    def kind(self) -> ChunkKind:
        return self.chunk.kind

    @property
    def index(self) -> int:
        return self.chunk.index

    @property
    def first_frame(self) -> int:
        return self.chunk.first_frame

    @property
    def n_frames(self) -> int:
        return self.chunk.n_frames

    @property
    def end_frame(self) -> int:
        return self.chunk.end_frame

    @property
    def name(self) -> str:
        return self.chunk.name


def chunk_rng(seed: int, kind: str, index: int) -> np.random.Generator:
    """Randomness for one chunk, from (session seed, chunk kind, chunk index) alone, never from a shared
    stream: a chunk regenerated after a resume, or on another node, draws the same numbers."""
    digest = hashlib.sha256(f"{seed}:{kind}:{index}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))


class AudioSource(Protocol):
    """The session's speech: 16 kHz mono float32, read by sample range (zeros outside the audio)."""

    rate: int
    total_samples: int | None  # None while a live session's audio is still arriving

    def read(self, start: int, end: int) -> np.ndarray: ...


@runtime_checkable
class InterruptedAudio(Protocol):
    """An AudioSource whose parts an interrupt dropped (a live session's: `monologue.live_audio.LiveAudio`); they read
    as silence, and a family may treat them as more than that (warp closes the mouth at once)."""

    def silenced(self, start: int, end: int) -> tuple[tuple[int, int], ...]: ...


class ArrayAudio:
    """An AudioSource over an array in memory (tests, benchmarks, short renders)."""

    def __init__(self, samples: np.ndarray, rate: int = 16_000) -> None:
        self.samples = np.ascontiguousarray(samples, dtype=np.float32)
        self.rate = rate
        self.total_samples: int | None = len(self.samples)

    def read(self, start: int, end: int) -> np.ndarray:
        out = np.zeros(max(0, end - start), dtype=np.float32)
        lo, hi = max(start, 0), min(end, len(self.samples))
        if hi > lo:
            out[lo - start : hi - start] = self.samples[lo:hi]
        return out


class SpeechFeatures(Protocol):
    """Per-frame features of a render's whole speech (`ContextGenerator.encode_speech`: computed once when the session
    starts, stored, and read back by a node that resumes it), read by frame range. Rows past either end read as the
    nearest row, the speech's first or last frame's (as InfiniteTalk clamps its indices to its audio embedding)."""

    frames: int  # rows in the whole encoding

    def read(self, start: int, end: int) -> np.ndarray: ...  # rows [start, end), each index clamped to the encoding


class ArrayFeatures:
    """SpeechFeatures held in memory: the encoding just computed, or (from `start`) the part of one a chunk reads."""

    def __init__(self, rows: np.ndarray, start: int = 0, frames: int | None = None) -> None:
        self.rows = np.ascontiguousarray(rows)
        self.start = start
        self.frames = len(rows) if frames is None else frames

    def read(self, start: int, end: int) -> np.ndarray:
        indices = np.clip(np.arange(start, end), 0, self.frames - 1) - self.start
        if len(indices) and (indices.min() < 0 or indices.max() >= len(self.rows)):
            raise LookupError(
                f"feature rows [{start}, {end}) read, but rows [{self.start}, "
                f"{self.start + len(self.rows)}) of {self.frames} are held"
            )
        return self.rows[indices]


@dataclass(frozen=True)
class AudioWindow:
    """The audio a chunk's context needs: its own frames plus the family's margins either side."""

    samples: np.ndarray  # (S,) float32
    start_sample: int  # absolute index of samples[0]; may be negative (zeros before the audio starts)
    rate: int
    fps: int
    # What the context module prepared from the whole speech when the session started (`ContextGenerator.prepare`,
    # e.g. the warp family's alignment to a transcript); None when it prepared nothing.
    prepared: Any = None
    silenced: tuple[tuple[int, int], ...] = ()  # absolute sample ranges an interrupt dropped (`InterruptedAudio`)
    # A render's speech encoded whole when the session started (`ContextGenerator.encode_speech`); None for a live
    # session and for a family that encodes nothing ahead.
    speech: SpeechFeatures | None = None

    def frame_start(self, frame: int) -> int:
        """Index into `samples` where absolute frame `frame` begins."""
        return frame * self.rate // self.fps - self.start_sample


class FrameSink(Protocol):
    """Where decoded frames go (an encoder writing a segment, or a collector in tests).

    The frames are valid only during the call (models may reuse their buffers): copy what you keep."""

    def write(self, frames: np.ndarray) -> None: ...  # (T, H, W, 3) uint8
