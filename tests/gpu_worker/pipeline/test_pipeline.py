"""The framework with a tiny fake family: what the Pipeline guarantees whatever the model is."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpu_worker.pipeline import (
    ArrayAudio,
    AudioToVideo,
    AudioWindow,
    ChunkRequest,
    ContextGenerator,
    Decoder,
    ModelSet,
    OutputSpec,
    Pipeline,
    ReferenceEncoder,
    SuperResolution,
    frame_size,
)
from gpu_worker.pipeline.module import A2VOutput, Anchor, Reference
from gpu_worker.pipeline.progress import StepProgress, no_steps
from monologue.contracts import Chunk
from monologue.plan import plan_chunks, timeline_order


class Reference_(ReferenceEncoder):
    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        return {"frame_size": np.array(frame_size(portrait.shape[1], portrait.shape[0], output))}


class Loudness(ContextGenerator):
    margin_frames = (1, 1)

    def context(self, window: AudioWindow, chunk: ChunkRequest, rng: np.random.Generator) -> dict[str, Any]:
        per_frame = window.rate // window.fps
        first = window.frame_start(chunk.first_frame)
        samples = window.samples[first : first + chunk.n_frames * per_frame].reshape(chunk.n_frames, per_frame)
        return {"loudness": np.sqrt((samples**2).mean(axis=1)), "noise": rng.normal(size=chunk.n_frames)}


class Walk(AudioToVideo):
    """A random walk whose state is the anchor: N chunks continue it, I chunks interpolate between anchors."""

    def generate_n(
        self,
        reference: Reference,
        context: dict[str, Any],
        previous: Anchor | None,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        start = 0.0 if previous is None else float(previous["value"][0])
        steps = np.cumsum(context["noise"])
        progress(1, 2)  # a two-step model, as far as its progress goes
        values = start + steps + 10 * context["loudness"]
        progress(2, 2)
        return A2VOutput(values, head={"value": values[:1]}, tail={"value": values[-1:]})

    def generate_i(
        self,
        reference: Reference,
        context: dict[str, Any],
        left: Anchor,
        right: Anchor,
        chunk: ChunkRequest,
        rng: np.random.Generator,
        *,
        progress: StepProgress = no_steps,
    ) -> A2VOutput:
        inner = np.linspace(left["value"][0], right["value"][0], chunk.n_frames + 2)[1:-1]
        return A2VOutput(inner)


class Paint(SuperResolution):
    def upscale(self, reference: Reference, latents: Any) -> Any:
        width, height = (int(v) for v in reference["frame_size"])
        return np.broadcast_to(np.asarray(latents)[:, None, None, None], (len(latents), height, width, 3))


class Clip(Decoder):
    def decode(self, reference: Reference, upscaled: Any) -> np.ndarray:
        return np.clip(128 + upscaled, 0, 255).astype(np.uint8)


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.extend(frames.copy())


def family() -> ModelSet:
    return ModelSet("fake", Reference_(), Loudness(), Walk(), Paint(), Clip())


@pytest.fixture
def session_parts() -> tuple[Pipeline, np.ndarray, ArrayAudio]:
    audio = ArrayAudio(np.random.default_rng(0).normal(scale=0.1, size=16_000 * 12).astype(np.float32))
    return Pipeline(family()), np.zeros((16, 24, 3), np.uint8), audio


def _render(pipeline: Pipeline, portrait: np.ndarray, audio: ArrayAudio, seed: int = 0) -> dict[str, list[Any]]:
    session = pipeline.start_session(portrait, OutputSpec(), audio)
    out: dict[str, list[Any]] = {}
    for spec in plan_chunks(300, n_frames=40, i_frames=4):
        sink = ListSink()
        chunk = ChunkRequest(spec, seed)
        result = pipeline.run_chunk(session, chunk, sink)
        assert len(sink.frames) == spec.n_frames == len(result.frame_hashes)
        assert set(result.stage_ms) == {"context", "audio_to_video", "super_resolution", "decode_publish"}
        assert len(session.anchors) <= 4, f"anchors must stay bounded, have {session.anchors.names()}"
        out[spec.name] = sink.frames
    return out


def test_chunks_in_generation_order_give_a_continuous_timeline(session_parts: Any) -> None:
    chunks = _render(*session_parts)
    timeline = timeline_order(plan_chunks(300, n_frames=40, i_frames=4))
    values = np.array([int(frame[0, 0, 0]) for spec in timeline for frame in chunks[spec.name]])
    assert len(values) == 300
    # The I chunks bridge N(k) and N(k+1): no seam jumps more than the walk's own steps do.
    steps = np.abs(np.diff(values.astype(int)))
    assert steps.max() <= np.percentile(steps, 99.5) + 8


def test_same_seed_same_frames_other_seed_other_frames(session_parts: Any) -> None:
    first, again = _render(*session_parts, seed=1), _render(*session_parts, seed=1)
    other = _render(*session_parts, seed=2)
    assert all(np.array_equal(a, b) for name in first for a, b in zip(first[name], again[name], strict=True))
    assert not all(np.array_equal(a, b) for name in first for a, b in zip(first[name], other[name], strict=True))


def test_a_chunk_regenerated_from_restored_anchors_is_identical(session_parts: Any) -> None:
    pipeline, portrait, audio = session_parts
    session = pipeline.start_session(portrait, OutputSpec(), audio)
    plan = plan_chunks(300, n_frames=40, i_frames=4)
    for spec in plan[:4]:  # N0 N1 I0 N2
        pipeline.run_chunk(session, ChunkRequest(spec), ListSink())
    saved = session.anchors.export()
    i1 = plan[4]
    request = ChunkRequest(i1)
    original = pipeline.run_chunk(session, request, ListSink())
    # A fresh node: a new session from the same reference, anchors restored from the checkpoint.
    fresh = pipeline.start_session(portrait, OutputSpec(), audio, reference=session.reference)
    fresh.anchors.restore(saved)
    assert pipeline.run_chunk(fresh, request, ListSink()).frame_hashes == original.frame_hashes


def test_an_i_chunk_without_its_anchors_names_what_is_missing(session_parts: Any) -> None:
    pipeline, portrait, audio = session_parts
    session = pipeline.start_session(portrait, OutputSpec(), audio)
    with pytest.raises(LookupError, match=r"N0\.tail"):
        pipeline.run_chunk(session, ChunkRequest(Chunk("I", 0, 40, 4)), ListSink())


def test_frame_size_presets_and_preview() -> None:
    assert frame_size(512, 512, OutputSpec()) == (512, 512)
    assert frame_size(513, 701, OutputSpec()) == (512, 700)
    assert frame_size(600, 800, OutputSpec(resolution="720p")) == (720, 1280)
    assert frame_size(1920, 1080, OutputSpec(resolution="1080p", preview=True)) == (960, 540)
    with pytest.raises(ValueError, match="too small"):
        frame_size(20, 20, OutputSpec(preview=True))


class Reports:
    """A Progress that writes down what it is told."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, int]] = []

    def __call__(self, stage: str, step: int = 0, steps: int = 0) -> None:
        self.seen.append((stage, step, steps))


def test_a_chunk_reports_each_stage_as_it_starts_and_the_steps_of_long_ones(session_parts: Any) -> None:
    pipeline, portrait, audio = session_parts
    session = pipeline.start_session(portrait, OutputSpec(), audio)
    reports = Reports()
    pipeline.run_chunk(session, ChunkRequest(Chunk("N", 0, 0, 40)), ListSink(), reports)
    assert reports.seen == [
        ("context", 0, 0),
        ("audio_to_video", 0, 0),
        ("audio_to_video", 1, 2),
        ("audio_to_video", 2, 2),
        ("super_resolution", 0, 0),
        ("decode_publish", 0, 0),
    ]


def test_the_last_report_names_the_stage_a_chunk_stopped_in(session_parts: Any) -> None:
    """What a hung or failed chunk's last heartbeat says: the stage it is in, reported before it runs."""
    pipeline, portrait, audio = session_parts
    session = pipeline.start_session(portrait, OutputSpec(), audio)
    reports = Reports()
    with pytest.raises(LookupError):
        pipeline.run_chunk(session, ChunkRequest(Chunk("I", 0, 40, 4)), ListSink(), reports)  # no anchors yet
    assert reports.seen[-1] == ("audio_to_video", 0, 0)
