"""The four stages of a chunk, one verb each, in order. A stage reads and writes only its fields of
`ChunkState` and calls the family's modules; the session (reference, anchors, sink) is passed in."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gpu_worker.pipeline.module import A2VOutput, Role
from gpu_worker.pipeline.progress import Progress, no_progress
from gpu_worker.pipeline.types import AudioWindow, ChunkRequest, FrameSink, InterruptedAudio
from monologue.contracts import ChunkKind

if TYPE_CHECKING:
    from gpu_worker.pipeline.pipeline import Session


@dataclass
class ChunkState:
    """What one chunk carries from stage to stage; dropped when the chunk returns."""

    chunk: ChunkRequest
    rng: np.random.Generator
    sink: FrameSink
    progress: Progress = no_progress  # told each step of a long stage (the pipeline reports the stages)
    window: AudioWindow | None = None
    context: dict[str, Any] | None = None
    generated: A2VOutput | None = None
    upscaled: Any = None
    frame_hashes: list[str] = field(default_factory=list)


class Stage(Protocol):
    name: str
    role: Role  # the family module it runs (the pipeline's switch residency gives it the device)

    def run(self, session: Session, state: ChunkState) -> None: ...


class ContextStage:
    """Audio slice (with the family's margins) → features and noise."""

    name = "context"
    role = Role.CONTEXT

    def run(self, session: Session, state: ChunkState) -> None:
        module = session.models.context
        chunk, fps, audio = state.chunk, session.output.fps, session.audio
        start, end = module.audio_range(chunk, fps, audio.rate)
        silenced = audio.silenced(start, end) if isinstance(audio, InterruptedAudio) else ()
        state.window = AudioWindow(
            audio.read(start, end),
            start,
            audio.rate,
            fps,
            prepared=session.prepared,
            silenced=silenced,
            speech=session.speech,
        )
        state.context = module.context(state.window, chunk, state.rng)


class AudioToVideoStage:
    """Context + anchors → the chunk's motion/latents, and the anchors it leaves behind."""

    name = "audio_to_video"
    role = Role.AUDIO_TO_VIDEO

    def run(self, session: Session, state: ChunkState) -> None:
        if state.context is None:
            raise RuntimeError("audio_to_video needs the context stage to run first")
        model, chunk, anchors = session.models.audio_to_video, state.chunk, session.anchors
        progress = state.progress

        def step(done: int, steps: int) -> None:  # a diffusion family's denoising steps
            progress(self.name, done, steps)

        read = anchors.read(chunk.chunk)  # N(k): N(k-1)'s tail (none for N0); I(k): its left and right
        if chunk.kind is ChunkKind.N:
            previous = read[0] if read else None
            state.generated = model.generate_n(
                session.reference, state.context, previous, chunk, state.rng, progress=step
            )
            anchors.put_left(chunk.chunk, state.generated)
        else:
            left, right = read
            state.generated = model.generate_i(
                session.reference, state.context, left, right, chunk, state.rng, progress=step
            )
        state.context = None  # features and noise are not needed past this point


class SuperResolutionStage:
    """Low-resolution latents → output resolution."""

    name = "super_resolution"
    role = Role.SUPER_RESOLUTION

    def run(self, session: Session, state: ChunkState) -> None:
        if state.generated is None:
            raise RuntimeError("super_resolution needs audio_to_video to run first")
        state.upscaled = session.models.super_resolution.upscale(session.reference, state.generated.latents)
        state.generated = None


class DecodePublishStage:
    """Latents → RGB frames (captions burned in, if the session asks) → per-frame SHA-256 → the sink (the segment
    encoder)."""

    name = "decode_publish"
    role = Role.DECODER

    def run(self, session: Session, state: ChunkState) -> None:
        frames = session.models.decoder.decode(session.reference, state.upscaled)  # (T, H, W, 3) uint8
        state.upscaled = None
        expected = (state.chunk.n_frames, session.frame_height, session.frame_width, 3)
        if frames.shape != expected or frames.dtype != np.uint8:
            raise RuntimeError(
                f"{session.models.name} decoded {frames.shape} {frames.dtype}, expected {expected} uint8"
            )
        if session.captions is not None:  # the frames as published: hashed with their captions
            frames = session.captions.burn(frames, state.chunk.first_frame)
        state.frame_hashes = [hashlib.sha256(frame.tobytes()).hexdigest() for frame in frames]
        state.sink.write(frames)


DEFAULT_STAGES: tuple[type[Stage], ...] = (ContextStage, AudioToVideoStage, SuperResolutionStage, DecodePublishStage)
