"""The dit decoder's per-frame stage as a compiled step (decoder.py, `MONOLOGUE_COMPILE_DECODER`), on the tiny
preset on CPU with the cheap backend (the traced graph on the eager kernels): compiled once per warm canvas at load,
never in a chunk, the frames the eager decoder makes, and compiled under sequence parallelism too (no collectives)."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
import torch

from gpu_worker.compiled import CompiledStep, StepCompile, compiled_step, decoder_setting, graphs_compiled
from gpu_worker.distributed.sequence import SPGroup, sequence_parallel
from gpu_worker.models.dit import SMOKE_SEED, build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.decoder import DiTDecoder
from gpu_worker.models.dit.reference import named_canvas
from gpu_worker.models.dit.roles import ChunkLatents
from gpu_worker.models.dit.vae import SpatialStage, VAEDecoder

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def _decoder(monkeypatch: pytest.MonkeyPatch, setting: str) -> DiTDecoder:
    monkeypatch.setenv("MONOLOGUE_COMPILE_DECODER", setting)
    monkeypatch.setenv("MONOLOGUE_DIT_WARM_RESOLUTIONS", "512")
    decoder = build_family(Weights(TINY, seed=SMOKE_SEED)).decoder
    assert isinstance(decoder, DiTDecoder) and decoder.warm_resolutions == ("512",)
    decoder.load()
    return decoder


def _chunk(seed: int) -> tuple[dict[str, object], ChunkLatents]:
    """A reference at the 512 canvas and a steady N chunk: 10 latents (40 frames) after 4 of decoder context."""
    width, height = named_canvas(TINY, "512")
    generator = torch.Generator().manual_seed(seed)
    shape = (TINY.vae.latent_channels, height // TINY.vae.stride, width // TINY.vae.stride)
    frames, context = (torch.randn(shape[0], count, *shape[1:], generator=generator) for count in (10, 4))
    return {"frame_size": (width, height), "canvas_size": (width, height)}, ChunkLatents(frames, context)


def _step(decoder: DiTDecoder) -> CompiledStep:
    return decoder._spatial(decoder.model("vae_decoder", VAEDecoder))


def test_the_decoder_compiles_its_stage_at_load_and_decodes_the_eager_frames_without_compiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    start = graphs_compiled()  # Dynamo's counters outlive its reset: earlier tests' graphs are in it
    eager = _decoder(monkeypatch, "off")
    assert not _step(eager).enabled and graphs_compiled() == start
    compiled = _decoder(monkeypatch, "on")
    step = _step(compiled)
    # The one warm canvas, in the tiny preset's batches of 16 frames: a 40-frame N chunk's 16 and 8, an I chunk's 4.
    assert sorted(shape[0][0][0] for shape in step.compiles) == [4, 8, 16] and set(step.compiles.values()) == {1}
    before = graphs_compiled()
    for seed in (1, 2):  # two chunks of a warm shape, other values
        reference, latents = _chunk(seed)
        frames = compiled.decode(reference, latents)
        assert frames.shape[0] == 40 and frames.dtype == np.uint8
        assert np.array_equal(frames, eager.decode(reference, latents))  # the CPU backend: bit for bit
    assert graphs_compiled() == before and dict(step.eager_steps) == {}
    assert sum(step.compiled_steps.values()) == 2 * 3  # each chunk's batches (16, 16, 8) ran the graphs


def test_a_canvas_never_warmed_decodes_eagerly(monkeypatch: pytest.MonkeyPatch) -> None:
    decoder = _decoder(monkeypatch, "on")
    _, latents = _chunk(3)
    smaller = ChunkLatents(latents.frames[..., :-1, :-1], latents.context[..., :-1, :-1])  # type: ignore[index]
    width, height = (size - TINY.vae.stride for size in named_canvas(TINY, "512"))
    before = graphs_compiled()
    decoder.decode({"frame_size": (width, height), "canvas_size": (width, height)}, smaller)
    assert graphs_compiled() == before and sum(_step(decoder).eager_steps.values()) == 3  # 16 + 16 + 8


def test_the_stage_compiles_under_sequence_parallelism_and_a_step_with_collectives_does_not() -> None:
    stage = SpatialStage(VAEDecoder(TINY.vae))
    free, other = CompiledStep(stage, "cpu", True, collective_free=True), CompiledStep(stage, "cpu", True)
    with sequence_parallel(cast(SPGroup, object())):
        assert free.active and not other.active
    assert free.active and other.active


def test_the_setting_defaults_to_auto_and_is_checked() -> None:
    assert decoder_setting({}) is StepCompile.AUTO  # compiled with CUDA, eager on a CPU
    assert decoder_setting({"MONOLOGUE_COMPILE_DECODER": "OFF"}) is StepCompile.OFF
    with pytest.raises(ValueError, match="MONOLOGUE_COMPILE_DECODER must be one of auto, on, off, got 'yes'"):
        decoder_setting({"MONOLOGUE_COMPILE_DECODER": "yes"})
    assert compiled_step(SpatialStage(VAEDecoder(TINY.vae)), "cpu", StepCompile.AUTO).enabled is False
