"""The dit family driven through the real Pipeline as a node drives it: chunks in generation order
N0 N1 I0 N2 I1 …, frames at the output size, bit-identical under the same seed, identical again after
the anchors go through a checkpoint, and flat memory."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from gpu_worker.models import build_family as build_family_by_name
from gpu_worker.models.dit import SMOKE_SEED, WEIGHTS_ENV, build_family
from gpu_worker.models.dit.a2v import AudioToVideoDiT
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.pipeline import Session
from monologue.contracts import Chunk
from monologue.errors import InputError
from monologue.plan import plan_chunks

FPS = 25


class ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(frames.copy())


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline(build_family(Weights(TINY, seed=SMOKE_SEED)))


@pytest.fixture
def portrait() -> np.ndarray:
    """80x60: not a multiple of the canvas (32), so frames are cropped from a 96x64 canvas."""
    y, x = np.mgrid[0:60, 0:80]
    face = ((x - 40) ** 2 / 400 + (y - 28) ** 2 / 500) < 1
    image = np.stack([x * 3, y * 4, np.full_like(x, 90)], axis=-1)
    image[face] = (220, 180, 150)
    return image.astype(np.uint8)


def _requests(frames: int, seed: int, n_frames: int = 8, i_frames: int = 2) -> list[ChunkRequest]:
    """Generation order: N0 N1 I0 N2 I1 …"""
    return [ChunkRequest(spec, seed) for spec in plan_chunks(frames, n_frames=n_frames, i_frames=i_frames)]


def _render(pipeline: Pipeline, session: Session, requests: list[ChunkRequest]) -> dict[str, np.ndarray]:
    out = {}
    for request in requests:
        sink = ListSink()
        result = pipeline.run_chunk(session, request, sink)
        assert len(result.frame_hashes) == request.n_frames
        assert len(session.anchors) <= 4, f"anchors must stay bounded, have {session.anchors.names()}"
        out[request.name] = np.concatenate(sink.frames)
    return out


def test_chunks_come_out_at_the_output_frame_size(pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray) -> None:
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    assert session.reference["frame_size"].tolist() == [80, 60]
    assert session.reference["canvas_size"].tolist() == [96, 64]
    requests = _requests(30, seed=0)
    frames = _render(pipeline, session, requests)
    assert list(frames) == ["N0", "N1", "I0", "N2", "I1", "N3", "I2"]
    for request in requests:
        assert frames[request.name].shape == (request.n_frames, 60, 80, 3), request.name
        assert frames[request.name].dtype == np.uint8
    preview = pipeline.start_session(portrait, OutputSpec(fps=FPS, resolution="512", preview=True), ArrayAudio(speech))
    assert _render(pipeline, preview, _requests(4, seed=0)[:1])["N0"].shape == (4, 256, 256, 3)


def test_same_seed_gives_bit_identical_frames_and_another_seed_does_not(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray
) -> None:
    runs = []
    for seed in (3, 3, 4):
        session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
        runs.append(_render(pipeline, session, _requests(20, seed=seed)))
    first, again, other = runs
    assert all(np.array_equal(first[name], again[name]) for name in first)
    assert not any(np.array_equal(first[name], other[name]) for name in first)


def test_chunks_regenerated_from_a_checkpoint_of_the_anchors_are_identical(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray
) -> None:
    """As on another node: reference and anchors go through safetensors bytes, then I1 and N3 rerun."""
    requests = _requests(40, seed=5)  # N0 N1 I0 N2 I1 N3 …
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    _render(pipeline, session, requests[:4])
    checkpoint = save_tensors(session.anchors.export())
    stored_reference = save_tensors(session.reference)
    original = _render(pipeline, session, requests[4:6])
    fresh = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech), load_tensors(stored_reference))
    fresh.anchors.restore(load_tensors(checkpoint))
    again = _render(pipeline, fresh, requests[4:6])
    assert list(again) == ["I1", "N3"]
    assert all(np.array_equal(original[name], again[name]) for name in again)


def test_the_audio_drives_the_frames_near_it_and_only_there(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray
) -> None:
    changed = speech.copy()
    changed[20 * 640 : 24 * 640] = 0.0  # silence frames 20..23, inside N2 (frames 20..27)
    renders = []
    for audio in (speech, changed):
        session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(audio))
        renders.append(_render(pipeline, session, _requests(30, seed=0)[:4]))  # N0 N1 I0 N2
    assert all(np.array_equal(renders[0][name], renders[1][name]) for name in ("N0", "N1", "I0"))
    assert not np.array_equal(renders[0]["N2"], renders[1]["N2"])


def test_a_prompt_conditions_the_frames(pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray) -> None:
    frames = []
    for prompt in ("", "smiling, warm studio light"):
        session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
        sink = ListSink()
        pipeline.run_chunk(session, ChunkRequest(Chunk("N", 0, 0, 8), seed=0, prompt=prompt), sink)
        frames.append(sink.frames[0])
    assert not np.array_equal(frames[0], frames[1])


def test_memory_stays_flat_over_many_chunks(pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray) -> None:
    long_audio = np.tile(speech, 3)  # 12 s
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(long_audio))
    requests = _requests(300, seed=0)
    _render(pipeline, session, requests[:10])
    settled = _rss_mb()
    _render(pipeline, session, requests[10:40])
    assert _rss_mb() - settled < 20, "resident memory grew while rendering 30 more chunks"
    assert sum(value.nbytes for value in session.anchors.export().values()) < 10_000


def test_offload_and_restore_keep_the_frames(portrait: np.ndarray, speech: np.ndarray) -> None:
    family = build_family(Weights(TINY, seed=SMOKE_SEED))
    pipeline = Pipeline(family)
    request = _requests(8, seed=1)[:1]
    before = _render(pipeline, pipeline.start_session(portrait, OutputSpec(), ArrayAudio(speech)), request)
    for module in family.modules():
        module.offload()
        module.restore("cpu")
        assert module.device == "cpu"
    after = _render(pipeline, pipeline.start_session(portrait, OutputSpec(), ArrayAudio(speech)), request)
    assert np.array_equal(before["N0"], after["N0"])


def test_every_transformer_exposes_its_blocks_for_sharding(pipeline: Pipeline) -> None:
    for module in pipeline.family.modules():
        assert isinstance(module, TorchModule)
        for name, model in module.models.items():
            if name.startswith("vae"):
                continue
            blocks = getattr(model, "blocks", None)
            assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0, name
    a2v = pipeline.family.audio_to_video
    assert isinstance(a2v, TorchModule)
    assert isinstance(a2v.models["a2v"], AudioToVideoDiT)


def test_the_family_builds_by_name_with_the_smoke_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    family = build_family_by_name("dit")
    assert family.name == "dit"
    assert [module.name for module in family.modules()] == [
        "reference",
        "context",
        "audio_to_video",
        "super_resolution",
        "decoder",
    ]


def test_an_unusable_portrait_is_refused_at_submit_time(pipeline: Pipeline) -> None:
    with pytest.raises(InputError, match="too small"):
        pipeline.family.reference.check(np.zeros((12, 40, 3), np.uint8))
    with pytest.raises(InputError, match="uint8"):
        pipeline.family.reference.check(np.zeros((40, 40, 3), np.float32))


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_sampling_reports_every_denoising_step(pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray) -> None:
    """The node heartbeats from these reports: sampling, the longest stage, must report as it goes."""
    reports: list[tuple[str, int, int]] = []
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    pipeline.run_chunk(
        session,
        ChunkRequest(Chunk("N", 0, 0, 8)),
        ListSink(),
        lambda stage, step=0, steps=0: reports.append((stage, step, steps)),
    )
    steps = TINY.a2v.sampling_steps
    sampling = [(step, total) for stage, step, total in reports if stage == "audio_to_video" and total]
    assert sampling == [(step, steps) for step in range(1, steps + 1)]
    assert [stage for stage, _, total in reports if not total] == [
        "context",
        "audio_to_video",
        "super_resolution",
        "decode_publish",
    ]
