"""How `ModelSwitcher` (offload.py) moves a model's weights, one unit at a time: a unit is one block's weights,
or the root's own (everything outside `.blocks`). Which units move when is the switcher's business; this module
only captures them, restores them and frees them.

On CUDA, restores run on a side copy stream and frees (with their optional write-back) on a second side stream,
each ordered against the compute stream by events, so neither blocks the compute stream; `record_stream` keeps
the allocator from reusing freed memory before the last forward is done. On CPU (tests) the same paths run
synchronously and storages are really freed and refilled.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from gpu_worker.distributed.storages import (
    HostStorage,
    as_bytes,
    new_event,
    new_storage,
    new_stream,
    own_storages,
    tensors_of,
    view_over,
)


@dataclass
class WeightUnit:
    """The weights that move together: one block's, or the root's own (everything outside `.blocks`)."""

    storages: list[HostStorage]
    resident: bool = False
    waited: bool = False  # the compute stream already waits for `ready`
    ready: torch.cuda.Event | None = None  # host-to-device copy done
    written: torch.cuda.Event | None = None  # write-back done: the host copy may be read again


class UnitMover:
    """Captures units into host memory and moves them between it and `device`; see the module docstring.

    write_back: copy a unit's weights back to the host when it is freed (off for frozen inference weights,
    when a free moves nothing device-to-host). pin_memory: pin host copies."""

    def __init__(self, device: torch.device, *, write_back: bool, pin_memory: bool) -> None:
        self.device = device
        self.write_back = write_back
        self._pin = pin_memory
        cuda = device.type == "cuda"
        self._copy_stream = new_stream(device) if cuda else None
        self._offload_stream = new_stream(device) if cuda else None

    @property
    def overlaps(self) -> bool:
        """Whether copies run beside the compute (CUDA side streams) rather than inside the caller's call."""
        return self._copy_stream is not None

    def capture(self, model: nn.Module, blocks: nn.ModuleList, name: str) -> tuple[WeightUnit, list[WeightUnit]]:
        """Take the host copy of `model`'s root and of each of `blocks`, and free their device storage."""
        own_storages([model])
        block_tensors = [tensors_of(block) for block in blocks]
        claimed = {id(tensor) for tensors in block_tensors for tensor in tensors}
        captured: dict[int, HostStorage] = {}  # by source data pointer: tied weights move once
        root = self._capture_unit([t for t in tensors_of(model) if id(t) not in claimed], captured, name)
        units = [self._capture_unit(tensors, captured, name) for tensors in block_tensors]
        for entry in captured.values():  # freed only now: a tied tensor may still have needed the storage
            entry.storage.resize_(0)
        return root, units

    def restore(self, unit: WeightUnit, *, wait: bool) -> None:
        """Bring `unit` back to the device if it is not there; with `wait`, make the compute stream wait for it."""
        if not unit.resident:
            if self._copy_stream is not None:
                with torch.cuda.stream(self._copy_stream):
                    if unit.written is not None:
                        self._copy_stream.wait_event(unit.written)
                    for entry in unit.storages:
                        entry.storage.resize_(entry.nbytes)  # allocated on the copy stream
                        as_bytes(entry.storage).copy_(entry.host, non_blocking=True)
                    unit.ready = new_event()
                    unit.ready.record(self._copy_stream)
            else:
                for entry in unit.storages:
                    entry.storage.resize_(entry.nbytes)
                    as_bytes(entry.storage).copy_(entry.host)
            unit.resident, unit.waited, unit.written = True, False, None
        if wait and not unit.waited:
            if unit.ready is not None:
                torch.cuda.current_stream(self.device).wait_event(unit.ready)
            unit.waited = True

    def free(self, units: list[WeightUnit]) -> None:
        """Release the device storage of `units` (resident ones), without waiting on CUDA."""
        if self._offload_stream is not None:
            compute = torch.cuda.current_stream(self.device)
            self._offload_stream.wait_stream(compute)  # the last forward's reads come first
            with torch.cuda.stream(self._offload_stream):
                for unit in units:
                    if unit.ready is not None:
                        self._offload_stream.wait_event(unit.ready)  # a look-ahead copy may still be landing
                    for entry in unit.storages:
                        device_bytes = as_bytes(entry.storage)
                        if self.write_back:
                            entry.host.copy_(device_bytes, non_blocking=True)
                        # Freed now, reused only once both streams are past their uses of it.
                        device_bytes.record_stream(self._offload_stream)
                        device_bytes.record_stream(compute)
                        entry.storage.resize_(0)
                    if self.write_back:
                        unit.written = new_event()
                        unit.written.record(self._offload_stream)
        else:
            for unit in units:
                for entry in unit.storages:
                    if self.write_back:
                        entry.host.copy_(as_bytes(entry.storage))
                    entry.storage.resize_(0)
        for unit in units:
            unit.resident, unit.waited, unit.ready = False, False, None

    def synchronize(self) -> None:
        """Wait for every copy in flight."""
        for stream in (self._copy_stream, self._offload_stream):
            if stream is not None:
                stream.synchronize()

    def _capture_unit(self, tensors: list[torch.Tensor], captured: dict[int, HostStorage], name: str) -> WeightUnit:
        """Take a host copy of each storage behind `tensors` and point the tensors at device storage."""
        unit = WeightUnit([])
        for tensor in tensors:
            source = tensor.untyped_storage()
            if source.nbytes() == 0:
                continue
            key = source.data_ptr()
            if key in captured:  # tied to a tensor another unit (or this one) already moved
                if tensor.device != self.device:
                    tensor.data = view_over(tensor, captured[key].storage, self.device)
                continue
            if source.device.type == "cpu" and self.device.type != "cpu":
                host = self._host_copy(source)
                storage = new_storage(source.nbytes(), self.device)
            elif source.device == self.device:
                host, storage = self._host_copy(source), source
            else:
                raise ValueError(f"{name}: a tensor is on {source.device}; this switcher manages {self.device}")
            entry = HostStorage(storage, host, source.nbytes())
            captured[key] = entry
            unit.storages.append(entry)
            if storage is not source:
                # Every tensor on this storage moves with it (views keep their offsets and strides).
                for other in tensors:
                    if other.untyped_storage().data_ptr() == key:
                        other.data = view_over(other, storage, self.device)
        return unit

    def _host_copy(self, storage: torch.UntypedStorage) -> torch.Tensor:
        host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=self._pin)
        host.copy_(as_bytes(storage))
        return host
