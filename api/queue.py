"""The lease queue as the API shows it: a waiting session's `queue` (position, ETA, class), the operator's counts
(`/ops/api/queue`) and the `Retry-After` of a tenant at its session limit. The estimates are
`monologue.queueing`'s, over the snapshot `monologue.repo.queue` reads (docs/scheduling.md says what they ignore).
Every function here reads the database: coroutines call them on the thread pool."""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from monologue import queueing
from monologue.contracts import QueueClass
from monologue.db import SessionRow
from monologue.repo import queue as repo_queue
from monologue.schemas import QueuePlace

from .ops.schemas import OpsQueue, OpsQueueRunning, OpsQueueWaiting

if TYPE_CHECKING:  # only a type here: api.deps imports api.problems, whose 429 handler imports this module
    from .deps import Services

# Retry-After when none of the tenant's sessions has an end to estimate (no chunk time measured yet, or only live
# sessions): about a few chunks' time, so a client neither hammers the API nor waits far longer than it must.
DEFAULT_RETRY_AFTER_S = 30
MAX_RETRY_AFTER_S = 3600  # a client told to wait longer would rather give up; an hour bounds a wild estimate


def snapshot(services: Services, db: Session) -> queueing.QueueState:
    return repo_queue.queue_state(db, weight=services.settings.sched.weight)


def current(services: Services, db: Session) -> queueing.Estimate:
    """The estimate now: one snapshot for every session a response shows (a list reads it once)."""
    return queueing.estimate(snapshot(services, db))


def place(
    services: Services, db: Session, row: SessionRow, estimate: queueing.Estimate | None = None
) -> QueuePlace | None:
    """The session's place while it waits for a node; None once a node holds it (or it ended meanwhile)."""
    if not repo_queue.waits(row):
        return None
    found = (estimate or current(services, db)).places.get(row.id)
    if found is None:
        return None
    eta_s = None if found.eta_s is None else round(found.eta_s, 1)
    return QueuePlace(position=found.position, eta_s=eta_s, queue_class=found.queue_class)


def retry_after_s(services: Services, tenant: str | None) -> int:
    """When the tenant may likely start another session: the estimated end of its session ending first (running
    ones by their chunks left, waiting ones after their ETA), whole seconds from 1 to MAX_RETRY_AFTER_S;
    DEFAULT_RETRY_AFTER_S when no end can be estimated."""
    with services.sessions() as db:
        state = snapshot(services, db)
    ends = queueing.estimate(state).ends_s
    mine = [s.session_id for s in state.running if s.tenant == tenant]
    mine += [s.session_id for s in state.waiting if s.tenant == tenant]
    known = [end for session_id in mine if (end := ends.get(session_id)) is not None]
    seconds = min(known) if known else DEFAULT_RETRY_AFTER_S
    return min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))


def ops_queue(services: Services, db: Session) -> OpsQueue:
    """Sessions waiting by class and tenant and running by class (most urgent class first), and the slots."""
    state = snapshot(services, db)
    order = list(QueueClass)
    waiting = Counter((s.queue_class, s.tenant) for s in state.waiting)
    running = Counter(s.queue_class for s in state.running)
    return OpsQueue(
        waiting=[
            OpsQueueWaiting(queue_class=queue_class, tenant=tenant, sessions=count)
            for (queue_class, tenant), count in sorted(waiting.items(), key=lambda i: (order.index(i[0][0]), i[0][1]))
        ],
        running=[
            OpsQueueRunning(queue_class=queue_class, sessions=count)
            for queue_class, count in sorted(running.items(), key=lambda item: order.index(item[0]))
        ],
        slots=state.slots,
        seconds_per_chunk=state.seconds_per_chunk,
    )
