"""The rank group of a multi-GPU node: rank 0 hands a step to every rank, all run it, all agree on how it
ended.

A node is one process per GPU under `torchrun`. Rank 0 hosts the Temporal worker; the others only
compute. A step is a small picklable `Work` (what to run, plus the few arrays it needs): rank 0
broadcasts it (`run_on_all`), every rank runs `work.run(context)` with its own rank-local state, and
then the ranks exchange a status (their error, if any, and how many collectives they issued). Rank 0
returns its own result, or raises:

- its own exception, unchanged, when rank 0 itself failed (other ranks' errors attached as notes);
- `StepFailed` when only other ranks failed;
- `GroupBroken` when the ranks issued different numbers of collectives on the data plane: one of them
  failed half-way through a sharded forward, and their next collectives would pair the wrong
  messages. The group refuses further work; the node drains and restarts.

Two process groups keep the two kinds of traffic apart. The *control plane* (gloo, the default group)
carries steps and statuses as pickled bytes, and waits as long as the node is idle. The *data plane*
(NCCL on GPUs, gloo on CPU) carries the models' collectives with a short timeout, so a rank left waiting
for a peer that raised gives up, reaches the status exchange and reports instead of hanging. A step that
raises on one rank therefore never deadlocks the others: at worst they wait `collective_timeout`.

Sequence parallelism (sequence.py) runs on the data plane too: `RankGroup.sp` is the data-plane group
itself when the SP degree is the world size (the default; the same ranks FSDP2 shards over), or this rank's
run of `degree` consecutive ranks, a watched group of its own, when the degree is smaller; None at degree 1.

This module never imports the service stack (Temporal, the database): the GPU machine lacks it.
"""

from __future__ import annotations

import logging
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from gpu_worker.distributed.config import GroupConfig
from gpu_worker.distributed.errors import GroupBroken, RankError, StepFailed
from gpu_worker.distributed.sequence import SPGroup

log = logging.getLogger(__name__)

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")

_SHUTDOWN = b""  # the control-plane message that ends `serve`
_current: RankGroup | None = None


@dataclass
class RankContext:
    """What a step sees on the rank it runs on."""

    rank: int
    world_size: int
    device: torch.device
    group: RankGroup
    # Rank-local state that outlives steps: pipelines, their session mirrors, models. Every rank runs the
    # same steps in the same order, so the same code keeps these in step across ranks.
    local: dict[str, Any]
    # Rank 0 only: objects the caller handed to this step (a frame sink, a live session). Never sent.
    extras: Mapping[str, Any] = field(default_factory=dict)


class Work(Protocol[T_co]):
    """One step. Instances must pickle (dataclasses of ids, numbers and small arrays), and their class
    must be importable on every rank: pickle sends the class by name, never code."""

    def run(self, context: RankContext) -> T_co: ...


@dataclass(frozen=True)
class _Message:
    work: Work[Any]
    gather: bool


@dataclass(frozen=True)
class _Status:
    rank: int
    error: RankError | None
    sequence: tuple[int, ...] | None  # collectives issued so far on each watched data-plane group
    result: bytes | None  # pickled, only when rank 0 gathers


def current_group() -> RankGroup | None:
    """The group this process belongs to, or None in a single-process node. Families use it to find the
    mesh to shard over without every Module constructor taking a group."""
    return _current


class RankGroup:
    """The ranks of one node. Rank 0 calls `run_on_all`/`gather_from_all` and finally `shutdown`; every
    other rank calls `serve`, which returns at shutdown."""

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        data: dist.ProcessGroup,
        sp: SPGroup | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.data = data
        # The ranks this rank splits each model forward with (DistributedPipeline runs chunks under it); None: off.
        self.sp = sp
        self._watched: list[dist.ProcessGroup] = [data]
        if sp is not None and sp.group is not data:
            self._watched.append(sp.group)
        self._mesh: DeviceMesh | None = None
        # Activities call in from several threads; steps go one at a time (re-entrant: see `exclusive`).
        self._lock = threading.RLock()
        self._broken = False
        self._failure_callbacks: list[Callable[[], None]] = []
        self._broken_callbacks: list[Callable[[], None]] = []
        self.context = RankContext(rank=rank, world_size=world_size, device=device, group=self, local={})

    @classmethod
    def initialize(
        cls,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        init_method: str = "env://",
        config: GroupConfig | None = None,
    ) -> RankGroup:
        """Join the node's process group (every rank calls this, with the same config; None: the defaults)."""
        config = config or GroupConfig()
        global _current
        if _current is not None:
            raise RuntimeError("this process already belongs to a rank group")
        degree = config.sequence_degree(world_size)  # a bad setting fails before any rank connects
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        backend = config.backend or ("nccl" if cuda else "gloo")
        # The default group is the control plane: gloo (CPU bytes, no GPU memory), patient while idle.
        dist.init_process_group(
            "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=config.idle_timeout
        )
        data = dist.new_group(backend=backend, timeout=config.collective_timeout)
        if data is None:  # only for ranks outside the group, and every rank is inside
            raise RuntimeError("could not create the data-plane process group")
        sp = _sequence_group(rank, world_size, degree, config, backend, data)
        _current = cls(rank=rank, world_size=world_size, device=device, data=data, sp=sp)
        log.info("rank %d/%d ready on %s (data plane %s, SP degree %d)", rank, world_size, device, backend, degree)
        return _current

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def broken(self) -> bool:
        return self._broken

    @property
    def mesh(self) -> DeviceMesh:
        """A 1-D device mesh over the data plane: what `fully_shard` shards over."""
        if self._mesh is None:
            self._mesh = DeviceMesh.from_group(self.data, self.device.type)
        return self._mesh

    def watch(self, group: dist.ProcessGroup) -> None:
        """Check another data-plane group (sequence parallelism's, say) for mismatched collectives."""
        self._watched.append(group)

    def on_step_failure(self, callback: Callable[[], None]) -> None:
        """Run `callback` on this rank after a step failed on any rank (reset per-step state, e.g. FSDP's
        `reset_iter_state`). Every rank runs its callbacks, so they must not communicate or raise."""
        self._failure_callbacks.append(callback)

    def on_broken(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the group breaks (the node uses it to start draining)."""
        self._broken_callbacks.append(callback)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Rank 0: hold the group between reading rank-local state and sending the step built from it, so no
        other thread's step runs in between."""
        with self._lock:
            yield

    def run_on_all(self, work: Work[T], *, extras: Mapping[str, Any] | None = None) -> T:
        """Rank 0: run `work` on every rank; return rank 0's result (see the module docstring for errors)."""
        result, _ = self._step(work, extras or {}, gather=False)
        return result

    def gather_from_all(self, work: Work[T], *, extras: Mapping[str, Any] | None = None) -> list[T]:
        """Rank 0: like `run_on_all`, but return every rank's result, in rank order (they are pickled)."""
        result, others = self._step(work, extras or {}, gather=True)
        return [result, *others]

    def serve(self) -> None:
        """Ranks other than 0: run rank 0's steps until it shuts the group down.

        Failed steps are logged here and reported to rank 0; only a broken group ends the loop early,
        with GroupBroken."""
        if self.is_leader:
            raise RuntimeError("rank 0 sends work (run_on_all); only the other ranks serve")
        while True:
            payload = self._control(lambda: self._broadcast(None), "waiting for rank 0's next step")
            if payload == _SHUTDOWN:
                log.info("rank %d: shutdown", self.rank)
                return
            gather, outcome = False, None
            try:
                message = pickle.loads(payload)
                gather = message.gather
                outcome = self._run(message.work, {})
            except Exception as exc:  # a message that does not unpickle here fails the step like any error
                outcome = (None, self._rank_error(exc), exc)
            result, error, _ = outcome
            blob = None
            if gather and error is None:
                try:
                    blob = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as exc:
                    error = self._rank_error(exc)
            statuses = self._exchange(_Status(self.rank, error, self._sequence(), blob))
            broken, errors = self._settle(statuses)
            if error is not None:
                log.warning("rank %d: step failed: %s\n%s", self.rank, error, error.traceback)
            if broken:
                raise GroupBroken(_describe("the ranks' collectives no longer match", errors), errors)

    def shutdown(self) -> None:
        """Rank 0: end every other rank's `serve` loop. A broken group cannot be reached: nothing is sent."""
        if not self.is_leader:
            raise RuntimeError("only rank 0 shuts the group down")
        with self._lock:
            if not self._broken:
                self._control(lambda: self._broadcast(_SHUTDOWN), "sending shutdown")

    def close(self) -> None:
        """Leave the process group (every rank, last)."""
        global _current
        if dist.is_initialized():
            dist.destroy_process_group()
        if _current is self:
            _current = None

    # The step protocol.

    def _step(self, work: Work[T], extras: Mapping[str, Any], *, gather: bool) -> tuple[T, list[Any]]:
        if not self.is_leader:
            raise RuntimeError("only rank 0 sends work; the other ranks serve")
        with self._lock:
            if self._broken:
                raise GroupBroken("this node's rank group is broken (a previous step failed mid-collective)")
            # Pickle before sending anything: a message that cannot pickle fails here, on rank 0 alone.
            payload = pickle.dumps(_Message(work, gather), protocol=pickle.HIGHEST_PROTOCOL)
            self._control(lambda: self._broadcast(payload), f"sending {type(work).__name__}")
            result, error, exc = self._run(work, extras)
            statuses = self._exchange(_Status(0, error, self._sequence(), None))
            broken, errors = self._settle(statuses)
        name = type(work).__name__
        if broken:
            raise GroupBroken(_describe(f"{name}: the ranks' collectives no longer match", errors), errors) from exc
        if exc is not None:
            for other in errors[1:] if errors and errors[0].rank == 0 else errors:
                exc.add_note(f"also failed on {other}")
            raise exc
        if errors:
            raise StepFailed(_describe(f"{name} failed", errors), errors)
        others = [pickle.loads(status.result) if status.result is not None else None for status in statuses[1:]]
        return result, others  # type: ignore[return-value]  # result is a T whenever there was no error

    def _run(self, work: Work[T], extras: Mapping[str, Any]) -> tuple[T | None, RankError | None, Exception | None]:
        self.context.extras = extras
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # activity threads start on device 0
            return work.run(self.context), None, None
        except Exception as exc:
            return None, self._rank_error(exc), exc
        finally:
            self.context.extras = {}

    def _rank_error(self, exc: BaseException) -> RankError:
        return RankError(self.rank, type(exc).__name__, str(exc), "".join(traceback.format_exception(exc)))

    def _broadcast(self, payload: bytes | None) -> bytes:
        box: list[Any] = [payload]
        dist.broadcast_object_list(box, src=0)
        received: bytes = box[0]
        return received

    def _exchange(self, status: _Status) -> list[_Status]:
        statuses: list[Any] = [None] * self.world_size
        self._control(lambda: dist.all_gather_object(statuses, status), "exchanging step statuses")
        return statuses

    def _sequence(self) -> tuple[int, ...] | None:
        try:
            # Not in torch's stubs, but in every backend since 1.9: collectives this rank issued on the group.
            return tuple(group._get_sequence_number_for_group() for group in self._watched)  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):  # a backend that does not count: fall back to "any error breaks"
            return None

    def _settle(self, statuses: list[_Status]) -> tuple[bool, tuple[RankError, ...]]:
        """Every rank reaches the same verdict from the same statuses and resets itself accordingly."""
        errors = tuple(status.error for status in statuses if status.error is not None)
        sequences = {status.sequence for status in statuses}
        broken = len(sequences) > 1 or (None in sequences and bool(errors))
        if broken:
            self._mark_broken()
        elif errors:
            for callback in self._failure_callbacks:
                try:
                    callback()
                except Exception:
                    log.exception("rank %d: step-failure callback raised", self.rank)
        return broken, errors

    def _control(self, call: Callable[[], T], doing: str) -> T:
        """A control-plane collective; if it fails, the ranks cannot agree on anything any more."""
        try:
            return call()
        except Exception as exc:
            self._mark_broken()
            raise GroupBroken(f"rank {self.rank}: control plane failed while {doing}: {exc}") from exc

    def _mark_broken(self) -> None:
        if self._broken:
            return
        self._broken = True
        log.error("rank %d: rank group broken", self.rank)
        for callback in self._broken_callbacks:
            try:
                callback()
            except Exception:
                log.exception("rank %d: broken-group callback raised", self.rank)


def _sequence_group(
    rank: int, world_size: int, degree: int, config: GroupConfig, backend: str, data: dist.ProcessGroup
) -> SPGroup | None:
    """This rank's SP group: the whole data plane when the degree is the world size (the FSDP2 mesh's group),
    else its run of `degree` consecutive ranks (every rank creates every run: new_group is collective)."""
    if degree == 1:
        return None
    if degree == world_size:
        return SPGroup(data, degree, rank, config.sp_head_groups)
    mine = None
    for first in range(0, world_size, degree):
        group = dist.new_group(list(range(first, first + degree)), backend=backend, timeout=config.collective_timeout)
        if first <= rank < first + degree:
            mine = group
    if mine is None:
        raise RuntimeError("could not create this rank's sequence-parallel process group")
    return SPGroup(mine, degree, rank % degree, config.sp_head_groups)


def _describe(what: str, errors: tuple[RankError, ...]) -> str:
    return f"{what}: " + "; ".join(str(error) for error in errors) if errors else what
