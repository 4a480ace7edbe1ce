"""The infinitetalk family renders a timeline of N and I chunks through the Pipeline from the tiny original-layout
checkpoints, and a node that did not render the first chunks (a fresh pipeline with the stored reference and a
checkpoint's anchors: what a node does after another was killed) renders the rest with the same frame hashes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY, WAN_14B, StreamConfig
from gpu_worker.models.infinitetalk.reference import canvas
from gpu_worker.models.infinitetalk.roles import InfiniteTalkDecoder, WanLatents
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from monologue.contracts import Chunk, ChunkKind, Family, RenderOptions, Residency
from monologue.plan import chunk_sizes, plan_chunks

OPTIONS = RenderOptions(family=Family.INFINITETALK, chunk_frames=16, i_frames=4, prompt="a calm studio")


class Frames:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(frames.copy())


def _pipeline(root: Path) -> Pipeline:
    return Pipeline(build_family(InfiniteTalkWeights(TINY, Locations.under(root))))


@pytest.fixture(scope="module")
def inputs() -> tuple[np.ndarray, ArrayAudio]:
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    t = np.arange(16_000 * 2) / 16_000
    return portrait, ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3)).astype(np.float32))


def test_the_plan_starts_on_the_wan_grid() -> None:
    chunks = plan_chunks(50, **chunk_sizes(OPTIONS))
    assert [(c.name, c.first_frame, c.n_frames) for c in chunks] == [
        ("N0", 0, 17), ("N1", 21, 16), ("I0", 17, 4), ("N2", 41, 9), ("I1", 37, 4)
    ]  # fmt: skip


CHUNKS = plan_chunks(30, **chunk_sizes(OPTIONS))  # N0 (17 frames), N1 (9), I0 (4)


def _render(pipeline: Pipeline, session: Session, chunks: list[Chunk]) -> tuple[dict[str, list[str]], Frames]:
    frames, hashes = Frames(), {}
    for chunk in chunks:
        result = pipeline.run_chunk(session, ChunkRequest(chunk, seed=3, prompt=OPTIONS.prompt), frames)
        hashes[chunk.name] = result.frame_hashes
    return hashes, frames


@pytest.fixture(scope="module")
def baseline(tiny_weights: Path, inputs: tuple[np.ndarray, ArrayAudio]) -> tuple[Session, dict[str, list[str]], dict]:  # type: ignore[type-arg]
    """A resident render of N0 N1 I0, the anchors a node checkpoints after N0, and the frame hashes."""
    portrait, audio = inputs
    pipeline = _pipeline(tiny_weights)
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    hashes, frames = _render(pipeline, session, CHUNKS[:1])
    checkpoint = session.anchors.export()
    later, more = _render(pipeline, session, CHUNKS[1:])
    shown = np.concatenate(frames.frames + more.frames)
    assert shown.shape == (30, 64, 64, 3) and shown.std() > 1.0
    return session, hashes | later, checkpoint


def test_a_render_resumed_on_another_node_has_the_same_frames(
    tiny_weights: Path,
    inputs: tuple[np.ndarray, ArrayAudio],
    baseline: tuple,  # type: ignore[type-arg]
) -> None:
    session, hashes, checkpoint = baseline
    assert [len(hashes[c.name]) for c in CHUNKS] == [c.n_frames for c in CHUNKS]
    assert len(set(hashes["N0"])) > 1  # the frames move
    portrait, audio = inputs
    second = _pipeline(tiny_weights)  # another node: its own models, the stored reference and checkpoint
    resumed = second.start_session(portrait, OutputSpec(fps=25), audio, reference=session.reference)
    resumed.anchors.restore(checkpoint)
    again, _ = _render(second, resumed, CHUNKS[1:])
    assert again == {name: hashes[name] for name in again}


def test_the_i2v_condition_is_encoded_once_per_clip_shape(
    tiny_weights: Path, inputs: tuple[np.ndarray, ArrayAudio]
) -> None:
    """Every clip of a length has the same I2V condition, encoded once: N0 (5 latents), N1 (9 motion frames' 3 + 4),
    then I0 (3 + 1 + 2 on the right), N2 (3 + 3) and I1 share 6: three encodes for five chunks. A fresh node resuming
    the session (test above) encodes its own, the same."""
    portrait, audio = inputs
    pipeline = _pipeline(tiny_weights)
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    chunks = plan_chunks(50, **chunk_sizes(OPTIONS))
    assert [(c.name, c.n_frames) for c in chunks] == [("N0", 17), ("N1", 16), ("I0", 4), ("N2", 9), ("I1", 4)]
    _render(pipeline, session, chunks)
    assert pipeline.models.audio_to_video.conditions.encodes == 3  # type: ignore[attr-defined]


def test_a_node_that_keeps_no_decode_states_primes_and_renders_the_same_frames(
    tiny_weights: Path,
    inputs: tuple[np.ndarray, ArrayAudio],
    baseline: tuple,  # type: ignore[type-arg]
) -> None:
    """StreamConfig.decoder_states 0: every chunk after N0 primes its decoder on its context anchor; the frames are
    those of the node that kept N0's state (the baseline: N1 and I0 started from it)."""
    portrait, audio = inputs
    config = replace(TINY, stream=replace(TINY.stream, decoder_states=0))
    pipeline = Pipeline(build_family(InfiniteTalkWeights(config, Locations.under(tiny_weights))))
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    hashes, _ = _render(pipeline, session, CHUNKS)
    assert hashes == baseline[1]
    states = pipeline.models.decoder.states  # type: ignore[attr-defined]
    assert (states.hits, states.misses, len(states)) == (0, 2, 0)


def test_switch_residency_renders_the_same_frames(
    tiny_weights: Path,
    inputs: tuple[np.ndarray, ArrayAudio],
    baseline: tuple,  # type: ignore[type-arg]
) -> None:
    """Only the running stage's models on the device, the others parked: the same frames, a switch figure."""
    portrait, audio = inputs
    pipeline = Pipeline(
        build_family(InfiniteTalkWeights(TINY, Locations.under(tiny_weights))), residency=Residency.SWITCH
    )
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    hashes, _ = _render(pipeline, session, CHUNKS[:1])  # N0 runs every stage, each switched in
    assert hashes["N0"] == baseline[1]["N0"]


def test_off_grid_sizes_are_refused_with_what_to_fix() -> None:
    with pytest.raises(
        ValueError,
        match=r"multiples of 4 and first_chunk_frames 0 or 1 \+ a multiple of 4 \(got first_chunk_frames=16\)",
    ):
        RenderOptions(family=Family.INFINITETALK, first_chunk_frames=16)
    assert RenderOptions(family=Family.INFINITETALK, first_chunk_frames=17).first_chunk_frames == 17


def test_a_size_asked_for_is_one_of_the_buckets_whose_class_sets_the_sampling_shift() -> None:
    """The API's allowed sizes are the buckets the real preset frames with; a 720-class size samples as 720p."""
    assert Family.INFINITETALK.output_sizes == {
        (w, h) for h, w in [*WAN_14B.buckets_480.values(), *WAN_14B.buckets_720.values()]
    }
    assert canvas(WAN_14B, 1920, 1080, OutputSpec(width=1280, height=704)) == (1280, 704, True)
    assert canvas(WAN_14B, 1920, 1080, OutputSpec(width=448, height=832)) == (448, 832, False)
    assert canvas(WAN_14B, 1920, 1080, OutputSpec(width=1280, height=704, preview=True)) == (640, 352, True)


def test_a_first_chunk_moves_up_onto_each_family_s_grid() -> None:
    assert [Family.INFINITETALK.first_chunk_on_grid(n) for n in (0, 1, 2, 5, 16, 17)] == [0, 1, 5, 5, 17, 17]
    assert [Family.DIT.first_chunk_on_grid(n) for n in (0, 1, 16, 17)] == [0, 4, 16, 20]
    assert [Family.WARP.first_chunk_on_grid(n) for n in (0, 1, 16, 17)] == [0, 1, 16, 17]
    for family in Family:  # what it gives is accepted as a first chunk
        assert all(RenderOptions(family=family, first_chunk_frames=family.first_chunk_on_grid(n)) for n in range(30))


def test_the_decoder_context_grows_to_the_receptive_field_and_stays_there(
    tiny_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream longer than the Wan decoder's receptive field (`decoder_context`, 38 latents: test_vae.py shows 38
    primes exactly and 37 does not): each chunk after N0 reaches its decoder with the stream's latents before it,
    up to exactly 38 of them, however long the stream has grown (a tail anchor keeping one too few would show)."""
    need = StreamConfig().decoder_context
    seen: list[tuple[str, int]] = []
    decode = InfiniteTalkDecoder.decode

    def watched(self: InfiniteTalkDecoder, reference: dict[str, np.ndarray], upscaled: WanLatents) -> np.ndarray:
        seen.append(("none" if upscaled.context is None else str(upscaled.context.shape[1]), upscaled.frames.shape[1]))
        return decode(self, reference, upscaled)

    monkeypatch.setattr(InfiniteTalkDecoder, "decode", watched)
    options = RenderOptions(family=Family.INFINITETALK, chunk_frames=64, i_frames=4, prompt="a calm studio")
    chunks = [chunk for chunk in plan_chunks(300, **chunk_sizes(options)) if chunk.kind is ChunkKind.N][:4]
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    t = np.arange(16_000 * 13) / 16_000
    audio = ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
    pipeline = _pipeline(tiny_weights)
    session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
    _render(pipeline, session, chunks)
    streamed = 0  # latents of the stream before each chunk
    expected = []
    for _, latents in seen:
        expected.append(("none" if streamed == 0 else str(min(streamed, need)), latents))
        streamed += latents
    assert seen == expected and streamed > need + seen[-1][1]  # the last chunks reached the limit
