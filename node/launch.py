"""One multi-GPU node: `torchrun --nproc-per-node <gpus> -m node.launch`.

Every rank pins itself to its GPU's NUMA node and joins the node's rank group. Rank 0 then runs the
ordinary node process (`node.worker.run_node`: the Temporal workers, leases, publishing) with pinned
activities whose pipelines run on every rank; the other ranks serve rank 0's steps until it shuts them
down. The node's settings are read by rank 0 only, as in a single-process node, except the two every rank
needs before it joins: `MONOLOGUE_SP_DEGREE` (how many ranks split each model forward: unset, all of them;
1, none; it must divide the number of ranks) and `MONOLOGUE_SP_HEAD_GROUPS` (the most, default 2), read by
`GroupConfig.from_environ`.

If the rank group breaks (a rank failed in the middle of a collective), rank 0 drains the node at once:
its leases end, Temporal moves its sessions to other nodes, and every rank exits with status 1 so
that `torchrun --max-restarts` starts the node afresh. A clean stop (SIGTERM/SIGINT to rank 0) exits 0.
The other ranks ignore those signals and leave when rank 0 tells them to, after its last chunk.

Nothing here imports the service stack at module level: ranks other than 0 never need it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING

from gpu_worker.distributed.config import GroupConfig, TorchrunEnv
from gpu_worker.distributed.errors import GroupBroken
from gpu_worker.distributed.numa import pin_to_gpu_numa_node
from gpu_worker.distributed.runtime import RankGroup

if TYPE_CHECKING:
    from monologue.settings import Settings

log = logging.getLogger(__name__)

Leader = Callable[[RankGroup], int]


def main() -> int:
    """The torchrun entry point: rank 0 runs the node, the other ranks serve it."""
    return launch(serve_node)


def launch(leader: Leader, *, config: GroupConfig | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """Run `leader(group)` on rank 0 and serve on the others; returns this rank's exit status. `config` None:
    the defaults with the SP settings from `environ`."""
    env = TorchrunEnv.from_environ(environ)
    if not logging.getLogger().handlers:
        line = f"%(asctime)s rank {env.rank} %(levelname)s %(name)s: %(message)s"
        logging.basicConfig(level=logging.INFO, format=line)
    pin_to_gpu_numa_node(env.local_rank)
    group = RankGroup.initialize(
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        config=config or GroupConfig.from_environ(environ),
    )
    try:
        if group.is_leader:
            try:
                status = leader(group)
            finally:
                group.shutdown()  # sends nothing if the group broke: the others have left already
            return 1 if group.broken else status
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _ignored)
        try:
            group.serve()
        except GroupBroken:
            log.exception("rank %d: leaving a broken rank group", group.rank)
            return 1
        return 0
    finally:
        group.close()


def serve_node(group: RankGroup) -> int:
    """Rank 0: the node process, with the service stack imported only now."""
    import asyncio

    from monologue.logs import configure_logging
    from monologue.settings import get_settings

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(_run_node(group, settings))
    return 0


async def _run_node(group: RankGroup, settings: Settings) -> None:
    import asyncio

    from node.distributed_activities import DistributedNodeActivities
    from node.worker import run_node

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def drain() -> None:  # called from the activity thread whose step found the group broken
        loop.call_soon_threadsafe(stop.set)

    group.on_broken(drain)
    await run_node(settings, stop=stop, node_activities=partial(DistributedNodeActivities, group=group))


def _ignored(signum: int, frame: object) -> None:
    log.info("signal %d ignored: this rank leaves when rank 0 shuts the group down", signum)


if __name__ == "__main__":
    sys.exit(main())
