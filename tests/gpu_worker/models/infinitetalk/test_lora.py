"""A distilled LoRA merges once into the DiT as it loads: both published layouts give the same weights, the merged
model computes what the plain model plus the LoRA's low-rank branch computes, strength 0 changes nothing, and a
file that does not fit is refused with every key that does not."""

from __future__ import annotations

from pathlib import Path

import pytest
import safetensors.torch
import torch
from torch import Tensor, nn

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.models.infinitetalk import layout, rename
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.lora import LoraFile

RANK, ALPHA = 4, 8.0  # alpha / rank = 2: folding it into lora_A (diffusers' layout) is exact in fp32
# Original names of the layers the LoRA updates: the Wan parts lightx2v's files cover, the adapter, the head.
TARGETS = (
    "blocks.0.self_attn.q",
    "blocks.1.self_attn.o",
    "blocks.0.cross_attn.k_img",
    "blocks.1.cross_attn.v",
    "blocks.0.ffn.0",
    "blocks.1.ffn.2",
    "blocks.1.audio_cross_attn.kv_linear",
    "time_projection.1",
    "head.head",
)
BIAS_DIFF = "blocks.0.ffn.2"  # a `diff_b`: a bias difference without a low-rank pair


def _shapes() -> dict[str, tuple[int, ...]]:
    wan, adapter = layout.dit_layout(TINY.dit)
    return wan | adapter


def _factors(seed: int = 0) -> dict[str, tuple[Tensor, Tensor]]:
    """(up (out, rank), down (rank, in)) per target, large enough that a wrong merge shows."""
    generator, shapes = torch.Generator().manual_seed(seed), _shapes()
    factors = {}
    for name in TARGETS:
        out, inp = shapes[f"{name}.weight"]
        factors[name] = (
            torch.randn(out, RANK, generator=generator) / RANK,
            torch.randn(RANK, inp, generator=generator),
        )
    return factors


def _bias_diff() -> Tensor:
    return torch.randn(_shapes()[f"{BIAS_DIFF}.bias"], generator=torch.Generator().manual_seed(1))


def _write(path: Path, tensors: dict[str, Tensor]) -> Path:
    safetensors.torch.save_file({key: value.contiguous() for key, value in tensors.items()}, path)
    return path


def _original_layout(path: Path) -> Path:
    """As lightx2v's and Kijai's files: the original names under diffusion_model., lora_down/lora_up, alpha."""
    tensors = {}
    for name, (up, down) in _factors().items():
        tensors |= {
            f"diffusion_model.{name}.lora_down.weight": down,
            f"diffusion_model.{name}.lora_up.weight": up,
            f"diffusion_model.{name}.alpha": torch.tensor(ALPHA),
        }
    return _write(path, tensors | {f"diffusion_model.{BIAS_DIFF}.diff_b": _bias_diff()})


def _diffusers_layout(path: Path) -> Path:
    """As diffusers saves a Wan LoRA: diffusers' module names under transformer., lora_A/lora_B, alpha folded
    into lora_A, a bias difference as PEFT's lora_B.bias. The names are written here by hand, not through
    rename.py, so a wrong rename in the map fails this test."""
    diffusers = {
        "blocks.0.self_attn.q": "blocks.0.attn1.to_q",
        "blocks.1.self_attn.o": "blocks.1.attn1.to_out.0",
        "blocks.0.cross_attn.k_img": "blocks.0.attn2.add_k_proj",
        "blocks.1.cross_attn.v": "blocks.1.attn2.to_v",
        "blocks.0.ffn.0": "blocks.0.ffn.net.0.proj",
        "blocks.1.ffn.2": "blocks.1.ffn.net.2",
        "blocks.1.audio_cross_attn.kv_linear": "blocks.1.audio_cross_attn.kv_linear",
        "time_projection.1": "condition_embedder.time_proj",
        "head.head": "proj_out",
    }
    tensors = {}
    for name, (up, down) in _factors().items():
        ours = diffusers[name]
        tensors |= {f"transformer.{ours}.lora_A.weight": down * (ALPHA / RANK), f"transformer.{ours}.lora_B.weight": up}
    return _write(path, tensors | {"transformer.blocks.0.ffn.net.2.lora_B.bias": _bias_diff()})


def _dit(root: Path, lora: LoraFile | None, dtype: torch.dtype = torch.float32) -> nn.Module:
    return InfiniteTalkWeights(TINY, Locations.under(root), lora).build("dit", dtype)


def test_both_published_layouts_merge_to_the_same_weights(tiny_weights: Path, tmp_path: Path) -> None:
    original = _dit(tiny_weights, LoraFile(_original_layout(tmp_path / "original.safetensors"), 0.8)).state_dict()
    diffusers = _dit(tiny_weights, LoraFile(_diffusers_layout(tmp_path / "diffusers.safetensors"), 0.8)).state_dict()
    plain = _dit(tiny_weights, None).state_dict()
    changed = sorted(key for key in plain if not torch.equal(plain[key], original[key]))
    keymap = rename.dit_map()
    expected = [keymap.ours(f"{name}.weight")[0] for name in TARGETS] + [keymap.ours(f"{BIAS_DIFF}.bias")[0]]
    assert changed == sorted(expected)
    assert all(torch.equal(original[key], diffusers[key]) for key in plain)


def test_a_merged_model_computes_the_plain_model_plus_the_lora_branch(tiny_weights: Path, tmp_path: Path) -> None:
    """The merged DiT's forward against the unmerged DiT with each LoRA computed beside its layer by plain matmuls
    (y = W x + b + strength (alpha / rank) up (down x)), on random inputs."""
    strength = 0.7
    merged = _dit(tiny_weights, LoraFile(_original_layout(tmp_path / "lora.safetensors"), strength))
    plain = _dit(tiny_weights, None)
    keymap, modules = rename.dit_map(), dict(plain.named_modules())

    def branch(up: Tensor, down: Tensor) -> object:
        def hook(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
            return output + strength * (ALPHA / RANK) * ((args[0] @ down.T) @ up.T)

        return hook

    def shift(module: nn.Module, args: tuple[Tensor, ...], output: Tensor) -> Tensor:
        return output + strength * _bias_diff()

    def layer(name: str) -> nn.Module:
        return modules[keymap.ours(f"{name}.weight")[0].removesuffix(".weight")]

    for name, (up, down) in _factors().items():
        layer(name).register_forward_hook(branch(up, down))  # type: ignore[arg-type]
    layer(BIAS_DIFF).register_forward_hook(shift)
    generator, dit = torch.Generator().manual_seed(5), TINY.dit
    latents = 3
    inputs = (
        torch.randn(1, dit.in_dim, latents, 4, 6, generator=generator),
        torch.tensor([700.0]),
        torch.randn(1, dit.text_len, dit.text_dim, generator=generator),
        torch.randn(1, 257, dit.image_dim, generator=generator),
        torch.randn(
            1, 1 + 4 * (latents - 1), dit.audio_window, dit.audio_blocks, dit.audio_channels, generator=generator
        ),
    )
    with torch.no_grad():
        expected, actual, unmerged = plain(*inputs), merged(*inputs), _dit(tiny_weights, None)(*inputs)
    assert not torch.allclose(actual, unmerged, atol=1e-3)  # the LoRA changes the output
    torch.testing.assert_close(actual, expected, atol=2e-5, rtol=1e-4)


def test_strength_zero_changes_no_weight(tiny_weights: Path, tmp_path: Path) -> None:
    lora = LoraFile(_original_layout(tmp_path / "lora.safetensors"), 0.0)
    for dtype in (torch.float32, torch.bfloat16):  # bf16: the file's values + 0, rounded once, as without a LoRA
        merged, plain = _dit(tiny_weights, lora, dtype).state_dict(), _dit(tiny_weights, None, dtype).state_dict()
        assert all(torch.equal(merged[key], plain[key]) for key in plain), dtype


def test_a_lora_that_does_not_fit_is_refused_naming_every_key(tiny_weights: Path, tmp_path: Path) -> None:
    dim, rank = TINY.dit.dim, RANK
    bad = {
        "diffusion_model.blocks.0.self_attn.zz.lora_down.weight": torch.zeros(rank, dim),  # no such layer
        "diffusion_model.blocks.0.self_attn.zz.lora_up.weight": torch.zeros(dim, rank),
        "diffusion_model.blocks.9.ffn.0.lora_down.weight": torch.zeros(rank, dim),  # no block 9 in the tiny DiT
        "diffusion_model.blocks.0.self_attn.q.lora_down.weight": torch.zeros(rank, dim),
        "diffusion_model.blocks.0.self_attn.q.lora_up.weight": torch.zeros(dim + 1, rank),  # misshapen
        "diffusion_model.blocks.1.cross_attn.k.lora_down.weight": torch.zeros(rank, dim),  # no lora_up
        "transformer.blocks.0.attn1.to_k.lora_A.weight": torch.zeros(rank, dim),
        "transformer.blocks.0.attn1.to_k.lora_B.weight": torch.zeros(dim, rank + 1),  # ranks differ
        "lora_unet_blocks_0_self_attn_v.lora_down.weight": torch.zeros(rank, dim),  # kohya's flat names
        "diffusion_model.blocks.0.norm3.diff": torch.zeros(dim + 2),  # a difference of the wrong shape
        "diffusion_model.blocks.1.ffn.2.lora_down.weight": torch.zeros(rank, TINY.dit.ffn_dim),  # fits: not named
        "diffusion_model.blocks.1.ffn.2.lora_up.weight": torch.zeros(dim, rank),
    }
    path = _write(tmp_path / "bad.safetensors", bad)
    weights = InfiniteTalkWeights(TINY, Locations.under(tiny_weights), LoraFile(path))
    for shapes_only in (True, False):  # node start reads the header alone; the load the tensors
        with pytest.raises(CheckpointError) as caught:
            weights.state("dit", weights.empty("dit"), torch.float32, shapes_only=shapes_only)
        message = str(caught.value)
        assert str(path) in message and "(8 problems)" in message, message
        for key in list(bad)[:-2]:
            if key != "diffusion_model.blocks.0.self_attn.q.lora_down.weight":
                assert repr(key) in message, key
        assert f"({dim + 1}, {rank})" in message and f"({dim},)" in message  # the file's and the model's shapes
        assert "ffn.2" not in message
