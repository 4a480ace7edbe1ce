"""Weight quantization of the DiTs' linear layers: INT8 everywhere, FP8 (e4m3) on GPUs that multiply in it.

`quantize_linears(blocks, mode, device)` replaces every `nn.Linear` inside a DiT's transformer blocks by a
`QuantizedLinear` holding the weight as int8 or float8_e4m3fn with one fp32 scale per output channel (symmetric:
a row's largest magnitude maps to the format's largest value, so one row of large weights never squashes the
others' resolution). The weight's bytes halve against bf16 and quarter against fp32; the bias stays in the
model's dtype (it is small). What stays in float, and why:
- the blocks' adaLN `modulation` layers: they turn the time embedding into every block's shift, scale and gate,
  whose errors multiply the whole residual stream (the infinitetalk DiT keeps them in fp32 for the same reason);
- everything outside the blocks (patch embedding, time MLP, condition projections, output head, norms): a few
  megabytes, and where an error reaches every token unattenuated.

How a quantized layer multiplies (`QuantMode`):
- INT8 (weight-only): on the CPU through `torch._weight_int8pack_mm` (fused dequantize and matmul); elsewhere the
  weight is dequantized to the compute dtype per call and multiplied by the usual GEMM, so the saving is memory
  (resident weights, host copies, switch traffic), not FLOPs.
- FP8: `torch._scaled_mm` on FP8 tensor cores (CUDA compute capability 8.9 or later). The weights are stored in
  e4m3 with per-channel scales; `_scaled_mm` needs both operands in FP8, so each call also quantizes its
  activations dynamically, one scale per token (no calibration), and the product comes back in bf16. Per-token
  activation scales need capability 9.0 (`_scaled_mm`'s row-wise scaling); 8.9 takes one scale for the whole
  activation and applies the weights' per-channel scales to the product. Refused on the CPU and on older GPUs
  (`QuantMode.check`), never silently replaced by INT8.

A quantized layer keeps `weight` (the dequantized matrix, made on demand) for the code that slices a projection's
rows or columns (sequence parallelism's head groups). The quantized tensors are buffers, not parameters: FSDP's
mixed precision would cast a parameter back to bf16, and offload (`HostCopy`, `ModelSwitcher`) moves buffers too.
This module must never change a float layer's numbers: with `QuantMode.NONE` it touches nothing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Linear layers inside a block that stay in float (see the module docstring), by attribute name.
FLOAT_LAYERS = frozenset({"modulation"})
FP8_CAPABILITY = (8, 9)  # Ada and later: FP8 tensor cores
FP8_ROWWISE_CAPABILITY = (9, 0)  # Hopper and later: `_scaled_mm` with one scale per row of each operand
INT8_FUSED_DEVICES = frozenset({"cpu"})  # where `torch._weight_int8pack_mm` beats dequantize-then-GEMM
_TINY = 1e-12  # a row of zeros gets this amax, so its scale is not 0 (its values quantize to 0 all the same)


class QuantMode(StrEnum):
    """How a DiT's block linears store their weights (MONOLOGUE_DIT_QUANTIZE, `--quantize`)."""

    NONE = "none"  # the model's own dtype (Precision)
    INT8 = "int8"  # int8 weights, per-output-channel scales; any device
    FP8 = "fp8"  # float8_e4m3fn weights, per-output-channel scales; CUDA capability >= 8.9

    @classmethod
    def from_env(cls, variable: str) -> QuantMode:
        """The mode the environment variable names (default none); ValueError naming the value and the modes."""
        value = os.environ.get(variable, "").strip().lower() or cls.NONE.value
        if value not in set(cls):
            raise ValueError(f"{variable}={value!r}: expected one of {', '.join(cls)}")
        return cls(value)

    @property
    def storage(self) -> torch.dtype:
        """The dtype the weights are stored in (ValueError for NONE, which stores none)."""
        if self is QuantMode.NONE:
            raise ValueError("QuantMode.NONE stores weights in the model's own dtype")
        return torch.int8 if self is QuantMode.INT8 else torch.float8_e4m3fn

    def check(self, device: torch.device | str) -> None:
        """ValueError naming the device when it cannot run this mode (FP8: the CPU, or a GPU below 8.9)."""
        if self is not QuantMode.FP8:
            return
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(
                f"quantize mode fp8 needs a CUDA GPU with FP8 tensor cores (compute capability >= 8.9); "
                f"this model runs on {device.type}: use int8 there"
            )
        capability = torch.cuda.get_device_capability(device)
        if capability < FP8_CAPABILITY:
            raise ValueError(
                f"quantize mode fp8 needs compute capability >= {FP8_CAPABILITY[0]}.{FP8_CAPABILITY[1]}; "
                f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}: use int8 there"
            )


def _largest(storage: torch.dtype) -> float:
    """The largest magnitude a row's scale maps to: 127 (symmetric int8), 448 (e4m3)."""
    return 127.0 if storage == torch.int8 else float(torch.finfo(storage).max)


def quantize_weight(weight: Tensor, storage: torch.dtype) -> tuple[Tensor, Tensor]:
    """A float weight (N, K) → (values (N, K) in `storage`, fp32 scales (N,)), value * scale ≈ weight, row by row."""
    rows = weight.float()
    scales = rows.abs().amax(dim=1).clamp(min=_TINY) / _largest(storage)  # (N,)
    scaled = rows / scales[:, None]
    if storage == torch.int8:
        values = scaled.round().clamp(-127, 127).to(torch.int8)
    else:
        values = scaled.clamp(-_largest(storage), _largest(storage)).to(storage)
    return values.contiguous(), scales


@dataclass(frozen=True)
class Fp8Kernel:
    """How `_scaled_mm` scales an FP8 layer's activations: per token (capability >= 9.0) or per call."""

    rowwise: bool = True

    @classmethod
    def for_device(cls, device: torch.device) -> Fp8Kernel:
        if device.type != "cuda":
            return cls()
        return cls(rowwise=torch.cuda.get_device_capability(device) >= FP8_ROWWISE_CAPABILITY)


class QuantizedLinear(nn.Module):
    """An `nn.Linear` whose weight is stored quantized (int8 or e4m3) with one fp32 scale per output channel."""

    values: Tensor  # (N, K) int8 or float8_e4m3fn, a buffer
    scales: Tensor  # (N,) float32, a buffer

    def __init__(self, linear: nn.Linear, mode: QuantMode, kernel: Fp8Kernel | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.mode = mode
        self.kernel = kernel or Fp8Kernel()
        self.float_dtype = linear.weight.dtype  # what `weight` dequantizes to, and the output's dtype off autocast
        values, scales = quantize_weight(linear.weight.detach(), mode.storage)
        self.register_buffer("values", values)
        self.register_buffer("scales", scales)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    @property
    def weight(self) -> Tensor:
        """The dequantized weight (N, K) in the layer's float dtype, made on each access."""
        return self.values.to(self.float_dtype) * self.scales.to(self.float_dtype)[:, None]

    def forward(self, x: Tensor) -> Tensor:
        """x (..., K) → (..., N) in the compute dtype (autocast's, else the layer's float dtype)."""
        dtype = _compute_dtype(x, self.float_dtype)
        rows = x.reshape(-1, self.in_features).to(dtype)  # (M, K)
        if self.mode is QuantMode.FP8:
            out = _fp8_matmul(rows, self.values, self.scales, self.kernel).to(dtype)
        elif x.device.type in INT8_FUSED_DEVICES:
            out = torch._weight_int8pack_mm(rows.contiguous(), self.values, self.scales.to(dtype))
        else:
            out = F.linear(rows, self.values.to(dtype) * self.scales.to(dtype)[:, None])
        if self.bias is not None:
            out = out + self.bias.to(dtype)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode}"


def _compute_dtype(x: Tensor, own: torch.dtype) -> torch.dtype:
    """What an `nn.Linear` would multiply in here: autocast's dtype when it is on for x's device, else the
    layer's own (an fp32 model's activations stay fp32)."""
    device = x.device.type
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return own


def _fp8_matmul(rows: Tensor, values: Tensor, scales: Tensor, kernel: Fp8Kernel) -> Tensor:
    """rows (M, K) float @ values (N, K) e4m3 with per-channel `scales` (N,) → (M, N) bf16, on FP8 tensor cores.
    The activations are quantized here: one scale per row (token) when the kernel allows, else one for all."""
    largest = _largest(values.dtype)
    magnitude = rows.abs().float()
    amax = magnitude.amax(dim=1, keepdim=True) if kernel.rowwise else magnitude.amax().reshape(1, 1)
    row_scales = amax.clamp(min=_TINY) / largest  # (M, 1) or (1, 1)
    quantized = (rows.float() / row_scales).clamp(-largest, largest).to(values.dtype)
    if kernel.rowwise:
        return torch._scaled_mm(quantized, values.t(), row_scales, scales[None, :], out_dtype=torch.bfloat16)
    one = torch.ones((), device=rows.device, dtype=torch.float32)
    product = torch._scaled_mm(quantized, values.t(), row_scales.reshape(()), one, out_dtype=torch.float32)
    return (product * scales[None, :]).to(torch.bfloat16)


def quantize_linears(blocks: nn.Module, mode: QuantMode, device: torch.device | str) -> list[str]:
    """Replace, in place, every `nn.Linear` under `blocks` (a DiT's block list) but the `FLOAT_LAYERS` by a
    `QuantizedLinear` in `mode`, for a model that runs on `device` (checked first: ValueError when it cannot).
    Returns the replaced layers' names (relative to `blocks`), in module order; none for NONE."""
    mode.check(device)
    return replace_linears(blocks, mode, Fp8Kernel.for_device(torch.device(device)))


def replace_linears(blocks: nn.Module, mode: QuantMode, kernel: Fp8Kernel | None = None) -> list[str]:
    """`quantize_linears` without the device check: for counting bytes on the meta device (an FP8 model's weight
    memory, on a machine without FP8) and for testing the FP8 arithmetic on the CPU."""
    if mode is QuantMode.NONE:
        return []
    targets = [
        (name, module)
        for name, module in blocks.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] not in FLOAT_LAYERS
    ]
    for name, linear in targets:
        parent_name, _, attribute = name.rpartition(".")
        parent = blocks.get_submodule(parent_name) if parent_name else blocks
        setattr(parent, attribute, QuantizedLinear(linear, mode, kernel))
    return [name for name, _ in targets]


def tensor_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters and buffers (its weight memory, wherever it lives; the meta device counts)."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def quantized_weights(model: nn.Module) -> int:
    """How many weights a model holds quantized (buffers, which a parameter count leaves out)."""
    return sum(layer.values.numel() for layer in model.modules() if isinstance(layer, QuantizedLinear))
