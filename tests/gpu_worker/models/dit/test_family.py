"""The dit family driven through the real Pipeline as a node drives it: chunks in generation order
N0 N1 I0 N2 I1 …, frames at the output size, bit-identical under the same seed, identical again after
the anchors go through a checkpoint, and flat memory."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.numpy import load as load_tensors, save as save_tensors

from gpu_worker.models import build_family as build_family_by_name
from gpu_worker.models.dit import SMOKE_SEED, WEIGHTS_ENV, build_family
from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.decoder import DiTDecoder
from gpu_worker.models.dit.runtime import DiTLatents, TorchModule
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.pipeline import Session
from monologue.contracts import Chunk, ChunkKind, Family
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


STRIDE = TINY.vae.temporal_stride  # 4 video frames per latent: chunk sizes are multiples of it


def _requests(frames: int, seed: int, n_frames: int = 8, i_frames: int = 4) -> list[ChunkRequest]:
    """Generation order: N0 N1 I0 N2 I1 …, on the latent grid (only the last chunk may be ragged)."""
    plan = plan_chunks(frames, n_frames=n_frames, i_frames=i_frames, stride=STRIDE)
    return [ChunkRequest(spec, seed) for spec in plan]


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
    requests = _requests(30, seed=0)  # N0 0..7, I0 8..11, N1 12..19, I1 20..23, N2 24..29 (ragged: 2 latents)
    frames = _render(pipeline, session, requests)
    assert list(frames) == ["N0", "N1", "I0", "N2", "I1"]
    assert requests[3].first_frame == 24 and requests[3].n_frames == 6
    for request in requests:
        assert frames[request.name].shape == (request.n_frames, 60, 80, 3), request.name
        assert frames[request.name].dtype == np.uint8
    preview = pipeline.start_session(portrait, OutputSpec(fps=FPS, resolution="512", preview=True), ArrayAudio(speech))
    assert _render(pipeline, preview, _requests(4, seed=0)[:1])["N0"].shape == (4, 256, 256, 3)
    # A size asked for: generated on the canvas around it (its sides rounded up to the grid), cropped back to it.
    sized = pipeline.start_session(portrait, OutputSpec(fps=FPS, width=34, height=50), ArrayAudio(speech))
    assert sized.reference["canvas_size"].tolist() == [64, 64]
    assert _render(pipeline, sized, _requests(4, seed=0)[:1])["N0"].shape == (4, 50, 34, 3)


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
    changed[24 * 640 : 28 * 640] = 0.0  # silence frames 24..27, inside N2 (frames 24..29)
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
        pipeline.run_chunk(session, ChunkRequest(Chunk(ChunkKind.N, 0, 0, 8), seed=0, prompt=prompt), sink)
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
    for module in pipeline.models.modules():
        assert isinstance(module, TorchModule)
        for name, model in module.models.items():
            if name.startswith("vae"):
                continue
            blocks = getattr(model, "blocks", None)
            assert isinstance(blocks, torch.nn.ModuleList) and len(blocks) > 0, name
    a2v = pipeline.models.audio_to_video
    assert isinstance(a2v, TorchModule)
    assert isinstance(a2v.models["a2v"], AudioToVideoDiT)


def test_the_family_builds_by_name_with_the_smoke_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    family = build_family_by_name(Family.DIT)
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
        pipeline.models.reference.check(np.zeros((12, 40, 3), np.uint8))
    with pytest.raises(InputError, match="uint8"):
        pipeline.models.reference.check(np.zeros((40, 40, 3), np.float32))


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
        ChunkRequest(Chunk(ChunkKind.N, 0, 0, 8)),
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


def test_chunks_sit_on_the_latent_grid_and_anchors_start_on_it(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray
) -> None:
    """An N chunk of 8 frames is 2 latents; anchors keep the video frame their first latent starts at."""
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    requests = _requests(22, seed=0)  # N0 0..7, I0 8..11, N1 12..19, then the ragged N2 20..21: one latent
    assert [(r.name, r.first_frame, r.n_frames) for r in requests] == [
        ("N0", 0, 8),
        ("N1", 12, 8),
        ("I0", 8, 4),
        ("N2", 20, 2),
    ]
    frames = _render(pipeline, session, requests[:2])
    anchors = session.anchors.export()
    assert anchors["N1.head.first_frame"].tolist() == [12]
    assert anchors["N1.head.latents"].shape[1] == TINY.a2v.boundary_frames == 2
    tail = anchors["N1.tail.latents"]  # min(max(boundary, decoder context), the chunk's 2 latents)
    assert tail.shape[1] == 2 and anchors["N1.tail.first_frame"].tolist() == [20 - STRIDE * tail.shape[1]]
    frames.update(_render(pipeline, session, requests[2:]))
    assert [frames[r.name].shape[0] for r in requests] == [8, 8, 4, 2]


@pytest.mark.parametrize(
    ("chunk", "problem"),
    [(Chunk(ChunkKind.N, 0, 2, 8), "N0 (frames 2..9)"), (Chunk(ChunkKind.I, 0, 8, 3), "I0 (frames 8..10)")],
)
def test_a_chunk_off_the_latent_grid_is_refused(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray, chunk: Chunk, problem: str
) -> None:
    """Only a session's last chunk may end off a multiple of 4 (an N chunk cannot know, an I chunk never is)."""
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    with pytest.raises(ValueError, match="multiples of 4") as refused:
        pipeline.run_chunk(session, ChunkRequest(chunk), ListSink())
    assert problem in str(refused.value) and "chunk_frames, i_frames and first_chunk_frames" in str(refused.value)


def test_a_checkpoint_whose_vae_strides_otherwise_is_refused_at_load() -> None:
    odd = replace(TINY, vae=replace(TINY.vae, temporal_stride=2))
    family = build_family(Weights(odd, seed=SMOKE_SEED))
    with pytest.raises(ValueError, match="every 2 frames"):
        family.load()


def test_each_latent_hears_the_audio_of_its_own_four_frames_and_the_window() -> None:
    """Latent j covers video frames [4 j, 4 j + 4) and cross-attends to their audio ± audio_window frames."""
    model = AudioToVideoDiT(TINY)
    audio, window = TINY.audio, TINY.a2v.audio_window
    frames = torch.arange(-2.0, 14.0)  # the audio of a 3-latent chunk (12 frames) with margins (2, 2)
    cond = A2VConditioning(
        reference=torch.zeros(1, TINY.latent_channels, 2, 2),
        boundary=torch.zeros(1, TINY.latent_channels, 0, 2, 2),
        boundary_times=torch.zeros(0),
        audio=torch.zeros(1, len(frames), audio.tokens_per_frame, audio.dim),
        audio_times=frames,
        text=torch.zeros(1, 0, TINY.text.dim),
        text_mask=torch.zeros(1, 0, dtype=torch.bool),
        keep_audio=torch.ones(1, dtype=torch.bool),
    )
    _, mask = model._condition(cond, 3, 1)  # (1, 1, latents x 1 token, audio frames x K)
    heard = mask[0, 0].view(3, len(frames), audio.tokens_per_frame).all(dim=2)  # (latent, audio frame)
    for latent in range(3):
        expected = [STRIDE * latent - window <= frame <= STRIDE * latent + STRIDE - 1 + window for frame in frames]
        assert heard[latent].tolist() == expected, latent


def test_every_chunk_after_the_first_primes_its_decoder_on_as_many_latents_as_the_decoder_needs(
    pipeline: Pipeline, portrait: np.ndarray, speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 6 latents, more than the decoder's causal receptive field (`context_frames`, 4 in TINY): each
    chunk but N0 reaches its decoder with exactly that many context latents (fewer and its first frames decode
    from a different state: tests/gpu_worker/models/dit/test_vae.py shows `context_frames` is what makes priming
    exact), so the tail anchors keep at least that many, and the context is the latents just before the chunk's
    own decoder input: the same values the SR DiT upscaled next to the chunk."""
    need = TINY.vae.context_frames
    seen: dict[int, tuple[int | None, int]] = {}  # decode call → (context latents, chunk latents)
    decode = DiTDecoder.decode

    def watched(self: DiTDecoder, reference: dict[str, np.ndarray], upscaled: DiTLatents) -> np.ndarray:
        context = None if upscaled.context is None else upscaled.context.shape[1]
        seen[len(seen)] = (context, upscaled.frames.shape[1])
        return decode(self, reference, upscaled)

    monkeypatch.setattr(DiTDecoder, "decode", watched)
    session = pipeline.start_session(portrait, OutputSpec(fps=FPS), ArrayAudio(speech))
    requests = _requests(24 * 3 + 8 * 2, seed=0, n_frames=24, i_frames=8)  # N0 N1 I0 N2 I1
    assert [(r.name, r.n_frames) for r in requests] == [("N0", 24), ("N1", 24), ("I0", 8), ("N2", 24), ("I1", 8)]
    _render(pipeline, session, requests)
    assert need < 24 // STRIDE
    assert [seen[index] for index in range(len(requests))] == [(None, 6), (need, 6), (need, 2), (need, 6), (need, 2)]
    assert session.anchors.export()["N2.tail.latents"].shape[1] >= need  # the newest tail, for I2 and N3
