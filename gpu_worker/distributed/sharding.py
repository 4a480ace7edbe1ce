"""FSDP2 sharding of the node's large models: one `fully_shard` per transformer block, then the root.

Sharding per block is what lets a model bigger than one GPU run at all, and what makes its weights
cheap to keep on the host: each rank holds 1/W of every block, and a block is gathered whole only for
its own forward. Forward prefetch asks FSDP to start block n+1's all-gather (and, with host offload, its
host-to-device copy, on FSDP's copy-in stream) while block n computes.

With `host_offload`, the shards live in pinned host memory for good (FSDP2's `CPUOffloadPolicy`) and
stream in per block, every forward. At 54.5 GB/s per GPU (GPU_NOTES) a 350 MB block sharded over 8
GPUs is 44 MB per rank, under 1 ms, well hidden behind a block's 30 ms of compute: an idle model
then costs no GPU memory and switching to it costs almost nothing. Unsharded (one GPU), the same block
takes 6.7 ms and hides only behind long sequences; `offload.ModelSwitcher` keeps such models resident
while they run instead.

Precision: FSDP gathers and computes in `param_dtype` (by default the dtype the parameters are stored in:
bf16 on CUDA for the dit family, see `gpu_worker.models.dit.runtime.Precision`, so nothing is cast) and
would reduce gradients in fp32. Sharded inference runs under `torch.no_grad()`: FSDP2 cannot unshard
parameters under `torch.inference_mode()` (torch 2.11).

Models must expose their transformer blocks as `.blocks: nn.ModuleList`; anything else is sharded with
the root. Works on CPU meshes with gloo (tests), where streams and pinning are no-ops.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

ModelT = TypeVar("ModelT", bound=nn.Module)


def transformer_blocks(model: nn.Module) -> nn.ModuleList:
    """The model's `.blocks`, or TypeError naming what it has instead."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} has no `.blocks: nn.ModuleList` (found {type(blocks).__name__}); "
            "sharding and offload work per transformer block"
        )
    return blocks


def shard_model(
    model: ModelT,
    mesh: DeviceMesh,
    *,
    host_offload: bool = False,
    prefetch: int = 1,
    param_dtype: torch.dtype | None = None,
) -> ModelT:
    """Shard `model` in place over `mesh`: each block, then the root. Returns the model (now also an
    FSDPModule).

    host_offload: keep the shards in (pinned, with CUDA) host memory and copy them in per block.
    prefetch: how many following blocks each block's forward starts gathering (0: none).
    param_dtype: the dtype FSDP gathers and computes in (None: the parameters' own dtype).
    """
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    blocks = transformer_blocks(model)
    offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if host_offload else OffloadPolicy()
    precision = mixed_precision(param_dtype or _stored_dtype(model))
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=True, offload_policy=offload, mp_policy=precision)
    fully_shard(model, mesh=mesh, offload_policy=offload, mp_policy=precision)
    root = _fsdp(model)
    sharded: list[FSDPModule] = [_fsdp(block) for block in blocks]
    if prefetch and sharded:
        # The root's own weights (embeddings) are gathered first; the first block's gather overlaps them.
        root.set_modules_to_forward_prefetch(sharded[:prefetch])
        for index, current in enumerate(sharded):
            following = sharded[index + 1 : index + 1 + prefetch]
            if following:
                current.set_modules_to_forward_prefetch(following)
    return model


def mixed_precision(param_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """FSDP2's policy: gather and compute in `param_dtype` (None: each parameter's own), reduce in fp32."""
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def _stored_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's floating-point parameters (fp32 when it has none), or None where they mix (the
    infinitetalk DiT's fp32 modulation and head among bf16 blocks): each computes in its own, FSDP2 gathering a
    group of mixed dtypes as bytes."""
    dtypes = {parameter.dtype for parameter in model.parameters() if parameter.is_floating_point()}
    if len(dtypes) > 1:
        return None
    return dtypes.pop() if dtypes else torch.float32


def reset_after_failure(model: nn.Module) -> None:
    """Put a sharded model back in its idle state after an exception aborted its forward (rank-local, no
    collectives): register it with `RankGroup.on_step_failure`."""
    root = _fsdp(model)
    reset = getattr(root, "reset_iter_state", None)
    if callable(reset):  # torch >= 2.13
        reset()
        return
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def _fsdp(module: nn.Module) -> FSDPModule:
    if not isinstance(module, FSDPModule):
        raise TypeError(f"{type(module).__name__} is not sharded (fully_shard was not applied to it)")
    return module
