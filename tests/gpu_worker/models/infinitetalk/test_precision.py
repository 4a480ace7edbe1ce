"""The DiT's precisions are the original's (multitalk_model.py): on a bf16 model the modulation (time embedding,
time_proj) and the output head (norm_out, its scale/shift, proj_out) keep fp32 parameters and compute in fp32 even
under the runtime's bf16 autocast, equal to an fp32 model's; the rotary tables are float64 (the original's
rope_params), not diffusers' fp32 rounding of them; the VAE runs in fp32 and CLIP in fp16, as the original's; the
prompt is cleaned as the original's tokenizer cleans it (ftfy)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

from gpu_worker.distributed import RankContext, RankGroup, shard_model
from gpu_worker.models.dit.runtime import Precision
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.encoders import clean_prompt, encode_image
from gpu_worker.models.infinitetalk.reference import InfiniteTalkReference
from gpu_worker.models.infinitetalk.vae import encode
from tests.gpu_worker.distributed.worlds import attempt, spawn_world


def _dit(root: Path, dtype: torch.dtype) -> InfiniteTalkDiT:
    model = InfiniteTalkWeights(TINY, Locations.under(root)).build("dit", dtype)
    assert isinstance(model, InfiniteTalkDiT)
    return model


def test_the_modulation_and_head_of_a_bf16_model_are_fp32_and_equal_an_fp32_reference(tiny_weights: Path) -> None:
    low, full = _dit(tiny_weights, torch.bfloat16), _dit(tiny_weights, torch.float32)
    for name, parameter in low.named_parameters():
        kept = name.startswith(InfiniteTalkDiT.FP32_PARAMETERS)
        assert parameter.dtype == (torch.float32 if kept else torch.bfloat16), name
    assert any(name.startswith("blocks.") for name, _ in low.named_parameters())  # the blocks stay bf16
    timestep = torch.tensor([999.0, 412.5])
    hidden = torch.randn(2, 24, TINY.dit.dim, generator=torch.Generator().manual_seed(0)).bfloat16()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # as TorchModule.running() runs a bf16 model
        time, modulation = low.modulation(timestep)
        out = low.head(hidden, time)
    with torch.no_grad():
        want_time, want_modulation = full.modulation(timestep)
        want_out = full.head(hidden, want_time)
    for got, want in ((time, want_time), (modulation, want_modulation), (out, want_out)):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # The contrast: the same head in bf16 (as before) is measurably off the fp32 one.
    with torch.no_grad():
        shift, scale = (low.scale_shift_table.bfloat16() + time.bfloat16().unsqueeze(1)).chunk(2, dim=1)
        normed = (low.norm_out(hidden.float()) * (1 + scale) + shift).bfloat16()
        rounded = torch.nn.functional.linear(normed, low.proj_out.weight.bfloat16(), low.proj_out.bias.bfloat16())
    assert not torch.allclose(rounded.float(), want_out, rtol=1e-6, atol=1e-6)


def test_a_bf16_model_s_velocity_is_fp32_and_its_rotary_tables_float64(tiny_weights: Path) -> None:
    low = _dit(tiny_weights, torch.bfloat16)
    config = TINY.dit
    latents = torch.randn(1, config.in_dim, 2, 4, 4)
    cos, sin = low.rope(latents)
    assert cos.dtype == sin.dtype == torch.float64
    # diffusers' tables are the same float64 values rounded to fp32; the layout (interleaved pairs) is theirs.
    want_cos, want_sin = WanRotaryPosEmbed(config.head_dim, config.patch_size, 1024)(latents)
    assert torch.equal(cos.float(), want_cos) and torch.equal(sin.float(), want_sin)
    text = torch.randn(1, 512, config.text_dim)
    image = torch.randn(1, 257, config.image_dim)
    audio = torch.randn(1, 5, config.audio_window, config.audio_blocks, config.audio_channels)  # 1 + 4 (T - 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        velocity = low(latents, torch.tensor([500.0]), text, image, audio)
    assert velocity.dtype == torch.float32 and velocity.shape == (1, config.out_dim, 2, 4, 4)
    assert torch.isfinite(velocity).all()


def test_below_fp32_the_vae_and_clip_load_and_run_in_the_original_s_fp32_and_fp16(tiny_weights: Path) -> None:
    """A bf16 module (as on CUDA) keeps the VAE fp32 and CLIP fp16; under its bf16 autocast the VAE's encoding is
    an fp32 VAE's, bit for bit, and CLIP's tokens are an fp16 CLIP's. A CPU node (fp32) keeps everything fp32."""
    weights = InfiniteTalkWeights(TINY, Locations.under(tiny_weights))
    module = InfiniteTalkReference(weights, Precision.BF16)
    module.load()
    vae, clip = module.models["vae"], module.models["clip"]
    assert next(vae.parameters()).dtype == torch.float32 and next(clip.parameters()).dtype == torch.float16
    assert [module.model_dtype(name) for name in ("vae", "clip")] == [torch.float32, torch.float16]
    image = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    with module.running():
        latent = encode(vae, image[:, :, None])  # type: ignore[arg-type]
        tokens = encode_image(clip, image, TINY.clip.image_size)  # type: ignore[arg-type]
    with torch.no_grad():
        want_latent = encode(weights.build("vae"), image[:, :, None])  # type: ignore[arg-type]
        with torch.autocast("cpu", dtype=torch.float16):
            want_tokens = encode_image(weights.build("clip", torch.float16), image, TINY.clip.image_size)  # type: ignore[arg-type]
    assert torch.equal(latent, want_latent)
    torch.testing.assert_close(tokens, want_tokens)
    cpu = InfiniteTalkReference(weights, Precision.FP32)
    cpu.dtype = torch.float32
    assert [cpu.model_dtype(name) for name in ("vae", "clip")] == [torch.float32, torch.float32]


def test_a_prompt_is_cleaned_as_the_original_s_tokenizer_cleans_it() -> None:
    """tokenizers.py basic_clean (ftfy.fix_text, HTML entities twice) + whitespace_clean."""
    assert clean_prompt("  \u201cHello\u201d,\n  she said &amp;amp; smiled ") == '"Hello", she said & smiled'
    assert clean_prompt("The caf\u00c3\u00a9 is open") == "The caf\u00e9 is open"  # mojibake repaired
    assert clean_prompt("e\u0301t\u00e9") == "\u00e9t\u00e9"  # NFC


@dataclass(frozen=True)
class ShardedForward:
    """The tiny bf16 DiT (fp32 modulation and head) plain and sharded with FSDP2 over the ranks, under bf16 autocast."""

    root: str

    def run(self, context: RankContext) -> dict[str, Any]:
        plain, sharded = _dit(Path(self.root), torch.bfloat16), _dit(Path(self.root), torch.bfloat16)
        model = shard_model(sharded, context.group.mesh)
        config, generator = TINY.dit, torch.Generator().manual_seed(2)
        inputs = (
            torch.randn(1, config.in_dim, 2, 4, 4, generator=generator),
            torch.tensor([500.0]),
            torch.randn(1, 512, config.text_dim, generator=generator),
            torch.randn(1, 257, config.image_dim, generator=generator),
            torch.randn(1, 5, config.audio_window, config.audio_blocks, config.audio_channels, generator=generator),
        )
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            return {"plain": plain(*inputs).numpy(), "sharded": model(*inputs).numpy()}


def _drive_sharded(root: str, group: RankGroup) -> dict[str, Any]:
    return attempt(partial(group.gather_from_all, ShardedForward(root)))


def test_fsdp2_shards_the_mixed_dtype_dit_and_computes_what_it_computes_plain(
    tiny_weights: Path, tmp_path: Path
) -> None:
    """The fp32 parameters among bf16 ones: FSDP2 gathers each group in its parameters' own dtypes."""
    results, _ = spawn_world(partial(_drive_sharded, str(tiny_weights)), tmp_path, deadline_s=120)
    assert "error" not in results, results.get("traceback")
    for rank, seen in enumerate(results["value"]):
        assert np.abs(seen["plain"]).max() > 1e-3
        np.testing.assert_allclose(seen["sharded"], seen["plain"], rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}")
