"""ModelSwitcher: one GPU, several models (audio encoder, A2V DiT, SR DiT, VAE decoder), one stage's at a time.

Each stage runs one model (or a few small ones); the models together need more GPU memory than the stage
does. The models that are not running live in pinned host memory, and switching the GPU from one to the
next must cost under 10 ms of *visible* time (time the compute stream spends waiting), however long the
copies take:

- **activate(models)** offloads the outgoing models and arms the incoming ones. Nothing large is copied
  up front: each block comes in just before its forward, from a pre-forward hook, and while block n
  computes, the host-to-device copies of blocks n+1…n+lookahead run on a side stream. The compute stream
  waits on a block's copy event only when that block is about to run. Only the root's own weights (the
  embeddings and heads outside `.blocks`, small; the whole model for one without `.blocks`) are awaited
  at once.
- **prefetch(models)** (CUDA only) starts the copies of the next stage's root and first blocks on the
  side stream while the current stage still computes, so its `activate` finds them landed or landing.
- **offload** frees the outgoing model's device memory without waiting: `record_stream` keeps the
  allocator from reusing it before the last forward is done. Inference weights are frozen, so nothing
  is copied back: the host copy taken at `register` stays the truth and an offload moves no bytes
  device-to-host. (`write_back=True` copies them back on a second side stream first, for weights that
  change while active; nothing in inference uses it.)
- Sharded models (`register(model, mesh=...)`) are sharded with FSDP2 and host offload instead
  (see `sharding.py`): FSDP copies each rank's shard in per block and all-gathers it on its own
  streams, with forward prefetch overlapping the next block. The shards never leave pinned host memory,
  so activation moves nothing and deactivation only frees the gathered weights FSDP kept.

Weights move by resizing the storages the model's tensors already view (as FSDP does with its own
buffers), so parameters keep their identity and hooks, optimizers or FSDP bookkeeping that hold them
stay valid. On CPU (tests) the same paths run synchronously: storages are really freed and refilled,
streams and events are skipped, and timings come from perf_counter.

What each switch cost is a `SwitchReport` (switch_report.py); how a unit of weights is captured,
restored and freed, streams and events included, is `UnitMover` (weight_units.py). This module
decides which models hold the device, and when each block comes in.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.utils.hooks import RemovableHandle

from gpu_worker.distributed.sharding import shard_model, transformer_blocks
from gpu_worker.distributed.switch_report import SwitchReport
from gpu_worker.distributed.weight_units import UnitMover, WeightUnit

__all__ = ["ModelSwitcher", "SwitchReport"]


@dataclass
class _Managed:
    """A registered model: its units of weights, the hooks that bring them in, the switch being measured."""

    model: nn.Module
    name: str
    streamed: bool  # FSDP2 with host offload: FSDP moves the shards itself
    root: WeightUnit
    blocks: list[WeightUnit]
    hooks: list[RemovableHandle] = field(default_factory=list)
    report: SwitchReport | None = None


class ModelSwitcher:
    """Keeps registered models in host memory and gives the device to one stage's models at a time."""

    def __init__(
        self,
        device: torch.device | str,
        *,
        lookahead: int = 2,
        write_back: bool = False,
        pin_memory: bool | None = None,
    ) -> None:
        """lookahead: blocks whose copies run ahead of the block computing (2: the next block's copy has a
        whole block of compute to hide behind even when the one after is issued late).
        write_back: copy the outgoing model's weights back to the host on offload. Off (the default) for
        frozen inference weights: an offload then moves nothing device-to-host. On, nothing changed on the
        device is ever lost.
        pin_memory: pin host copies; None pins exactly when CUDA is available."""
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.lookahead = lookahead
        self._cuda = self.device.type == "cuda"
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._mover = UnitMover(self.device, write_back=write_back, pin_memory=pin)
        self._models: dict[int, _Managed] = {}
        self._active: tuple[_Managed, ...] = ()

    @property
    def write_back(self) -> bool:
        """Whether an offload copies the outgoing weights back to the host (see __init__)."""
        return self._mover.write_back

    @property
    def active(self) -> nn.Module | None:
        """The active model (the first of them when several are active), or None."""
        return self._active[0].model if self._active else None

    def register(
        self, model: nn.Module, *, name: str | None = None, mesh: DeviceMesh | None = None, prefetch: int = 1
    ) -> None:
        """Take `model` under management, inactive: its weights go to host memory and leave the device.

        With `mesh`, shard it first (FSDP2 per block, host offload, `prefetch` blocks ahead; the model needs
        `.blocks`). A model without `.blocks` moves whole, as its root. Register a model after its weights
        are loaded: the host copy is taken now."""
        if id(model) in self._models:
            raise ValueError(f"{name or type(model).__name__} is already registered")
        if isinstance(model, FSDPModule):
            raise ValueError(
                f"{type(model).__name__} is already sharded: register the unsharded model with mesh=... so the "
                "switcher shards it with host offload"
            )
        blocks = transformer_blocks(model) if mesh is not None else _blocks_or_none(model)
        managed_name = name or type(model).__name__
        if mesh is not None:
            shard_model(model, mesh, host_offload=True, prefetch=prefetch)
            managed = _Managed(model, managed_name, streamed=True, root=WeightUnit([]), blocks=[])
        else:
            root, units = self._mover.capture(model, blocks, managed_name)
            managed = _Managed(model, managed_name, streamed=False, root=root, blocks=units)
        self._install_hooks(managed, blocks)
        self._models[id(model)] = managed

    def activate(self, models: nn.Module | Sequence[nn.Module]) -> SwitchReport:
        """Give the device to `models` (one, or a stage's few): offload every other model that holds device
        memory, arm these ones' per-block restore. The report stays open until each has run a forward."""
        group = tuple(self._managed(model) for model in ([models] if isinstance(models, nn.Module) else models))
        report = SwitchReport("+".join(managed.name for managed in group), cuda=self._cuda, members=len(group))
        if set(map(id, group)) == set(map(id, self._active)):
            report.open = False
            return report
        started = time.perf_counter()
        report.start_span(self.device)
        self._offload_all_but(group)
        self._active = group
        for managed in group:
            if not managed.streamed:
                self._mover.restore(managed.root, wait=True)
                for unit in managed.blocks[: self.lookahead]:
                    self._mover.restore(unit, wait=False)
            managed.report = report
        report.stop_span(self.device)
        report.issue_ms = (time.perf_counter() - started) * 1000
        return report

    def prefetch(self, models: Sequence[nn.Module]) -> None:
        """Start copying `models`' roots and first `lookahead` blocks to the device on the side stream, to
        overlap the current stage's compute; their `activate` then waits only for what has not landed.
        A no-op on CPU, where nothing overlaps (and idle models keep holding no memory)."""
        if not self._mover.overlaps:
            return
        for managed in map(self._managed, models):
            if not managed.streamed:
                for unit in (managed.root, *managed.blocks[: self.lookahead]):
                    self._mover.restore(unit, wait=False)

    def deactivate(self) -> None:
        """Offload every model (asynchronously on GPU); none is active afterwards."""
        self._offload_all_but(())
        self._active = ()

    def name_of(self, model: nn.Module) -> str:
        """The name `model` was registered under."""
        return self._managed(model).name

    def resident_bytes(self, model: nn.Module) -> int:
        """Bytes of `model`'s weights on the device now, as the switcher manages them (0 for sharded
        models between forwards: their shards stay on the host)."""
        managed = self._managed(model)
        return sum(entry.storage.nbytes() for unit in (managed.root, *managed.blocks) for entry in unit.storages)

    def synchronize(self) -> None:
        """Wait for every copy in flight (benchmarks and tests; the switch itself never waits)."""
        self._mover.synchronize()

    # Which models hold the device.

    def _offload_all_but(self, keep: tuple[_Managed, ...]) -> None:
        """Offload the active models and any prefetched one, except `keep`."""
        for managed in self._models.values():
            if any(managed is kept for kept in keep):
                continue
            holding = any(unit.resident for unit in (managed.root, *managed.blocks))
            if holding or any(managed is active for active in self._active):
                self._offload(managed)

    def _offload(self, managed: _Managed) -> None:
        if managed.streamed:
            for module in managed.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
            return
        self._mover.free([unit for unit in (managed.root, *managed.blocks) if unit.resident])

    # Hooks: each block comes in just before its forward, the next ones start copying behind it.

    def _install_hooks(self, managed: _Managed, blocks: nn.ModuleList) -> None:
        # Registered after fully_shard, so the prepended hooks run before FSDP's pre-forward (which gathers
        # the block) and the appended ones after it: the span between them is the wait for the weights.
        model = managed.model
        managed.hooks.append(model.register_forward_pre_hook(partial(self._enter, managed, None), prepend=True))
        managed.hooks.append(model.register_forward_pre_hook(partial(self._entered, managed)))
        managed.hooks.append(model.register_forward_hook(partial(self._finished, managed), always_call=True))
        for index, block in enumerate(blocks):
            managed.hooks.append(block.register_forward_pre_hook(partial(self._enter, managed, index), prepend=True))
            managed.hooks.append(block.register_forward_pre_hook(partial(self._entered, managed)))

    def _enter(self, managed: _Managed, index: int | None, module: nn.Module, args: Any) -> None:
        if not any(managed is active for active in self._active):
            raise RuntimeError(f"{managed.name} is not active: call ModelSwitcher.activate(model) before running it")
        if managed.report is not None:
            managed.report.start_span(self.device)
        if index is not None and not managed.streamed:
            self._mover.restore(managed.blocks[index], wait=True)
            for unit in managed.blocks[index + 1 : index + 1 + self.lookahead]:
                self._mover.restore(unit, wait=False)

    def _entered(self, managed: _Managed, module: nn.Module, args: Any) -> None:
        if managed.report is not None:
            managed.report.stop_span(self.device)

    def _finished(self, managed: _Managed, module: nn.Module, args: Any, output: Any) -> None:
        if managed.report is not None:
            managed.report.member_finished()
            managed.report = None

    def _managed(self, model: nn.Module) -> _Managed:
        try:
            return self._models[id(model)]
        except KeyError:
            raise ValueError(f"{type(model).__name__} is not registered with this ModelSwitcher") from None


def _blocks_or_none(model: nn.Module) -> nn.ModuleList:
    """The model's `.blocks`, or an empty list for a model that moves whole (a VAE)."""
    blocks = getattr(model, "blocks", None)
    return blocks if isinstance(blocks, nn.ModuleList) else nn.ModuleList()
