"""ModelSwitcher: one GPU, several models (audio encoder, A2V DiT, SR DiT, VAE decoder), one at a time.

Each stage runs one model; the models together need more GPU memory than the stage does. The models that
are not running live in pinned host memory, and switching the GPU from one to the next must cost under
10 ms of *visible* time (time the compute stream spends waiting), however long the copies take:

- **activate(model)** offloads the outgoing model and arms the incoming one. Nothing large is copied up
  front: each block comes in just before its forward, from a pre-forward hook, and while block n
  computes, the host-to-device copies of blocks n+1…n+lookahead run on a side stream. The compute stream
  waits on a block's copy event only when that block is about to run. Only the root's own weights (the
  embeddings and heads outside `.blocks`, small) are awaited at once.
- **offload** copies the outgoing model's weights back to their pinned host buffers (optional: frozen
  weights need not be written back) with non-blocking copies on a second side stream, and frees the
  device memory without waiting: `record_stream` keeps the allocator from reusing it before those
  copies and the last forward are done.
- Sharded models (`register(model, mesh=...)`) are sharded with FSDP2 and host offload instead
  (see `sharding.py`): FSDP copies each rank's shard in per block and all-gathers it on its own
  streams, with forward prefetch overlapping the next block. The shards never leave pinned host memory,
  so activation moves nothing and deactivation only frees the gathered weights FSDP kept.

Weights move by resizing the storages the model's tensors already view (as FSDP does with its own
buffers), so parameters keep their identity and hooks, optimizers or FSDP bookkeeping that hold them
stay valid. On CPU (tests) the same paths run synchronously: storages are really freed and refilled,
streams and events are skipped, and timings come from perf_counter.

`SwitchReport.visible_ms` is the measurement the GPU benchmark reports: the compute stream's stall in
`activate` plus its stalls waiting for weights during the model's first forward (CUDA events), or the
wall time of both on CPU, where nothing overlaps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.utils.hooks import RemovableHandle

from gpu_worker.distributed.sharding import shard_model, transformer_blocks


class SwitchReport:
    """The cost of one `activate`: `issue_ms` (CPU time inside the call) and `visible_ms` (what the compute
    stream saw). Spans are recorded until the model's first complete forward."""

    def __init__(self, model: str, *, cuda: bool) -> None:
        self.model = model
        self.issue_ms = 0.0
        self.open = True
        self._cuda = cuda
        self._cpu_ms: list[float] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started: float | torch.cuda.Event | None = None

    @property
    def visible_ms(self) -> float:
        """On GPU, reading this waits until the recorded spans have run (call it after the forward)."""
        total = sum(self._cpu_ms)
        for start, end in self._events:
            end.synchronize()
            total += start.elapsed_time(end)
        return total

    def start_span(self, device: torch.device) -> None:
        if not self.open or self._started is not None:
            return
        if self._cuda:
            event = _event(timing=True)
            event.record(torch.cuda.current_stream(device))
            self._started = event
        else:
            self._started = time.perf_counter()

    def stop_span(self, device: torch.device) -> None:
        started, self._started = self._started, None
        if started is None:
            return
        if isinstance(started, float):
            self._cpu_ms.append((time.perf_counter() - started) * 1000)
            return
        end = _event(timing=True)
        end.record(torch.cuda.current_stream(device))
        self._events.append((started, end))

    def __repr__(self) -> str:
        return f"SwitchReport(model={self.model!r}, issue_ms={self.issue_ms:.3f}, open={self.open})"


@dataclass
class _Storage:
    """One device storage the model's tensors view, and its host copy (pinned with CUDA)."""

    storage: torch.UntypedStorage
    host: torch.Tensor  # (nbytes,) uint8
    nbytes: int


@dataclass
class _Unit:
    """The weights that move together: one block's, or the root's own (everything outside `.blocks`)."""

    storages: list[_Storage]
    resident: bool = False
    waited: bool = False  # the compute stream already waits for `ready`
    ready: torch.cuda.Event | None = None  # host-to-device copy done
    written: torch.cuda.Event | None = None  # write-back done: the host copy may be read again


@dataclass
class _Managed:
    model: nn.Module
    name: str
    streamed: bool  # FSDP2 with host offload: FSDP moves the shards itself
    root: _Unit
    blocks: list[_Unit]
    hooks: list[RemovableHandle] = field(default_factory=list)
    report: SwitchReport | None = None


class ModelSwitcher:
    """Keeps registered models in host memory and gives the device to one of them at a time."""

    def __init__(
        self, device: torch.device | str, *, lookahead: int = 2, write_back: bool = True, pin_memory: bool | None = None
    ) -> None:
        """lookahead: blocks whose copies run ahead of the block computing (2: the next block's copy has a
        whole block of compute to hide behind even when the one after is issued late).
        write_back: copy the outgoing model's weights back to the host (off for frozen weights saves the
        device-to-host traffic; on, nothing changed on the device is ever lost).
        pin_memory: pin host copies; None pins exactly when CUDA is available."""
        if lookahead < 0:
            raise ValueError(f"lookahead must be >= 0, got {lookahead}")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.lookahead = lookahead
        self.write_back = write_back
        self._cuda = self.device.type == "cuda"
        self._pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        self._copy_stream = _stream(self.device) if self._cuda else None
        self._offload_stream = _stream(self.device) if self._cuda else None
        self._models: dict[int, _Managed] = {}
        self._active: _Managed | None = None

    @property
    def active(self) -> nn.Module | None:
        return self._active.model if self._active is not None else None

    def register(
        self, model: nn.Module, *, name: str | None = None, mesh: DeviceMesh | None = None, prefetch: int = 1
    ) -> None:
        """Take `model` under management, inactive: its weights go to host memory and leave the device.

        With `mesh`, shard it first (FSDP2 per block, host offload, `prefetch` blocks ahead). Register a
        model after its weights are loaded: the host copy is taken now."""
        if id(model) in self._models:
            raise ValueError(f"{name or type(model).__name__} is already registered")
        if isinstance(model, FSDPModule):
            raise ValueError(
                f"{type(model).__name__} is already sharded: register the unsharded model with mesh=... so the "
                "switcher shards it with host offload"
            )
        blocks = transformer_blocks(model)
        managed_name = name or type(model).__name__
        if mesh is not None:
            shard_model(model, mesh, host_offload=True, prefetch=prefetch)
            managed = _Managed(model, managed_name, streamed=True, root=_Unit([]), blocks=[])
        else:
            block_tensors = [_tensors(block) for block in blocks]
            claimed = {id(tensor) for tensors in block_tensors for tensor in tensors}
            captured: dict[int, _Storage] = {}  # by source data pointer: tied weights move once
            root = self._capture([t for t in _tensors(model) if id(t) not in claimed], captured, managed_name)
            units = [self._capture(tensors, captured, managed_name) for tensors in block_tensors]
            for entry in captured.values():  # freed only now: a tied tensor may still have needed the storage
                entry.storage.resize_(0)
            managed = _Managed(model, managed_name, streamed=False, root=root, blocks=units)
        self._install_hooks(managed, blocks)
        self._models[id(model)] = managed

    def activate(self, model: nn.Module) -> SwitchReport:
        """Give the device to `model`: offload the active model, arm this one's per-block restore."""
        managed = self._managed(model)
        report = SwitchReport(managed.name, cuda=self._cuda)
        if self._active is managed:
            report.open = False
            return report
        started = time.perf_counter()
        report.start_span(self.device)
        if self._active is not None:
            self._offload(self._active)
        self._active = managed
        if not managed.streamed:
            self._restore(managed.root, wait=True)
            for unit in managed.blocks[: self.lookahead]:
                self._restore(unit, wait=False)
        report.stop_span(self.device)
        report.issue_ms = (time.perf_counter() - started) * 1000
        managed.report = report
        return report

    def deactivate(self) -> None:
        """Offload the active model (asynchronously on GPU); no model is active afterwards."""
        if self._active is not None:
            self._offload(self._active)
            self._active = None

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
        for stream in (self._copy_stream, self._offload_stream):
            if stream is not None:
                stream.synchronize()

    # Restore and offload.

    def _restore(self, unit: _Unit, *, wait: bool) -> None:
        if not unit.resident:
            if self._copy_stream is not None:
                with torch.cuda.stream(self._copy_stream):
                    if unit.written is not None:
                        self._copy_stream.wait_event(unit.written)
                    for entry in unit.storages:
                        entry.storage.resize_(entry.nbytes)  # allocated on the copy stream
                        _as_bytes(entry.storage).copy_(entry.host, non_blocking=True)
                    unit.ready = _event()
                    unit.ready.record(self._copy_stream)
            else:
                for entry in unit.storages:
                    entry.storage.resize_(entry.nbytes)
                    _as_bytes(entry.storage).copy_(entry.host)
            unit.resident, unit.waited, unit.written = True, False, None
        if wait and not unit.waited:
            if unit.ready is not None:
                torch.cuda.current_stream(self.device).wait_event(unit.ready)
            unit.waited = True

    def _offload(self, managed: _Managed) -> None:
        if managed.streamed:
            for module in managed.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()
            return
        units = [unit for unit in (managed.root, *managed.blocks) if unit.resident]
        if self._offload_stream is not None:
            compute = torch.cuda.current_stream(self.device)
            self._offload_stream.wait_stream(compute)  # the last forward's reads come first
            with torch.cuda.stream(self._offload_stream):
                for unit in units:
                    if unit.ready is not None:
                        self._offload_stream.wait_event(unit.ready)  # a look-ahead copy may still be landing
                    for entry in unit.storages:
                        device_bytes = _as_bytes(entry.storage)
                        if self.write_back:
                            entry.host.copy_(device_bytes, non_blocking=True)
                        # Freed now, reused only once both streams are past their uses of it.
                        device_bytes.record_stream(self._offload_stream)
                        device_bytes.record_stream(compute)
                        entry.storage.resize_(0)
                    if self.write_back:
                        unit.written = _event()
                        unit.written.record(self._offload_stream)
        else:
            for unit in units:
                for entry in unit.storages:
                    if self.write_back:
                        entry.host.copy_(_as_bytes(entry.storage))
                    entry.storage.resize_(0)
        for unit in units:
            unit.resident, unit.waited, unit.ready = False, False, None

    # Registration.

    def _capture(self, tensors: list[torch.Tensor], captured: dict[int, _Storage], name: str) -> _Unit:
        """Take a host copy of each storage behind `tensors` and point the tensors at device storage."""
        unit = _Unit([])
        for tensor in tensors:
            source = tensor.untyped_storage()
            if source.nbytes() == 0:
                continue
            key = source.data_ptr()
            if key in captured:  # tied to a tensor another unit (or this one) already moved
                if tensor.device != self.device:
                    tensor.data = _view(tensor, captured[key].storage, self.device)
                continue
            if source.device.type == "cpu" and self.device.type != "cpu":
                host = self._host_copy(source)
                storage = _storage(source.nbytes(), self.device)
            elif source.device == self.device:
                host, storage = self._host_copy(source), source
            else:
                raise ValueError(f"{name}: a tensor is on {source.device}; this switcher manages {self.device}")
            entry = _Storage(storage, host, source.nbytes())
            captured[key] = entry
            unit.storages.append(entry)
            if storage is not source:
                # Every tensor on this storage moves with it (views keep their offsets and strides).
                for other in tensors:
                    if other.untyped_storage().data_ptr() == key:
                        other.data = _view(other, storage, self.device)
        return unit

    def _host_copy(self, storage: torch.UntypedStorage) -> torch.Tensor:
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=self._pin)
        host.copy_(_as_bytes(storage))
        return host

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
        if self._active is not managed:
            raise RuntimeError(f"{managed.name} is not active: call ModelSwitcher.activate(model) before running it")
        if managed.report is not None:
            managed.report.start_span(self.device)
        if index is not None and not managed.streamed:
            self._restore(managed.blocks[index], wait=True)
            for unit in managed.blocks[index + 1 : index + 1 + self.lookahead]:
                self._restore(unit, wait=False)

    def _entered(self, managed: _Managed, module: nn.Module, args: Any) -> None:
        if managed.report is not None:
            managed.report.stop_span(self.device)

    def _finished(self, managed: _Managed, module: nn.Module, args: Any, output: Any) -> None:
        if managed.report is not None:
            managed.report.open = False
            managed.report = None

    def _managed(self, model: nn.Module) -> _Managed:
        try:
            return self._models[id(model)]
        except KeyError:
            raise ValueError(f"{type(model).__name__} is not registered with this ModelSwitcher") from None


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def _as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A (nbytes,) uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _view(tensor: torch.Tensor, storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """`tensor`'s layout (offset, sizes, strides) over another storage."""
    return torch.empty(0, dtype=tensor.dtype, device=device).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride()
    )


# torch's CUDA stream, event and storage constructors are untyped; these give mypy their types.


def _event(*, timing: bool = False) -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


def _stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]


def _storage(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    return torch.UntypedStorage(nbytes, device=device)  # type: ignore[no-untyped-call]
