"""The infinitetalk decoder primed from the anchors a chunk keeps makes the frames of one decode of the whole latent
stream, bit for bit, once the stream is longer than the Wan decoder's receptive field (`decoder_context`, 38). The
decode stream is the N chunks back to back (roles.py): N(k+1) continues N(k)'s stream, primed on N(k)'s tail
`context`, and I(k) branches off it after N(k), primed on the same anchor. So N(k)'s frames are its part of one
decode of N0 N1 N2 …, and I(k)'s are the end of one decode of N0 … N(k) I(k). N0 is 161 frames (41 latents), so N1,
I0 and N2 are each primed where the stream is already longer than 38 latents. The super-resolution stage of this
family passes latents through; the test's stage in its place does the same and keeps them. A tail anchor one latent
short of `decoder_context` primes from a different cache and fails here (the decoder is exact with 38 and not with
37: test_vae.py). A tail's motion latents are the encoding of that one stream's last motion frames. The tiny
preset's weights on a 32x32 canvas, as a preview (16x16 frames, one sampling step): the Wan VAE is the cost here (up
to a second a latent at 64x64 on a busy 2-core machine), and the property is one of time, not of size."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.infinitetalk import build_family, roles
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.vae import DecodeStream, encode
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.module import Role
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.stages import AudioToVideoStage, ChunkState, ContextStage, DecodePublishStage
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from monologue.contracts import Family, RenderOptions
from monologue.plan import chunk_sizes, plan_chunks

SMALL = replace(TINY, buckets_480={1.00: (32, 32)})  # the same weights; only the canvas differs
OPTIONS = RenderOptions(
    family=Family.INFINITETALK, chunk_frames=16, i_frames=4, first_chunk_frames=161, prompt="a calm studio"
)


class KeepLatents:
    """The super-resolution stage's place: passes the latents through as the family's PassThrough does, and keeps
    each chunk's own latents for the test."""

    name = "super_resolution"
    role = Role.SUPER_RESOLUTION

    def __init__(self) -> None:
        self.latents: dict[str, torch.Tensor] = {}  # chunk name → its own latents (z, T, h, w)

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


def _decoded(latents: torch.Tensor, stream: DecodeStream) -> torch.Tensor:
    """`latents` (z, T, h, w) decoded on `stream`: frames (3, F, H, W) in [-1, 1]."""
    with torch.no_grad():
        return stream.decode(latents[None])[0]


def test_chunks_primed_from_their_anchors_decode_as_the_whole_stream_does(
    tiny_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compared before the uint8 rounding: a cache primed on 37 latents is off by less than a grey level here."""
    decoded: list[torch.Tensor] = []  # each decode call's frames (3, F, H, W) in [-1, 1], in chunk order

    def kept_pixels(frames: torch.Tensor) -> torch.Tensor:
        decoded.append(frames.clone())
        return to_pixels(frames)

    to_pixels = roles._pixels
    monkeypatch.setattr(roles, "_pixels", kept_pixels)
    pipeline = Pipeline(
        build_family(InfiniteTalkWeights(SMALL, Locations.under(tiny_weights))),
        stages=(ContextStage, AudioToVideoStage, KeepLatents, DecodePublishStage),
    )
    kept = pipeline.stages[2]
    assert isinstance(kept, KeepLatents)
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    t = np.arange(16_000 * 8) / 16_000
    audio = ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3)).astype(np.float32))
    session = pipeline.start_session(portrait, OutputSpec(fps=25, preview=True), audio)
    plan = plan_chunks(205, **chunk_sizes(OPTIONS))[:4]
    requests = [ChunkRequest(chunk, seed=3, prompt=OPTIONS.prompt) for chunk in plan]
    sink = ListSink()
    for request in requests:
        pipeline.run_chunk(session, request, sink)
    assert [(r.name, r.n_frames) for r in requests] == [("N0", 161), ("N1", 16), ("I0", 4), ("N2", 16)]
    assert kept.latents["N0"].shape[1] > TINY.stream.decoder_context  # N1, I0, N2 are primed past the limit
    states = pipeline.models.decoder.states  # type: ignore[attr-defined]
    assert (states.hits, states.misses) == (3, 0)  # N1, I0, N2 start from the state N0's / N1's decode left
    frames = {request.name: made[:, : request.n_frames] for request, made in zip(requests, decoded, strict=True)}

    # One stream from the video's start, N0 N1 N2, and a copy of it after N0 for I0 (a DecodeStream decodes in
    # pieces exactly as diffusers decodes whole: test_vae.py).
    whole = DecodeStream(pipeline.models.decoder.models["vae"])  # type: ignore[attr-defined]
    assert torch.equal(frames["N0"], _decoded(kept.latents["N0"], whole))
    branch = copy.deepcopy(whole)
    assert torch.equal(frames["I0"], _decoded(kept.latents["I0"], branch))
    for name in ("N1", "N2"):
        assert torch.equal(frames[name], _decoded(kept.latents[name], whole)), name
    assert sink.frames[1].std() > 1.0  # N1's published frames move: equal frames are not equal blanks

    # N2's tail `motion`, which the decoder stage adds: the stream's last motion frames, encoded again.
    motion = TINY.stream.motion_frames
    with torch.no_grad():
        expected = encode(whole.vae, frames["N2"][None, :, -motion:])[0]
    assert np.array_equal(session.anchors.export()["N2.tail.motion"], expected.numpy())
