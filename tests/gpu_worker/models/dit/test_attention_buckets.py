"""Compile buckets for the SR DiT's compiled FlexAttention: every chunk of a render plan pads to a configured
bucket, `warm_up` compiles each bucket once at load, and a render then compiles nothing (and matches the
exact, unpadded windowed attention)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters

from gpu_worker.models.dit.config import TINY, DiTConfig, preset
from gpu_worker.models.dit.layers import randomise
from gpu_worker.models.dit.sparse_attention import bucket_frames
from gpu_worker.models.dit.sr import SuperResolutionDiT, warm_up
from monologue.plan import plan_timeline


def _sr_frames(config: DiTConfig, total: int, n_frames: int, first_frames: int) -> list[tuple[str, int, int]]:
    """(chunk, fewest, most) SR sequence frames of each chunk of a plan: its latents (the last one ragged),
    up to `context_frames` decoder-context latents (none for the first chunk) and the reference."""
    stride = config.vae.temporal_stride
    plan = plan_timeline(total, n_frames=n_frames, i_frames=4, first_frames=first_frames, stride=stride)
    rows = []
    for chunk in plan:
        latents = -(-chunk.n_frames // stride)
        context = 0 if chunk.first_frame == 0 else config.vae.context_frames
        rows.append((chunk.name, latents + 1, latents + context + 1))
    return rows


@pytest.mark.parametrize("name", ["tiny", "h200"])
@pytest.mark.parametrize("first_frames", [12, 40])
def test_every_chunk_of_a_render_plan_falls_in_a_warmed_bucket(name: str, first_frames: int) -> None:
    """A short first chunk, N and I chunks and a short last chunk, for every video length up to 20 s: every
    sequence maps to a configured bucket, the buckets `warm_up` compiles, so no render can compile."""
    config = preset(name)
    buckets = set(config.sr.frame_buckets)
    for total in range(1, 501):
        for chunk, fewest, most in _sr_frames(config, total, 40, first_frames):
            for frames in range(fewest, most + 1):
                assert bucket_frames(frames, config.sr.frame_buckets) in buckets, (total, chunk, frames)


def test_the_h200_buckets_fit_steady_state_chunks_closely() -> None:
    """N and I chunks make up almost all of a render: each pads by at most 2 frames (padding frames attend
    only to themselves, so 2 frames add about a tenth of an N chunk's attention and nothing else)."""
    config = preset("h200")
    rows = {chunk: most for chunk, _, most in _sr_frames(config, 400, 40, 12)}
    for chunk in ("N2", "I2"):
        assert bucket_frames(rows[chunk], config.sr.frame_buckets) - rows[chunk] <= 2, (chunk, rows[chunk])


def test_bucket_is_the_smallest_that_holds_the_sequence_and_too_long_names_the_setting() -> None:
    model = SuperResolutionDiT(preset("tiny", sr=replace(TINY.sr, frame_buckets=(12, 4, 6))))
    assert [model.bucket(frames) for frames in (1, 3, 4, 5, 11)] == [4, 4, 6, 6, 12]
    with pytest.raises(ValueError, match=r"SRConfig\.frame_buckets"):
        model.bucket(12)


@pytest.mark.parametrize("buckets", [(), (1, 4)])
def test_unusable_bucket_sets_are_refused_when_the_model_is_built(buckets: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match=r"SRConfig\.frame_buckets"):
        SuperResolutionDiT(preset("tiny", sr=replace(TINY.sr, frame_buckets=buckets)))


def test_warm_up_compiles_nothing_where_attention_is_not_compiled() -> None:
    """`auto` on CPU is the exact windowed path: nothing to compile, nothing padded."""
    before = _compiles()
    assert SuperResolutionDiT(preset("tiny")).warm_up(12, 8) == ()
    assert warm_up(preset("h200"), 92, 160, "cpu", torch.float32) == ()
    assert _compiles() == before


def _compiles() -> int:
    return int(counters["stats"]["unique_graphs"])


# Compiling FlexAttention on CPU takes 5-25 s a bucket: worth it, as this is the only run of the compiled path
# in CI (the CUDA twin is test_sparse_attention.py's gpu test).
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit
def test_after_warm_up_chunks_of_several_lengths_compile_nothing_and_match_windowed() -> None:
    """Buckets of 4 and 7 frames: warm_up compiles each once, even where Dynamo would keep only one compiled
    version; chunks of 3, 6, 2 and 4 latents (4, 7, 3 and 5 frames with the reference) then run without a
    compile and equal the unpadded windowed model."""
    # Not monkeypatch: its undo deletes the attribute from torch's config module, hiding it from torch itself.
    with torch._dynamo.config.patch(recompile_limit=1):
        _warm_then_run_chunks()


def _warm_then_run_chunks() -> None:
    models = {}
    for backend in ("windowed", "flex"):
        config = preset("tiny", sr=replace(TINY.sr, attention=backend, frame_buckets=(7, 4)))
        models[backend] = SuperResolutionDiT(config).eval()
        randomise(models[backend], 5)
    before = _compiles()
    assert models["flex"].warm_up(12, 8) == (4, 7)
    assert _compiles() - before == 2
    generator = torch.Generator().manual_seed(2)
    reference = torch.randn(1, 4, 12, 8, generator=generator)  # (B, C, H, W)
    for frames in (3, 6, 2, 4):
        low = torch.randn(1, 4, frames, 6, 4, generator=generator)  # (B, C, T, h, w)
        with torch.no_grad():  # as TorchModule.running() on CPU: no autocast in fp32
            expected, actual = models["windowed"](low, reference), models["flex"](low, reference)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)
    assert _compiles() - before == 2, "a chunk compiled after warm_up"


def test_the_family_warms_the_named_resolutions_at_load_and_any_other_canvas_once_before_its_first_chunk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wiring: MONOLOGUE_DIT_WARM_RESOLUTIONS' canvases compile when the SR module loads, another canvas
    compiles once, ahead of its first forward, and never again."""
    from gpu_worker.models.dit import build_family
    from gpu_worker.models.dit.checkpoint import Weights
    from gpu_worker.models.dit.roles import DiTSuperResolution
    from gpu_worker.models.dit.runtime import DiTLatents

    warmed: list[tuple[int, int]] = []
    monkeypatch.setattr(SuperResolutionDiT, "warm_up", lambda self, height, width: warmed.append((height, width)))
    monkeypatch.setenv("MONOLOGUE_DIT_WARM_RESOLUTIONS", "512, 720p")
    module = build_family(Weights(TINY, seed=1)).super_resolution
    assert isinstance(module, DiTSuperResolution)
    module.load()
    stride = TINY.vae.stride
    assert warmed == [(512 // stride, 512 // stride), (736 // stride, 1280 // stride)]
    reference = {"reference_latents": torch.zeros(TINY.latent_channels, 8, 8).numpy()}
    low = torch.zeros(TINY.latent_channels, 1, 8 // TINY.sr.scale, 8 // TINY.sr.scale)
    for _ in range(2):
        module.upscale(reference, DiTLatents(low))
    assert warmed[2:] == [(8, 8)]
