"""The node's pinned activities on a multi-GPU node: `NodeActivities` whose pipelines run on every rank.

Imported by rank 0 only, and only when it starts the node: it pulls in the service stack (Temporal,
SQLAlchemy, storage), which the other ranks, and the GPU machine's bare environment, do not have.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker

from activities.fault_injection import Faults
from activities.node import NodeActivities
from gpu_worker.distributed.pipeline import DistributedPipeline
from gpu_worker.distributed.runtime import RankGroup
from monologue.storage import ObjectStore


class DistributedNodeActivities(NodeActivities):
    """Everything as in NodeActivities (caching, ordering, checkpoints, publishing), except that each
    family's pipeline is a DistributedPipeline over the node's rank group."""

    def __init__(
        self,
        *,
        group: RankGroup,
        store: ObjectStore,
        sessions: sessionmaker[Any],
        node_id: str,
        faults: Faults | None = None,
        scratch_dir: Path | None = None,
    ) -> None:
        super().__init__(
            store=store,
            sessions=sessions,
            node_id=node_id,
            faults=faults,
            scratch_dir=scratch_dir,
            pipeline_factory=lambda family: DistributedPipeline(group, family),
        )
        self._group = group
