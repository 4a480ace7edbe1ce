"""What the dit family's pipeline modules share: device placement, weight offload and the latents that
travel between stages.

A `TorchModule` owns the nn.Modules of one pipeline role (built by `Weights`, one per safetensors
file) and moves them as a unit: `load` puts them on CUDA when there is one, `offload` parks them in
pinned host memory (so `restore` is one fast asynchronous copy back), and every model exposes
`.blocks`, the nn.ModuleList a sharding or per-block offload runtime wraps block by block.
Inference runs in fp32 on CPU and under bf16 autocast on CUDA.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.pipeline.module import Module

ModelT = TypeVar("ModelT", bound=nn.Module)


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


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

    def __init__(self, weights: Weights) -> None:
        super().__init__()
        self.weights = weights
        self.models: dict[str, nn.Module] = {}

    @property
    def config(self) -> DiTConfig:
        return self.weights.config

    def load(self) -> None:
        """Build each model with its weights (checkpoint or seeded draw) and move it to the default device."""
        for name in self.model_names:
            self.models[name] = self.weights.build(name)
        self.loaded = True
        self.to(default_device())

    def to(self, device: str) -> None:
        for model in self.models.values():
            model.to(device)
        self.device = device

    def offload(self) -> None:
        """Free the accelerator: weights to pinned host memory when CUDA is present (so `restore` copies
        back at full PCIe speed, asynchronously), else plain host memory."""
        if not torch.cuda.is_available():
            self.to("cpu")
            return
        for model in self.models.values():
            for tensor in itertools.chain(model.parameters(), model.buffers()):
                tensor.data = tensor.data.to("cpu").pin_memory()
        self.device = "cpu"

    def restore(self, device: str) -> None:
        for model in self.models.values():
            model.to(device, non_blocking=True)
        self.device = device

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
        """No autograd; bf16 autocast on CUDA (fp32 on CPU, where bf16 is slow and the tests want exact sums)."""
        with ExitStack() as stack:
            stack.enter_context(torch.inference_mode())
            if self.device.startswith("cuda"):
                stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
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
