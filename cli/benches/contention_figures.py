"""The contention bench's figures (cli/benches/contention.py), as pure functions of what the cluster recorded: each
session's leases (from the nodes' lease logs, a killed node's leases ending at its kill), its tenant, its first
lease's class, when it was created and when it ended. No I/O here, so the definitions can be tested on their own.

A session *waits* whenever it exists, has not ended and holds no lease: from its creation to its first lease, and
between one lease's end and the next one's start (after its node was killed, or after it gave its slot up)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

from monologue.contracts import ChunkKind, QueueClass


@dataclass(frozen=True)
class Lease:
    start: float  # epoch s
    end: float
    killed: bool  # it ended with its node's SIGKILL (not released)


@dataclass(frozen=True)
class SessionLeases:
    """One session as the figures see it."""

    tenant: str
    first_class: QueueClass  # its first lease's class (live, or the render's priority)
    created: float  # epoch s
    ended: float  # when it finished (or the end of the run, if it never did)
    leases: tuple[Lease, ...]  # by start

    def waiting(self) -> list[tuple[float, float]]:
        """The spans in which the session waited for a node (see the module's docstring)."""
        if not self.leases:
            return [(self.created, self.ended)] if self.ended > self.created else []
        starts = [lease.start for lease in self.leases]
        ends = [self.created] + [lease.end for lease in self.leases[:-1]]
        return [(end, start) for end, start in zip(ends, starts, strict=True) if start > end]


def queue_waits(sessions: list[SessionLeases]) -> dict[tuple[str, QueueClass], list[float]]:
    """Per (tenant, class): seconds from creation to the first lease (the first lease's class), and from giving a
    slot up (a lease its node released, followed by another: a yield, a move off a node found unresponsive, or a
    continue-as-new) to the next lease (MOVING). The waits after a node was killed are left out: they include the
    lease timeout, and `taken over` measures them."""
    waits: dict[tuple[str, QueueClass], list[float]] = defaultdict(list)
    for session in sessions:
        if not session.leases:
            continue
        waits[(session.tenant, session.first_class)].append(session.leases[0].start - session.created)
        for before, after in itertools.pairwise(session.leases):
            if not before.killed and after.start > before.end:
                waits[(session.tenant, QueueClass.MOVING)].append(after.start - before.end)
    return dict(waits)


def given_up(sessions: list[SessionLeases]) -> int:
    """Leases that ended with their node alive and were followed by another lease of the same session: yields, and
    moves after the workflow found a live node unresponsive (a lease heartbeat or a pinned activity timed out; a
    continue-as-new too). Minus the preemptions, what remains are moves no kill caused."""
    return sum(1 for session in sessions for before, _ in itertools.pairwise(session.leases) if not before.killed)


def jain(values: list[float]) -> float | None:
    """Jain's fairness index, (Σx)² / (n·Σx²): 1 when all are equal, 1/n when one value has everything."""
    squares = sum(value * value for value in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else None


@dataclass
class Fairness:
    """Jain's index over the tenants' x = slot-seconds / weight, counted only while every tenant had a session
    waiting (`window_s` seconds in all): slot-seconds are the seconds of leases the tenant's sessions held then.
    1.0 means the tenants got slots in proportion to their weights whenever all of them wanted more; with two
    tenants 0.5 means one of them got none. None when there was no such moment (or no slot was held in it)."""

    index: float | None = None
    window_s: float = 0.0
    slot_s: dict[str, float] = field(default_factory=dict)


def fairness(sessions: list[SessionLeases], weights: dict[str, float]) -> Fairness:
    """The `Fairness` of `sessions` between the tenants of `weights` (see `Fairness`)."""
    waiting: dict[str, list[tuple[float, float]]] = {tenant: [] for tenant in weights}
    holding: dict[str, list[tuple[float, float]]] = {tenant: [] for tenant in weights}
    for session in sessions:
        if session.tenant in weights:
            waiting[session.tenant] += session.waiting()
            holding[session.tenant] += [(lease.start, lease.end) for lease in session.leases]
    moments = sorted({moment for spans in (*waiting.values(), *holding.values()) for span in spans for moment in span})
    result = Fairness(slot_s={tenant: 0.0 for tenant in weights})
    for start, end in itertools.pairwise(moments):
        middle = (start + end) / 2  # every span's ends are moments: each piece is inside or outside each span
        if not all(_covers(waiting[tenant], middle) for tenant in weights):
            continue
        result.window_s += end - start
        for tenant in weights:
            result.slot_s[tenant] += (end - start) * sum(1 for span in holding[tenant] if span[0] <= middle < span[1])
    result.index = jain([result.slot_s[tenant] / weight for tenant, weight in weights.items()])
    return result


def _covers(spans: list[tuple[float, float]], moment: float) -> bool:
    return any(start <= moment < end for start, end in spans)


def chunk_seconds(chunks_done: list[dict[str, object]], renders: set[str]) -> list[float]:
    """Seconds from one N chunk done to the next (N(k) to N(k+1): an N chunk and a seam's I chunk, made in the order
    N0 N1 I0 N2 I1 …) of one render on one node, from the nodes' "chunk done" lines (`session_id`, `node_id`,
    `chunk` such as "N3", `at`): how long a render holds its slot per chunk under the run's load, which is what a
    session asking it to yield waits."""
    done: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for event in chunks_done:
        chunk, session = str(event.get("chunk", "")), str(event.get("session_id"))
        if session in renders and chunk.startswith(ChunkKind.N.value) and chunk[1:].isdigit():
            done[(session, str(event.get("node_id")))][int(chunk[1:])] = float(str(event["at"]))
    return [
        times[index + 1] - times[index]
        for times in done.values()
        for index in sorted(times)
        if index + 1 in times and times[index + 1] > times[index]
    ]


def first_node_kept(first_segment: dict[str, float], lease_starts: dict[str, list[float]]) -> set[str]:
    """The sessions that published their first segment under their first lease: no kill (nor a move of any kind)
    came between their start and their first frames. A live session whose node was killed in its first seconds waits
    out the lease timeout before a new node starts over; the recovery figures count that wait, and live TTFF is shown
    with and without those sessions."""
    return {
        session
        for session, published in first_segment.items()
        if sum(start < published for start in lease_starts.get(session, [])) == 1
    }
