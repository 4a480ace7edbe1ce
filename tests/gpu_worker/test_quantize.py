"""Weight quantization of the DiTs' block linears (gpu_worker/quantize.py): what is replaced, what it weighs, how
far a quantized layer strays from the float one, and that a quantized tiny render still passes the quality gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from gpu_worker.bench_gpu import GpuReport, main as bench_main
from gpu_worker.models import FAMILIES
from gpu_worker.models.dit import build_family
from gpu_worker.models.dit.a2v import AudioToVideoDiT
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.pipeline import Pipeline
from gpu_worker.quantize import (
    Fp8Kernel,
    QuantizedLinear,
    QuantMode,
    quantize_linears,
    replace_linears,
    tensor_bytes,
)
from gpu_worker.render_record import RecordSettings, render_record
from gpu_worker.weight_memory import weight_memory
from monologue.contracts import Family
from monologue.gate import Verdict, gate

A2V_BLOCK_LINEARS = [
    "attention.qkv",
    "attention.out",
    "cross_attention.query",
    "cross_attention.key_value",
    "cross_attention.out",
    "mlp.up",
    "mlp.down",
]
SR_BLOCK_LINEARS = ["attention.qkv", "attention.out", "mlp.up", "mlp.down"]
E4M3_STEP = 2.0**-4  # e4m3 keeps 3 mantissa bits: rounding to nearest errs by at most half a step, 2^-4 relative
E4M3_SUBNORMAL = 2.0**-10  # below 2^-6 the spacing is 2^-9: half of it, in units of the scale
BF16_STEP = 2.0**-8  # the product comes back in bf16


def _block_linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: module for name, module in model.blocks.named_modules() if isinstance(module, nn.Linear)}


@pytest.mark.parametrize(("dtype", "ratio"), [(torch.bfloat16, 2), (torch.float32, 4)])
def test_int8_block_weights_take_half_the_bytes_of_bf16_and_a_quarter_of_fp32(dtype: torch.dtype, ratio: int) -> None:
    """Exactly: each replaced weight's bytes shrink by the ratio, plus 4 bytes of scale per output channel; the
    model's other tensors (modulation, embeddings, norms, head, biases) keep their bytes."""
    model = Weights(TINY, seed=3).build("a2v").to(dtype)
    floats = {name: linear.weight for name, linear in _block_linears(model).items() if "modulation" not in name}
    before = tensor_bytes(model)
    replace_linears(model.blocks, QuantMode.INT8)
    for name, weight in floats.items():
        layer = model.blocks.get_submodule(name)
        assert isinstance(layer, QuantizedLinear)
        assert layer.values.nbytes * ratio == weight.nbytes
        assert layer.scales.nbytes == 4 * weight.shape[0]
    saved = sum(weight.nbytes - weight.nbytes // ratio - 4 * weight.shape[0] for weight in floats.values())
    assert tensor_bytes(model) == before - saved


def test_only_the_blocks_linears_but_the_modulation_are_replaced() -> None:
    a2v, sr = Weights(TINY, seed=3).build("a2v"), Weights(TINY, seed=3).build("sr")
    assert isinstance(a2v, AudioToVideoDiT) and isinstance(sr, SuperResolutionDiT)
    replaced_a2v = quantize_linears(a2v.blocks, QuantMode.INT8, "cpu")
    replaced_sr = quantize_linears(sr.blocks, QuantMode.INT8, "cpu")
    assert replaced_a2v == [f"{block}.{name}" for block in range(2) for name in A2V_BLOCK_LINEARS]
    assert replaced_sr == [f"{block}.{name}" for block in range(2) for name in SR_BLOCK_LINEARS]
    assert set(_block_linears(a2v)) == {"0.modulation", "1.modulation"}  # left in float
    assert _block_linears(sr) == {}
    for model in (a2v, sr):  # outside the blocks nothing changes
        assert type(model.embed) is nn.Linear and type(model.head) is nn.Linear
    assert type(a2v.modulation_out) is nn.Linear and type(a2v.text_proj) is nn.Linear


def _linear(rows: int = 48, columns: int = 64, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(columns, rows)


def test_an_int8_linear_stays_within_half_a_step_per_weight() -> None:
    """Each weight is off by at most half its row's step (scale / 2), so output n is off by at most
    (scale_n / 2) * sum_k |x_k|, computed here from the layer's scales, not measured."""
    linear = _linear()
    layer = QuantizedLinear(linear, QuantMode.INT8)
    x = torch.randn(3, 7, 64)
    error = (layer(x) - linear(x)).abs().detach()
    bound = x.abs().sum(-1, keepdim=True) * layer.scales / 2 + 1e-5  # (3, 7, N); fp32 rounding besides
    assert (error <= bound).all()
    assert error.max() > 0  # it is quantized: not the float layer
    # the weight it reports for sliced uses (sequence parallelism) is the one it multiplies by
    assert torch.equal(layer.weight, layer.values.float() * layer.scales[:, None])


@pytest.mark.parametrize("rowwise", [True, False])
def test_an_fp8_linear_stays_within_e4m3_rounding_of_weights_and_activations(rowwise: bool) -> None:
    """Both kernels (per-token activation scales on capability >= 9.0, one scale per call on 8.9) run on the CPU's
    `_scaled_mm` here; the bound: each weight and activation off by e4m3's relative half step (or its subnormal
    half step), and the bf16 result rounded once."""
    linear = _linear()
    layer = QuantizedLinear(linear, QuantMode.FP8, Fp8Kernel(rowwise=rowwise))
    x = torch.randn(5, 64)
    weight = linear.weight.detach()
    x_scale = x.abs().amax(1, keepdim=True) / 448 if rowwise else x.abs().amax() / 448
    weight_error = torch.maximum(weight.abs() * E4M3_STEP, E4M3_SUBNORMAL * layer.scales[:, None])  # (N, K)
    x_error = torch.maximum(x.abs() * E4M3_STEP, E4M3_SUBNORMAL * x_scale)  # (M, K)
    products = (x.abs() + x_error) @ (weight.abs() + weight_error).T  # (M, N): sum_k of the largest |x w|
    bound = products - x.abs() @ weight.abs().T + BF16_STEP * products + 1e-5
    error = (layer(x).float() - (x @ weight.T + linear.bias.detach())).abs()
    assert (error <= bound).all()
    assert layer.values.dtype == torch.float8_e4m3fn and layer.values.nbytes * 4 == weight.nbytes


def test_a_channel_of_large_weights_does_not_squash_the_others() -> None:
    """Per-channel scales: each row's largest weight maps to 127, so a row 1000x larger than the rest leaves
    their resolution alone (one scale for the whole matrix would round them all to 0)."""
    linear = _linear()
    with torch.no_grad():
        linear.weight[5] *= 1000.0
    layer = QuantizedLinear(linear, QuantMode.INT8)
    weight = linear.weight.detach()
    assert torch.allclose(layer.scales, weight.abs().amax(1) / 127, rtol=0, atol=0)
    assert (layer.values.abs().amax(1) == 127).all()
    others = torch.arange(weight.shape[0]) != 5
    relative = (layer.weight - weight).abs()[others].amax(1) / weight.abs()[others].amax(1)
    assert (relative <= 0.5 / 127 + 1e-6).all()


def test_fp8_is_refused_on_the_cpu_with_the_message() -> None:
    model = Weights(TINY, seed=3).build("sr")
    with pytest.raises(ValueError, match=r"fp8 needs a CUDA GPU with FP8 tensor cores .* runs on cpu: use int8"):
        quantize_linears(model.blocks, QuantMode.FP8, "cpu")
    assert len(_block_linears(model)) == 2 * len(SR_BLOCK_LINEARS)  # untouched
    with pytest.raises(ValueError, match="quantize mode fp8 needs a CUDA GPU"):
        Pipeline(build_family(Weights(TINY, seed=3), quantize=QuantMode.FP8))  # loads the models


def test_fp8_is_refused_on_a_gpu_below_compute_capability_8_9(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A10")
    with pytest.raises(ValueError, match=r"capability >= 8.9; NVIDIA A10 has 8.6: use int8"):
        QuantMode.FP8.check("cuda")
    QuantMode.INT8.check("cuda")  # int8 runs anywhere


def test_the_family_setting_chooses_the_mode_and_refuses_an_unknown_one(monkeypatch: pytest.MonkeyPatch) -> None:
    variable = FAMILIES[Family.DIT].env("quantize")
    monkeypatch.setenv(variable, "int8")
    modules = [m for m in build_family(Weights(TINY, seed=3)).modules() if isinstance(m, TorchModule)]
    assert {module.quantize for module in modules} == {QuantMode.INT8}
    assert sorted(name for module in modules for name in module.quantized_models) == ["a2v", "sr"]
    monkeypatch.setenv(variable, "int4")
    with pytest.raises(ValueError, match=f"{variable}='int4': expected one of none, int8, fp8"):
        build_family(Weights(TINY, seed=3))


def test_the_loaded_family_weighs_what_the_meta_count_says() -> None:
    """The per-model bytes `python -m gpu_worker.weight_memory` counts on the meta device are the loaded models'."""
    family = build_family(Weights(TINY, seed=3), quantize=QuantMode.INT8)
    family.load()
    loaded = {
        name: tensor_bytes(model)
        for module in family.modules()
        if isinstance(module, TorchModule)
        for name, model in module.models.items()
    }
    assert loaded == weight_memory("tiny", torch.float32, QuantMode.INT8)
    assert isinstance(family.audio_to_video, TorchModule)
    a2v = family.audio_to_video.models["a2v"]
    assert sum(isinstance(module, QuantizedLinear) for module in a2v.modules()) == 2 * len(A2V_BLOCK_LINEARS)


def test_the_bench_reports_the_quantized_weight_memory_and_switches_quantized_models(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--quantize int8` under switch residency: the quantized buffers travel to and from the host like weights,
    and the bench reports each model's bytes, the DiTs' below their float bytes."""
    flags = ["--residency", "switch", "--chunks", "2", "--warmup-chunks", "1", "--chunk-frames", "8", "--no-flops"]
    bench_main([*flags, "--quantize", "int8", "--json"])
    report = GpuReport(**json.loads(capsys.readouterr().out))
    assert report.errors == {} and report.quantize == "int8" and report.frames > 0
    assert report.weight_bytes == weight_memory("tiny", torch.float32, QuantMode.INT8)
    floats = weight_memory("tiny", torch.float32, QuantMode.NONE)
    smaller = {name for name, size in report.weight_bytes.items() if size < floats[name]}
    assert smaller == {"a2v", "sr"}
    assert report.parameters["a2v"] == sum(p.numel() for p in Weights(TINY, seed=1).build("a2v").parameters())


def test_an_int8_render_of_the_tiny_preset_passes_the_gate_against_the_float_one(tmp_path: Path) -> None:
    """One second of the bundled samples at preview size, fp32 vs fp32 with int8 DiT linears."""
    settings = RecordSettings(preset="tiny", preview=True, seconds=1.0, precision="fp32")
    render_record(settings, tmp_path / "float")
    quantized = RecordSettings(preset="tiny", preview=True, seconds=1.0, precision="fp32", quantize="int8")
    record = render_record(quantized, tmp_path / "int8")
    assert record.settings.quantize is QuantMode.INT8
    report = gate(tmp_path / "float", tmp_path / "int8")
    assert report.verdict is Verdict.PASS, report.reason
    assert not report.bit_identical and report.differing > 0  # the int8 weights did change the frames
