"""What the dit family's pipeline modules share: device placement, precision, weight offload and the latents
that travel between stages.

A `TorchModule` owns the nn.Modules of one pipeline role (built by `Weights`, one per safetensors file)
and moves them as a unit; every model exposes `.blocks`, the nn.ModuleList a sharding or per-block
offload runtime wraps block by block (the VAE, small, has none and moves whole).

Precision (`Precision`): AUTO stores the parameters in bf16 on CUDA and in fp32 on CPU (the CPU tests
want exact sums, and CPU bf16 is slow). The parameters are cast once, at load, so a bf16 model reads
half the bytes and autocast never re-casts a weight for a matmul or a convolution. Autocast stays on
for a bf16 model as the boundary with the roles, which hand fp32 tensors in (latents, features: autocast
casts these activations to bf16 at each matmul, and runs norms and softmax in fp32); buffers (the mel
filter bank, the STFT window) stay fp32. Outputs leave the roles as float32.

Quantization (`gpu_worker.quantize.QuantMode`, MONOLOGUE_DIT_QUANTIZE): a module's `quantized_models` (the DiTs)
then store their blocks' linear weights in int8 or fp8 with per-channel scales, quantized at load on the host
after the cast, before the move to the device (so the device never holds both copies).

Offload. Inference weights are frozen, so nothing is ever copied back from the device: the host copy
(pinned with CUDA) taken at the first `offload` is the truth, `offload` only frees the device storage,
and `restore` copies the host copy back (asynchronously with CUDA). The storages are resized in place,
so parameters keep their identity. The pipeline's switch residency does the same per block through
`gpu_worker.distributed.offload.ModelSwitcher` instead (see `device_models`).

`running()` turns autograd off with `torch.no_grad()`, not `torch.inference_mode()`: FSDP2 cannot
unshard a sharded model's parameters under inference mode (torch 2.11).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from gpu_worker.distributed.storages import HostCopy
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.pipeline.module import Module
from gpu_worker.quantize import QuantMode, quantize_linears

ModelT = TypeVar("ModelT", bound=nn.Module)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Precision(StrEnum):
    """The dtype a family's parameters are stored (and multiplied) in."""

    AUTO = "auto"  # bf16 on CUDA, fp32 on CPU
    FP32 = "fp32"
    BF16 = "bf16"

    def dtype(self, device: str) -> torch.dtype:
        """The parameter dtype on `device` ("cuda", "cuda:1", "cpu")."""
        if self is Precision.AUTO:
            return torch.bfloat16 if device.startswith("cuda") else torch.float32
        return torch.bfloat16 if self is Precision.BF16 else torch.float32


@dataclass
class DiTLatents:
    """A chunk's latents between stages, without a batch dimension.

    `frames` are the chunk's own (C, T, h, w). `context` (C, K, h, w) are the latent frames just before
    the chunk (from the anchors): the super-resolution pass sees them as temporal neighbours, and the
    decoder re-creates its causal state from them; neither produces frames for them.
    """

    frames: Tensor
    context: Tensor | None = None


class TorchModule(Module):
    """A pipeline Module over the named models of a `Weights`."""

    model_names: tuple[str, ...] = ()
    # The models whose blocks' linears `quantize` applies to (the DiTs'; the encoders and the VAE stay float).
    quantized_models: tuple[str, ...] = ()

    def __init__(self, weights: Weights, precision: Precision = Precision.AUTO) -> None:
        super().__init__()
        self.weights = weights
        self.precision = precision  # read at load
        self.quantize = QuantMode.NONE  # read at load, for `quantized_models`
        self.dtype = torch.float32  # the parameters' dtype once loaded
        self.models: dict[str, nn.Module] = {}
        self._host: HostCopy | None = None  # taken at the first offload

    @property
    def config(self) -> DiTConfig:
        return self.weights.config

    def load(self) -> None:
        """Build each model with its weights (checkpoint or seeded draw), cast its parameters to the
        precision's dtype, quantize the DiTs' block linears if asked, and move it to the default device."""
        device = default_device()
        self.dtype = self.precision.dtype(device)
        self.quantize.check(device)  # before any weight is read: fp8 on a CPU node fails at once
        for name in self.model_names:
            model = self.weights.build(name)
            for parameter in model.parameters():
                parameter.data = parameter.data.to(self.dtype)
            self.models[name] = self.quantized(name, model, device)
        self.loaded = True
        self.to(device)

    def quantized(self, name: str, model: nn.Module, device: str) -> nn.Module:
        """`model` (the module's model `name`) with its blocks' linears stored as `self.quantize` says, if it is one
        of `quantized_models` (in place; the caller checked the mode on `device` before reading any weight)."""
        if name in self.quantized_models:
            quantize_linears(model.get_submodule("blocks"), self.quantize, device)
        return model

    def to(self, device: str) -> None:
        for model in self.models.values():
            model.to(device)
        self.device = device
        self._host = None  # new storages: a later offload takes a new host copy

    def device_models(self) -> list[nn.Module]:
        return list(self.models.values())

    def offload(self) -> None:
        """Free the weights' device storage. Nothing is copied back: the host copy, taken the first time,
        stays valid (the weights are frozen). `self.device` is unchanged: `restore` brings them back there."""
        if self._host is None:
            self._host = HostCopy(self.device_models())
        self._host.free()

    def restore(self, device: str) -> None:
        """Refill what `offload` freed (one asynchronous host-to-device copy per storage on CUDA)."""
        if device != self.device:
            raise ValueError(f"dit module {self.name!r} lives on {self.device}, cannot restore to {device}")
        if self._host is not None:
            self._host.fill()

    def model(self, name: str, kind: type[ModelT]) -> ModelT:
        """The loaded model `name`, checked to be a `kind`."""
        if name not in self.models:
            raise RuntimeError(f"dit module {self.name!r} has no loaded model {name!r}: call load() first")
        model = self.models[name]
        if not isinstance(model, kind):
            raise TypeError(f"dit model {name!r} is a {type(model).__name__}, expected {kind.__name__}")
        return model

    @contextmanager
    def running(self) -> Iterator[None]:
        """No autograd (no_grad: FSDP2 cannot unshard under inference_mode); autocast to the parameters'
        dtype when it is not fp32 (see the module docstring)."""
        with ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            if self.dtype != torch.float32:
                stack.enter_context(torch.autocast(torch.device(self.device).type, dtype=self.dtype))
            yield

    def tensor(self, array: np.ndarray | Tensor) -> Tensor:
        """A numpy array (reference, anchor) or tensor on this module's device, as float32."""
        if isinstance(array, Tensor):
            return array.to(self.device, dtype=torch.float32)
        # torch shares numpy's memory and refuses (warns on) read-only arrays, e.g. from a memory map.
        contiguous = np.ascontiguousarray(array)
        if not contiguous.flags.writeable:
            contiguous = contiguous.copy()
        return torch.from_numpy(contiguous).to(self.device, dtype=torch.float32)
