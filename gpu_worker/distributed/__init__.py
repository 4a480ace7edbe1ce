"""The multi-GPU node runtime: one process per GPU under torchrun, acting as one node.

- **config.py**: `GroupConfig` (the SP settings every rank reads from the environment) and `TorchrunEnv`.
- **runtime.py**: `RankGroup`. Rank 0 sends each step (`run_on_all(work)`) to every rank; the others
  `serve()`. After every step the ranks agree on how it ended, so an error on any rank fails the step
  on rank 0 instead of hanging the node.
- **pipeline.py**: `DistributedPipeline`, rank 0's drop-in for `Pipeline`: every rank runs each chunk
  (sharded models need them all), rank 0 alone publishes.
- **sequence.py**: Ulysses sequence parallelism inside one model forward (`SequenceShard`, `UlyssesAttention`).
- **sp_model.py**, **sp_counts.py**, **sp_table.py**: the paper model of a node's time under SP (`monologue bench sp`).
- **sharding.py**: FSDP2 per transformer block (`.blocks`), with forward prefetch and optional host offload.
- **offload.py**: `ModelSwitcher`, one stage's models on the GPU at a time; per-block lazy restore
  overlapped with compute, offload without write-back (frozen weights). **weight_units.py**: how it
  captures, restores and frees each block's weights; **switch_report.py**: the visible cost of each switch.
- **storages.py**: device storages and their host copies (`HostCopy`: whole-model offload and restore).
- **numa.py**: pins each rank to its GPU's NUMA node, or says why it did not.
- **measure.py**: the figures the GPU benchmark reports (switch time, peak memory).
- **launch.py**: the torchrun entry point (`-m node.launch`); **node_activities.py**:
  the node's pinned activities over a DistributedPipeline (rank 0 only).

Everything but launch's rank-0 path and node_activities.py imports with torch and numpy alone: the GPU
machine has no service stack.
"""

from gpu_worker.distributed.config import GroupConfig, TorchrunEnv
from gpu_worker.distributed.errors import DistributedError, GroupBroken, RankError, StepFailed
from gpu_worker.distributed.measure import MemoryPeak, SwitchTiming, measure_switches, peak_memory, reset_peak_memory
from gpu_worker.distributed.numa import NumaPinning, parse_cpulist, pin_to_gpu_numa_node
from gpu_worker.distributed.offload import ModelSwitcher, SwitchReport
from gpu_worker.distributed.pipeline import DistributedPipeline
from gpu_worker.distributed.runtime import RankContext, RankGroup, Work, current_group
from gpu_worker.distributed.sharding import reset_after_failure, shard_model

__all__ = [
    "DistributedError",
    "DistributedPipeline",
    "GroupBroken",
    "GroupConfig",
    "MemoryPeak",
    "ModelSwitcher",
    "NumaPinning",
    "RankContext",
    "RankError",
    "RankGroup",
    "StepFailed",
    "SwitchReport",
    "SwitchTiming",
    "TorchrunEnv",
    "Work",
    "current_group",
    "measure_switches",
    "parse_cpulist",
    "peak_memory",
    "pin_to_gpu_numa_node",
    "reset_after_failure",
    "reset_peak_memory",
    "shard_model",
]
