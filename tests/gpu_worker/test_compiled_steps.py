"""Compiled DiT steps (gpu_worker/compiled.py) on the tiny presets, on CPU with the cheap backend: they compute what
the eager forwards compute, compile once per warmed bucket and never in a chunk, and compile nothing when off."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from gpu_worker.compiled import CompiledStep, StepCompile, compiled_step, graphs_compiled, use
from gpu_worker.models.dit import SMOKE_SEED, build_family
from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.roles import DiTAudioToVideo, DiTSuperResolution
from gpu_worker.models.dit.warm import a2v_inputs, sr_inputs, steady_chunks
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.module import Decoder, Reference
from monologue.contracts import Family, RenderOptions
from monologue.plan import chunk_sizes, plan_chunks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    """Dynamo's cache belongs to a forward's code, shared by every model of an architecture: each test starts
    from none, so its counts are its own."""
    torch._dynamo.reset()
    use(None)


def _a2v_inputs(frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, A2VConditioning]:
    generator = torch.Generator().manual_seed(seed)
    channels, audio = TINY.latent_channels, TINY.audio
    noise, cond = a2v_inputs(TINY, "512", replace(steady_chunks(TINY)[1], latents=frames), "cpu")
    cond = replace(
        cond,
        reference=torch.randn(cond.reference.shape, generator=generator),
        boundary=torch.randn(cond.boundary.shape, generator=generator),
        boundary_times=torch.tensor([-2.0, -1.0]),
        audio=torch.randn(1, cond.audio.shape[1], audio.tokens_per_frame, audio.dim, generator=generator),
        audio_times=torch.arange(cond.audio.shape[1], dtype=torch.float32) - 2,
    )
    return torch.randn(1, channels, frames, *noise.shape[-2:], generator=generator), torch.full((1,), 0.9), cond


def _a2v() -> AudioToVideoDiT:
    model = Weights(TINY, seed=1).build("a2v")
    assert isinstance(model, AudioToVideoDiT)
    return model


def test_compiled_steps_equal_the_eager_forwards_bit_for_bit() -> None:
    """The A2V and SR DiTs of the dit family and infinitetalk's Wan DiT, each at one warmed bucket."""
    from gpu_worker.models.infinitetalk.config import TINY as WAN_TINY
    from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT

    wan, dit = InfiniteTalkDiT(WAN_TINY.dit).eval(), WAN_TINY.dit
    generator = torch.Generator().manual_seed(3)
    wan_inputs = (
        torch.randn(1, dit.in_dim, 3, 8, 8, generator=generator),
        torch.full((1,), 900.0),
        torch.randn(1, 8, dit.text_dim, generator=generator),
        torch.randn(1, 5, dit.image_dim, generator=generator),
        torch.randn(1, 9, dit.audio_window, dit.audio_blocks, dit.audio_channels, generator=generator),
    )
    low = torch.randn(1, TINY.latent_channels, 5, 4, 4, generator=generator)
    cases = [
        (_a2v(), _a2v_inputs(3, seed=2)),
        (Weights(TINY, seed=1).build("sr"), (low, torch.randn(1, TINY.latent_channels, 8, 8, generator=generator))),
        (wan, wan_inputs),
    ]
    with torch.no_grad():
        for model, inputs in cases:
            step = CompiledStep(model, "cpu", enabled=True)
            step.warm_up(*inputs)
            assert sum(step.compiles.values()) == 1, type(model).__name__  # one whole graph: no graph break
            assert torch.equal(step(*inputs), model(*inputs)), type(model).__name__


def test_after_warm_up_steps_at_the_bucket_compile_nothing_and_a_new_bucket_compiles_once() -> None:
    """Chunks at a warmed bucket run the compiled graph without a compile; warming a second bucket compiles
    exactly one more graph; a bucket never warmed runs eagerly, compiling nothing, with the same result."""
    model = _a2v()
    step = CompiledStep(model, "cpu", enabled=True)
    with torch.no_grad():
        step.warm_up(*_a2v_inputs(3, seed=0))
        before = graphs_compiled()
        for seed in range(1, 4):  # three chunks of the warmed bucket, other values
            step(*_a2v_inputs(3, seed))
        assert graphs_compiled() == before
        step.warm_up(*_a2v_inputs(4, seed=5))
        assert graphs_compiled() == before + 1
        step.warm_up(*_a2v_inputs(4, seed=6))  # warmed already: nothing more
        unwarmed = _a2v_inputs(5, seed=7)
        assert torch.equal(step(*unwarmed), model(*unwarmed))
        assert graphs_compiled() == before + 1
        assert list(step.eager_steps.values()) == [1]
    assert sorted(step.compiles.values()) == [1, 1]


def test_hooks_on_the_model_run_around_the_compiled_step_and_hooks_inside_it_make_it_eager() -> None:
    """A hook on the model itself (the bench's argument capture) sees every step, which still runs its compiled
    graph; hooks on its blocks (switch residency streaming them in, FSDP) turn the step eager."""
    model = _a2v()
    step = CompiledStep(model, "cpu", enabled=True)
    seen: list[int] = []
    with torch.no_grad():
        step.warm_up(*_a2v_inputs(3, seed=0))
        handle = model.register_forward_pre_hook(lambda _model, args: seen.append(args[0].shape[2]))
        before = graphs_compiled()
        step(*_a2v_inputs(3, seed=1))
        assert (seen, graphs_compiled(), dict(step.eager_steps)) == ([3], before, {})
        handle.remove()
        model.blocks[0].register_forward_pre_hook(lambda _block, args: None)
        inputs = _a2v_inputs(3, seed=2)
        with torch.compiler.set_stance("fail_on_recompile"):  # eager: nothing even asks Dynamo
            assert torch.equal(step(*inputs), model(*inputs))
        assert graphs_compiled() == before


def _session_chunks(pipeline: Pipeline, seconds: float = 4.0) -> list[ChunkRequest]:
    """A default session's N0, N1 and I0 at 512 (the steady-state shapes; the ragged last chunk left out)."""
    sizes = chunk_sizes(RenderOptions(family=Family.DIT))
    plan = plan_chunks(int(seconds * 25), n_frames=sizes["n_frames"], i_frames=sizes["i_frames"], stride=4)
    return [ChunkRequest(spec, seed=1) for spec in plan[:3]]


class _Frames:
    def write(self, frames: np.ndarray) -> None:
        pass


class _NoDecoder(Decoder):
    """Black frames: the VAE decode (most of a tiny chunk's CPU time at 512) has no step to compile."""

    def decode(self, reference: Reference, upscaled: Any) -> np.ndarray:
        width, height = (int(v) for v in reference["frame_size"])
        return np.zeros((upscaled.video_frames, height, width, 3), dtype=np.uint8)


def test_the_family_compiles_its_warm_buckets_at_load_and_no_chunk_of_a_session_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MONOLOGUE_COMPILE_STEPS=on: loading compiles one A2V and one SR graph per steady-state chunk shape at the
    warm resolution; a default session's first N, next N and I chunks at that resolution then compile nothing."""
    monkeypatch.setenv("MONOLOGUE_COMPILE_STEPS", "on")
    monkeypatch.setenv("MONOLOGUE_DIT_WARM_RESOLUTIONS", "512")
    pipeline = Pipeline(replace(build_family(Weights(TINY, seed=SMOKE_SEED)), decoder=_NoDecoder()))
    steps = [
        compiled_step(module.models[name], "cpu")
        for module, name in ((pipeline.models.audio_to_video, "a2v"), (pipeline.models.super_resolution, "sr"))
    ]
    shapes = len(steady_chunks(TINY))
    assert [sorted(step.compiles.values()) for step in steps] == [[1] * shapes, [1] * shapes]
    rng = np.random.default_rng(0)
    audio = ArrayAudio((0.1 * rng.standard_normal(4 * 16_000)).astype(np.float32))
    portrait = rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)
    session = pipeline.start_session(portrait, OutputSpec(fps=25, resolution="512"), audio)
    before = graphs_compiled()
    for request in _session_chunks(pipeline):
        pipeline.run_chunk(session, request, _Frames())
    assert graphs_compiled() == before
    assert [sorted(step.compiles.values()) for step in steps] == [[1] * shapes, [1] * shapes]
    assert [dict(step.eager_steps) for step in steps] == [{}, {}], "a chunk's step missed the warm buckets"


def test_with_the_setting_off_nothing_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """off (and auto on a CPU): the roles load without warming and every step runs the eager model."""
    monkeypatch.setenv("MONOLOGUE_DIT_WARM_RESOLUTIONS", "512")
    for setting in ("off", "auto"):
        monkeypatch.setenv("MONOLOGUE_COMPILE_STEPS", setting)
        torch._dynamo.reset()
        before = graphs_compiled()
        models = build_family(Weights(TINY, seed=SMOKE_SEED))
        for module in (models.audio_to_video, models.super_resolution):
            assert isinstance(module, DiTAudioToVideo | DiTSuperResolution)
            module.load()
        model = models.super_resolution.models["sr"]
        step = compiled_step(model, "cpu")
        with torch.no_grad():
            step.warm_up(*sr_inputs(TINY, "512", steady_chunks(TINY)[0], "cpu"))
        assert not step.enabled and not step.warmed
        assert graphs_compiled() == before, setting


def test_the_setting_is_checked() -> None:
    assert StepCompile.from_environ({}) is StepCompile.OFF  # until a GPU run measures the gain
    assert StepCompile.AUTO.enabled("cuda:0") and not StepCompile.AUTO.enabled("cpu")
    with pytest.raises(ValueError, match="MONOLOGUE_COMPILE_STEPS must be one of auto, on, off, got 'yes'"):
        StepCompile.from_environ({"MONOLOGUE_COMPILE_STEPS": "yes"})
