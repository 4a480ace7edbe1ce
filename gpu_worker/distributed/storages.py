"""Device storages and their host copies: how weights leave the accelerator and come back without their
tensors changing identity (parameters, hooks and FSDP's bookkeeping that hold them stay valid).

A model's tensors view storages; freeing a storage (`resize_(0)`) releases the device memory under every
tensor that views it, and refilling it from a host copy (`resize_` then `copy_`) restores them all.
`HostCopy` does this for whole models (`TorchModule.offload`); `UnitMover` (weight_units.py) block by block,
for `ModelSwitcher` (offload.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class HostStorage:
    """One device storage the model's tensors view, and its host copy (pinned with CUDA)."""

    storage: torch.UntypedStorage
    host: torch.Tensor  # (nbytes,) uint8
    nbytes: int


class HostCopy:
    """The host copy of some models' weights, for a module that parks its models whole between uses
    (`TorchModule.offload`). Taken once, never written back (the weights are frozen): `free` drops the
    device storages, `fill` copies the host copy back into them (asynchronously from pinned memory on
    CUDA). Tensors keep their identity: only their storages are resized."""

    def __init__(self, models: Sequence[nn.Module], *, pin_memory: bool | None = None) -> None:
        pin = torch.cuda.is_available() if pin_memory is None else pin_memory
        own_storages(models)
        captured: dict[int, HostStorage] = {}  # by data pointer: tied weights are copied once
        for model in models:
            for tensor in tensors_of(model):
                storage = tensor.untyped_storage()
                if storage.nbytes() == 0 or storage.data_ptr() in captured:
                    continue
                host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=pin)
                host.copy_(as_bytes(storage))
                captured[storage.data_ptr()] = HostStorage(storage, host, storage.nbytes())
        self.storages = list(captured.values())
        self.resident = True

    def free(self) -> None:
        """Release the device storages (the caching allocator reuses them only after work already queued)."""
        for entry in self.storages:
            entry.storage.resize_(0)
        self.resident = False

    def fill(self) -> None:
        if self.resident:
            return
        for entry in self.storages:
            entry.storage.resize_(entry.nbytes)
            as_bytes(entry.storage).copy_(entry.host, non_blocking=entry.host.is_pinned())
        self.resident = True

    @property
    def device_bytes(self) -> int:
        """Bytes of the weights on the device now (0 once freed)."""
        return sum(entry.storage.nbytes() for entry in self.storages)


def tensors_of(module: nn.Module) -> list[torch.Tensor]:
    return [*module.parameters(), *module.buffers()]


def own_storages(modules: Sequence[nn.Module]) -> None:
    """Give each tensor whose storage cannot be resized a copy that can, so it may be freed and refilled in place:
    weights loaded from a checkpoint view the memory-mapped file until they move to a device, so on the CPU they
    still do. Tensors that shared a storage share its copy (tied weights stay tied); parameters keep their
    identity (only `.data` changes)."""
    copies: dict[int, torch.UntypedStorage] = {}
    for module in modules:
        for tensor in tensors_of(module):
            storage = tensor.untyped_storage()
            if storage.resizable() or storage.nbytes() == 0:
                continue
            copy = copies.setdefault(storage.data_ptr(), storage.clone())  # type: ignore[no-untyped-call]
            tensor.data = view_over(tensor, copy, tensor.device)


def as_bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """A (nbytes,) uint8 tensor over the whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def view_over(tensor: torch.Tensor, storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """`tensor`'s layout (offset, sizes, strides) over another storage."""
    return torch.empty(0, dtype=tensor.dtype, device=device).set_(
        storage, tensor.storage_offset(), tensor.size(), tensor.stride()
    )


# torch's storage, CUDA stream and event constructors are untyped; these give mypy their types.


def new_storage(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    return torch.UntypedStorage(nbytes, device=device)  # type: ignore[no-untyped-call]


def new_event(*, timing: bool = False) -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]


def new_stream(device: torch.device) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
