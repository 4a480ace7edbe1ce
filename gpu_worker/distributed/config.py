"""How a multi-GPU node's ranks are configured: the torchrun contract and the group's settings, read from the
environment before any rank connects (the ranks other than 0 have no Settings). Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

SP_DEGREE_ENV = "MONOLOGUE_SP_DEGREE"
SP_HEAD_GROUPS_ENV = "MONOLOGUE_SP_HEAD_GROUPS"


@dataclass(frozen=True)
class GroupConfig:
    """How the node's ranks talk; the same on every rank."""

    backend: str | None = None  # data plane; None: NCCL with CUDA, gloo without
    # A rank waiting this long in a model's collective for a peer gives up: this bounds how long a failed
    # step can hold the node. Longer than any single collective, far shorter than Temporal's heartbeat.
    collective_timeout: timedelta = timedelta(minutes=2)
    # The other ranks wait for rank 0's next step this long: as long as a node may sit idle.
    idle_timeout: timedelta = timedelta(days=365)
    # Sequence parallelism (sequence.py): how many ranks split each model forward; None: all of them, 1: none
    # (every rank runs every forward whole). Must divide the world size; the ranks form world / degree groups.
    sp_degree: int | None = None
    # All-to-all pipelining inside each attention: the most head groups (each model uses the largest count up to
    # this that splits its heads per rank; 1: plain Ulysses). 2: the paper model's best for the h200 preset.
    sp_head_groups: int = 2

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> GroupConfig:
        """The node's settings the ranks need before rank 0 reads its own: `MONOLOGUE_SP_DEGREE` (unset: every
        rank) and `MONOLOGUE_SP_HEAD_GROUPS` (default 2). Read here because the other ranks have no Settings."""
        degree = _positive(environ, SP_DEGREE_ENV)
        return cls(sp_degree=degree, sp_head_groups=_positive(environ, SP_HEAD_GROUPS_ENV) or cls.sp_head_groups)

    def sequence_degree(self, world_size: int) -> int:
        """The SP degree for a node of `world_size` ranks, or a ValueError naming the setting."""
        degree = world_size if self.sp_degree is None else self.sp_degree
        if degree < 1 or world_size % degree:
            raise ValueError(
                f"{SP_DEGREE_ENV}={degree} does not divide the node's {world_size} ranks: use a divisor of "
                f"{world_size} (1 turns sequence parallelism off)"
            )
        return degree


def _positive(environ: Mapping[str, str], name: str) -> int | None:
    """A positive integer setting, None when unset or blank."""
    text = environ.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return int(text)


@dataclass(frozen=True)
class TorchrunEnv:
    """The torchrun contract (RANK, WORLD_SIZE, LOCAL_RANK; MASTER_ADDR/PORT are read by env://).

    Read in this one place: these are the launcher's variables, not Monologue settings."""

    rank: int
    world_size: int
    local_rank: int

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> TorchrunEnv:
        missing = [name for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if name not in environ]
        if missing:
            raise ValueError(f"{', '.join(missing)} not set: start the node with torchrun --nproc-per-node <gpus>")
        return cls(int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ["LOCAL_RANK"]))
