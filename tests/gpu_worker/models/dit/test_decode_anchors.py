"""The dit decoder primed from the anchors a chunk keeps makes the frames of one decode of the whole latent
stream, bit for bit, once the stream is longer than the decoder's receptive field (`VAEConfig.context_frames`).

Chunks are decoded in generation order N0 N1 I0 N2 I1, each primed on the latents its anchors carry (roles.py):
N(k) on N(k-1)'s tail, so N(k)'s frames are its part of one decode of the N chunks back to back; I(k) on N(k)'s
tail, the latents just before it on screen, so I(k)'s frames are its part of one decode of the timeline. The
super-resolution DiT is left out (the decoder gets the A2V latents at 1/scale of the canvas): it upscales the
context again next to each chunk, so with it in, the seams are continuous but not bit-equal (roles.py), and
only without it can "primed from the anchors" be compared with "decoded whole" exactly. A tail or a decoder
context one latent short of `context_frames` primes the decoder from a different state and fails here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_worker.models.dit import SMOKE_SEED, build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.roles import ChunkLatents
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.module import Role
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.stages import AudioToVideoStage, ChunkState, ContextStage, DecodePublishStage
from monologue.contracts import ChunkKind
from monologue.plan import plan_chunks

STRIDE = TINY.vae.temporal_stride
N_FRAMES, I_FRAMES = 24, 8  # 6 and 2 latents: every N chunk is longer than the decoder's context (4 in TINY)


class KeepLowResolution:
    """The super-resolution stage's place, without upscaling: the decoder gets the A2V latents and their decoder
    context as the anchors gave them, and the test keeps each chunk's latents."""

    name = "super_resolution"
    role = Role.SUPER_RESOLUTION

    def __init__(self) -> None:
        self.latents: dict[str, torch.Tensor] = {}  # chunk name → its own latents (C, T, h, w)

    def run(self, session: Session, state: ChunkState) -> None:
        if state.generated is None:
            raise RuntimeError("the decoder test's stage needs audio_to_video to run first")
        self.latents[state.chunk.name] = state.generated.latents.frames.clone()
        state.upscaled, state.generated = state.generated.latents, None


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(frames.copy())


def _low_resolution(session: Session) -> None:
    """Frames at the A2V latents' size: the canvas / the SR scale, uncropped (the decode stage checks the size)."""
    canvas = session.reference["canvas_size"] // TINY.sr.scale
    session.reference = {**session.reference, "canvas_size": canvas, "frame_size": canvas.copy()}


@pytest.fixture(scope="module")
def rendered() -> tuple[Pipeline, Session, KeepLowResolution, list[ChunkRequest], dict[str, np.ndarray]]:
    """N0 N1 I0 N2 I1 through the pipeline: (pipeline, session, kept latents, the chunks, each chunk's frames)."""
    pipeline = Pipeline(
        build_family(Weights(TINY, seed=SMOKE_SEED)),
        stages=(ContextStage, AudioToVideoStage, KeepLowResolution, DecodePublishStage),
    )
    kept = pipeline.stages[2]
    assert isinstance(kept, KeepLowResolution)
    rng = np.random.default_rng(4)
    portrait = (rng.random((64, 96, 3)) * 255).astype(np.uint8)
    t = np.arange(16_000 * 4) / 16_000
    speech = ArrayAudio((0.3 * np.sin(2 * np.pi * 180 * t) * (t % 0.4 < 0.25)).astype(np.float32))
    session = pipeline.start_session(portrait, OutputSpec(fps=25), speech)
    _low_resolution(session)
    requests = [ChunkRequest(spec, 5) for spec in plan_chunks(88, n_frames=N_FRAMES, i_frames=I_FRAMES, stride=STRIDE)]
    frames = {}
    for request in requests:
        sink = ListSink()
        pipeline.run_chunk(session, request, sink)
        frames[request.name] = np.concatenate(sink.frames)
    return pipeline, session, kept, requests, frames


def _whole(pipeline: Pipeline, session: Session, latents: list[torch.Tensor]) -> np.ndarray:
    """One decode of `latents` back to back from the video's start (no context), by the pipeline's decoder."""
    return pipeline.models.decoder.decode(session.reference, ChunkLatents(torch.cat(latents, dim=1), None))


def test_chunks_primed_from_their_anchors_decode_as_the_whole_stream_does(rendered: tuple) -> None:  # type: ignore[type-arg]
    pipeline, session, kept, requests, frames = rendered
    assert [(r.name, r.n_frames) for r in requests] == [("N0", 24), ("N1", 24), ("I0", 8), ("N2", 24), ("I1", 8)]
    assert TINY.vae.context_frames < N_FRAMES // STRIDE  # each N chunk reaches the context limit and passes it
    n_chunks = [r for r in requests if r.kind is ChunkKind.N]
    n_stream = _whole(pipeline, session, [kept.latents[r.name] for r in n_chunks])
    timeline = _whole(pipeline, session, [kept.latents[r.name] for r in sorted(requests, key=lambda r: r.first_frame)])
    assert n_stream.shape[0] == 3 * N_FRAMES and timeline.shape[0] == 88
    for position, request in enumerate(n_chunks):  # N(k) continues N(k-1): its part of the N stream
        start = position * N_FRAMES
        assert np.array_equal(frames[request.name], n_stream[start : start + N_FRAMES]), request.name
    for request in requests:  # I(k) continues N(k), just before it on screen: its part of the timeline
        if request.kind is ChunkKind.I:
            shown = timeline[request.first_frame : request.end_frame]
            assert np.array_equal(frames[request.name], shown), request.name
    assert frames["N0"].std() > 1.0  # the frames move: equal frames are not equal blanks


def test_a_chunk_decoded_without_its_context_differs_from_the_whole_stream(rendered: tuple) -> None:  # type: ignore[type-arg]
    """The comparison above can fail: at these sizes the decoder's context changes N1's first frames."""
    pipeline, session, kept, _, frames = rendered
    fresh = _whole(pipeline, session, [kept.latents["N1"]])
    assert not np.array_equal(fresh[:STRIDE], frames["N1"][:STRIDE])
