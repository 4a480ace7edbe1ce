"""The sampling presets: `fast` is lightx2v's 4-step schedule with guidance off (one DiT pass per step, counted),
its FLOPs are the counted figure (pinned for the real 14B DiT at 480p), it is deterministic, and a node without a
distilled LoRA refuses it naming the setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import FAST_SAMPLING, QUALITY_SAMPLING, TINY, WAN_14B, SamplingConfig
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.flops import step_flops
from gpu_worker.models.infinitetalk.lora import LORA_ENV, LoraFile
from gpu_worker.models.infinitetalk.roles import InfiniteTalkAudioToVideo
from gpu_worker.models.infinitetalk.sampling import sample, timesteps
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from monologue import contracts as c
from monologue.errors import InputError
from tests.gpu_worker.models.infinitetalk.test_lora import _original_layout

LATENTS, HEIGHT, WIDTH = 3, 4, 6  # a tiny clip: 3 latent frames of 4x6 latents


def _dit() -> InfiniteTalkDiT:
    torch.manual_seed(0)
    return InfiniteTalkDiT(TINY.dit).eval()


def _sample(model: InfiniteTalkDiT, sampling: SamplingConfig, seed: int) -> Tensor:
    """One clip from `seed`'s noise, the first latent kept clean, as the A2V role samples it."""
    dit, rng = TINY.dit, np.random.default_rng(seed)

    def draw(*shape: int) -> Tensor:
        return torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))

    noise, condition = draw(dit.out_dim, LATENTS, HEIGHT, WIDTH), draw(dit.in_dim - dit.out_dim, LATENTS, HEIGHT, WIDTH)
    text, negative, image = draw(dit.text_len, dit.text_dim), draw(dit.text_len, dit.text_dim), draw(257, dit.image_dim)
    audio = draw(1 + 4 * (LATENTS - 1), dit.audio_window, dit.audio_blocks, dit.audio_channels)
    schedule = timesteps(sampling.steps, sampling.shift_480, sampling.num_timesteps, sampling.spacing)
    with torch.no_grad():
        return sample(model, sampling, noise, condition, (text, negative, image, audio), [(0, noise[:, :1])], schedule)


def test_fast_is_lightx2vs_four_step_schedule() -> None:
    """lightx2v's WanStepDistillScheduler: denoising_step_list [1000, 750, 500, 250] on sigmas shifted by 5."""
    shifted = [1000 * 5 * s / (1 + 4 * s) for s in (1.0, 0.75, 0.5, 0.25)]
    assert timesteps(4, FAST_SAMPLING.shift_480, 1000, FAST_SAMPLING.spacing) == pytest.approx([*shifted, 0.0])
    assert (FAST_SAMPLING.steps, FAST_SAMPLING.passes, QUALITY_SAMPLING.steps, QUALITY_SAMPLING.passes) == (4, 1, 40, 3)
    assert WAN_14B.sampler(c.SamplingPreset.FAST) is FAST_SAMPLING


@pytest.mark.parametrize(
    ("sampling", "batches"),
    [(FAST_SAMPLING, [1, 1, 1, 1]), (TINY.sampling, [3, 3])],
    ids=["fast: one pass per step", "quality: text and audio guidance, three"],
)
def test_each_step_runs_the_presets_passes(sampling: SamplingConfig, batches: list[int]) -> None:
    model, seen = _dit(), []
    model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[0]))
    _sample(model, sampling, seed=1)
    assert seen == batches


def test_a_fast_clips_flops_are_the_counted_figure() -> None:
    """A real fast clip's FLOPs against flops.py's meta-device count (attention by the math kernel: the CPU's fused
    one is invisible to FlopCounterMode; on the meta device attention decomposes to the same products)."""
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        _sample(_dit(), FAST_SAMPLING, seed=1)
    counted = step_flops(TINY, WIDTH * 8, HEIGHT * 8, LATENTS, FAST_SAMPLING)
    assert counter.get_total_flops() == FAST_SAMPLING.steps * counted > 0


def test_the_fast_preset_costs_101_tflop_of_dit_per_480p_frame() -> None:
    """The real 14B DiT on the meta device: a 72-frame chunk's clip (3 motion + 18 latents), 4 steps of one pass.
    The whole figure with the VAE's share (the same for both presets) is `flops --preset fast`, docs/benchmarks.md."""
    per_frame = FAST_SAMPLING.steps * step_flops(WAN_14B, 832, 480, 3 + 72 // 4, FAST_SAMPLING) / 72 / 1e12
    assert per_frame == pytest.approx(101.39, rel=0.01)  # quality: 3041.78, 30 times this (40 steps x 3 passes)


def test_the_same_seed_gives_the_same_latents() -> None:
    model = _dit()
    first, again, other = (_sample(model, FAST_SAMPLING, seed) for seed in (4, 4, 5))
    assert torch.equal(first, again) and not torch.equal(first, other)


class _Discard:
    def write(self, frames: np.ndarray) -> None:
        pass


def test_a_fast_render_on_a_lora_node_gives_the_same_frames_on_a_fresh_node(tiny_weights: Path, tmp_path: Path) -> None:
    """Through the Pipeline: the LoRA merged at load, N0 sampled by the fast preset; a second node (a fresh pipeline)
    renders the same frame hashes, and the quality preset on the same node others."""
    lora = LoraFile(_original_layout(tmp_path / "lora.safetensors"), 1.0)
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    audio = ArrayAudio((0.3 * np.sin(np.arange(32_000) * 2 * np.pi * 220 / 16_000)).astype(np.float32))
    first, second = (
        Pipeline(build_family(InfiniteTalkWeights(TINY, Locations.under(tiny_weights), lora))) for _ in "ab"
    )
    hashes = []
    for pipeline, preset in (
        (first, c.SamplingPreset.FAST),
        (second, c.SamplingPreset.FAST),
        (second, c.SamplingPreset.QUALITY),
    ):
        session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
        request = ChunkRequest(c.Chunk(c.ChunkKind.N, 0, 0, 5), seed=3, sampling_preset=preset)
        hashes.append(pipeline.run_chunk(session, request, _Discard()).frame_hashes)
    assert len(hashes[0]) == 5 and hashes[0] == hashes[1] != hashes[2]


def test_a_node_without_a_distilled_lora_refuses_the_fast_preset(tiny_weights: Path) -> None:
    role = InfiniteTalkAudioToVideo(InfiniteTalkWeights(TINY, Locations.under(tiny_weights)))
    options = c.RenderOptions(family=c.Family.INFINITETALK, sampling_preset=c.SamplingPreset.FAST)
    request = ChunkRequest.of(c.Chunk(c.ChunkKind.N, 0, 0, 17), options)
    with pytest.raises(InputError, match=LORA_ENV):
        role._sampling(request)
    assert role._sampling(ChunkRequest.of(request.chunk, c.RenderOptions())) is TINY.sampling


def test_only_infinitetalk_sessions_may_ask_for_fast() -> None:
    with pytest.raises(ValueError, match="family=warp, sampling_preset=fast"):
        c.RenderOptions(sampling_preset=c.SamplingPreset.FAST)
    stored = {"family": "infinitetalk", "sampling_preset": "fast"}
    assert c.render_options(stored).sampling_preset is c.SamplingPreset.FAST
    assert c.render_options({"family": "infinitetalk"}).sampling_preset is c.SamplingPreset.QUALITY
