"""INT8 weights for infinitetalk's Wan DiT (`MONOLOGUE_INFINITETALK_QUANTIZE`, gpu_worker/quantize.py): which
layers are stored quantized, what they weigh, that a LoRA is merged before the weights are quantized, and that a
quantized chunk's frames stay near the float ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")

from gpu_worker.models import FAMILIES
from gpu_worker.models.infinitetalk import build_family
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY
from gpu_worker.models.infinitetalk.lora import LoraFile
from gpu_worker.models.infinitetalk.roles import InfiniteTalkAudioToVideo
from gpu_worker.pipeline import Pipeline
from gpu_worker.pipeline.types import ArrayAudio, ChunkRequest, OutputSpec
from gpu_worker.quantize import QuantizedLinear, QuantMode, tensor_bytes
from monologue.contracts import Family
from tests.gpu_worker.models.infinitetalk.test_family import CHUNKS, OPTIONS, Frames
from tests.gpu_worker.models.infinitetalk.test_lora import _original_layout


def _dit(root: Path, quantize: QuantMode, lora: LoraFile | None = None) -> nn.Module:
    family = build_family(InfiniteTalkWeights(TINY, Locations.under(root), lora), quantize=quantize)
    module = family.audio_to_video
    assert isinstance(module, InfiniteTalkAudioToVideo)
    module.load()
    return module.models["dit"]


def _block_linears(model: nn.Module, kind: type[nn.Module]) -> dict[str, nn.Module]:
    return {name: layer for name, layer in model.get_submodule("blocks").named_modules() if isinstance(layer, kind)}


def test_int8_stores_every_block_linear_quantized_and_nothing_outside_the_blocks(tiny_weights: Path) -> None:
    plain, int8 = _dit(tiny_weights, QuantMode.NONE), _dit(tiny_weights, QuantMode.INT8)
    linears = _block_linears(plain, nn.Linear)
    assert set(_block_linears(int8, QuantizedLinear)) == set(linears) and len(linears) >= 10 * TINY.dit.num_layers
    assert _block_linears(int8, nn.Linear) == {}
    outside = [name for name, layer in int8.named_modules() if isinstance(layer, QuantizedLinear)]
    assert all(name.startswith("blocks.") for name in outside)
    # Exactly: each fp32 weight's bytes become a quarter, plus one fp32 scale per output channel.
    saved = sum(3 * layer.weight.numel() * 4 // 4 - 4 * layer.out_features for layer in linears.values())
    assert tensor_bytes(plain) - tensor_bytes(int8) == saved


def test_a_lora_is_merged_in_float_before_the_weights_are_quantized(tiny_weights: Path, tmp_path: Path) -> None:
    lora = LoraFile(_original_layout(tmp_path / "lora.safetensors"), 0.8)
    merged, int8 = _dit(tiny_weights, QuantMode.NONE, lora), _dit(tiny_weights, QuantMode.INT8, lora)
    floats = _block_linears(merged, nn.Linear)
    for name, layer in _block_linears(int8, QuantizedLinear).items():
        assert isinstance(layer, QuantizedLinear)
        step = layer.scales[:, None]  # one int8 step per output channel
        assert torch.all((layer.weight - floats[name].weight).abs() <= step / 2 + 1e-7), name


def test_the_setting_chooses_the_mode_and_refuses_an_unknown_one(
    tiny_weights: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variable = FAMILIES[Family.INFINITETALK].env("quantize")
    assert variable == "MONOLOGUE_INFINITETALK_QUANTIZE"
    weights = InfiniteTalkWeights(TINY, Locations.under(tiny_weights))
    monkeypatch.setenv(variable, "int8")
    assert build_family(weights).audio_to_video.quantize is QuantMode.INT8  # type: ignore[attr-defined]
    monkeypatch.setenv(variable, "int4")
    with pytest.raises(ValueError, match=f"{variable}='int4': expected one of none, int8, fp8"):
        build_family(weights)


def test_fp8_is_refused_on_the_cpu_before_any_weight_is_read(tiny_weights: Path) -> None:
    with pytest.raises(ValueError, match="fp8"):
        _dit(tiny_weights, QuantMode.FP8)


def test_an_int8_chunk_stays_near_the_float_one(tiny_weights: Path) -> None:
    """N0 of the same session, float against int8 DiT weights: the frames differ (the weights are quantized) but
    little (printed; `pytest -rP`)."""
    rng = np.random.default_rng(7)
    portrait = (rng.random((90, 80, 3)) * 255).astype(np.uint8)
    t = np.arange(16_000 * 2) / 16_000
    audio = ArrayAudio((0.3 * np.sin(2 * np.pi * 220 * t) * (t % 0.5 < 0.3)).astype(np.float32))
    shown = {}
    for mode in (QuantMode.NONE, QuantMode.INT8):
        weights = InfiniteTalkWeights(TINY, Locations.under(tiny_weights))
        pipeline = Pipeline(build_family(weights, quantize=mode))
        session = pipeline.start_session(portrait, OutputSpec(fps=25), audio)
        frames = Frames()
        pipeline.run_chunk(session, ChunkRequest(CHUNKS[0], seed=3, prompt=OPTIONS.prompt), frames)
        shown[mode] = np.concatenate(frames.frames).astype(np.float64)
    difference = np.abs(shown[QuantMode.INT8] - shown[QuantMode.NONE])
    print(f"int8 against float, N0: mean |difference| {difference.mean():.3f}, max {difference.max():.0f} levels")
    assert 0 < difference.mean() < 0.05 * shown[QuantMode.NONE].std()
