"""Started under torchrun by test_launch.py: `launch` with a stand-in for the node on rank 0.

    python -m torch.distributed.run --nproc-per-node 2 ... -m tests.gpu_worker.distributed.launch_probe OUT [break]

Rank 0 runs a step on every rank and writes what it saw to OUT; with `break` it then breaks the group."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

from gpu_worker.distributed import GroupBroken, GroupConfig, RankGroup
from node.launch import launch
from tests.gpu_worker.distributed.toy import ShardedForward, WhoAmI


def leader(group: RankGroup) -> int:
    seen = {"ranks": group.gather_from_all(WhoAmI()), "world_size": group.world_size}
    if sys.argv[2:] == ["break"]:
        try:
            group.run_on_all(ShardedForward(layers=4, fail_rank=1, fail_block=0))
        except GroupBroken as err:
            seen["broken"] = str(err)
    Path(sys.argv[1]).write_text(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(launch(leader, config=GroupConfig(collective_timeout=timedelta(seconds=3))))
