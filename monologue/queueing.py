"""Where a session waiting for a node stands, and about when it gets one: an estimate for clients (the `queue` field
of a session) and operators, computed from a snapshot of the sessions. Pure: no database, no clock, no torch (the
repo reader, `monologue/repo/queue.py`, gathers the snapshot). It must never decide anything: Temporal's matcher
orders the real lease queue (docs/scheduling.md), and this only mirrors its rules to say what they will likely do.

The rules it mirrors, in dispatch order:
1. classes, most urgent first (`QueueClass.priority_key`: live, moving, high, normal, low);
2. within a class, weighted fair sharing between tenants, modelled as virtual finish times: a tenant's k-th waiting
   session of the class (FIFO by creation) gets the tag k / weight, and tags go out lowest first (ties: the session
   created first). While tenants a and b both wait, dispatches then alternate in proportion to their weights;
3. the ETA by list scheduling: each slot is free once the session on it ends (its chunks left × seconds per chunk,
   0 for a free slot); each session ahead, in dispatch order, takes the earliest free slot for its whole length.

What it ignores (so an ETA is a guide, not a promise): sessions that arrive later in a more urgent class or with an
earlier tag; the tenants' history in Temporal's fairness counters (tags restart from the sessions waiting now);
preemption (a waiting live session gets a render's slot within about a chunk, and that render then waits as
`moving`); sessions moving between nodes (invisible in the database); chunk times that vary by family and size."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from monologue.contracts import QueueClass

FOREVER = math.inf  # a slot held by a session of unknown length (a live one), or of no known chunk time


@dataclass(frozen=True)
class Waiting:
    """A session waiting for a node. `chunks`: its length in chunks (known, or estimated from its audio); None
    for a session that holds its slot for as long as its speaker talks (a live one)."""

    session_id: str
    tenant: str
    queue_class: QueueClass
    created_at: datetime
    chunks: int | None


@dataclass(frozen=True)
class Running:
    """A session holding a slot now, with the chunks it has left (None: unknown, a live session)."""

    session_id: str
    tenant: str
    queue_class: QueueClass
    chunks_left: int | None


@dataclass(frozen=True)
class QueueState:
    """A snapshot of the queue. `slots`: places on the nodes that are up (at least 1: with none up, sessions still
    wait for the first); `seconds_per_chunk`: a recent chunk time, None before any was measured; `weight`: a
    tenant's fairness weight (`SchedSettings.weight`)."""

    waiting: Sequence[Waiting]
    running: Sequence[Running]
    slots: int
    seconds_per_chunk: float | None
    weight: Callable[[str], float]

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1 (sessions wait for the first node), got {self.slots}")
        if self.seconds_per_chunk is not None and self.seconds_per_chunk <= 0:
            raise ValueError(f"seconds_per_chunk must be positive or None, got {self.seconds_per_chunk}")


@dataclass(frozen=True)
class Place:
    """A waiting session's place: `position` sessions go out before it (0: next); `eta_s`: seconds from the snapshot
    until a slot is likely free for it, None when that hangs on a chunk time not measured yet or on a live session's
    end."""

    position: int
    eta_s: float | None
    queue_class: QueueClass


@dataclass(frozen=True)
class Estimate:
    """Every waiting session's place, and when every session (waiting or running) is likely to end, in seconds from
    the snapshot (None: not known)."""

    places: dict[str, Place] = field(default_factory=dict)
    ends_s: dict[str, float | None] = field(default_factory=dict)


def dispatch_order(waiting: Iterable[Waiting], weight: Callable[[str], float]) -> list[Waiting]:
    """The waiting sessions in the order the lease queue likely hands them out (rules 1 and 2 above)."""
    ranks: dict[tuple[str, QueueClass], int] = {}
    keyed: list[tuple[tuple[int, float, datetime, str], Waiting]] = []
    for session in sorted(waiting, key=lambda s: (s.created_at, s.session_id)):
        rank = ranks[(session.tenant, session.queue_class)] = ranks.get((session.tenant, session.queue_class), 0) + 1
        tag = rank / weight(session.tenant)
        keyed.append(((session.queue_class.priority_key, tag, session.created_at, session.session_id), session))
    return [session for _, session in sorted(keyed, key=lambda pair: pair[0])]


def estimate(state: QueueState) -> Estimate:
    """Positions and ETAs of the waiting sessions, and everyone's likely end (rule 3 above)."""
    spc = state.seconds_per_chunk
    ends: dict[str, float | None] = {run.session_id: _known(_length_s(run.chunks_left, spc)) for run in state.running}
    busy = sorted(_length_s(run.chunks_left, spc) for run in state.running)[: state.slots]
    free = [0.0] * (state.slots - len(busy)) + busy  # sorted, so already a heap
    places: dict[str, Place] = {}
    for position, session in enumerate(dispatch_order(state.waiting, state.weight)):
        start = heapq.heappop(free)
        end = start + _length_s(session.chunks, spc)
        heapq.heappush(free, end)
        places[session.session_id] = Place(position, _known(start), session.queue_class)
        ends[session.session_id] = _known(end)
    return Estimate(places, ends)


def _length_s(chunks: int | None, seconds_per_chunk: float | None) -> float:
    if chunks is None or seconds_per_chunk is None:
        return FOREVER
    return max(chunks, 0) * seconds_per_chunk


def _known(seconds: float) -> float | None:
    return None if seconds == FOREVER else seconds
