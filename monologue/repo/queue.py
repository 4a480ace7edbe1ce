"""Read-only: the snapshot `monologue.queueing` estimates queue positions and ETAs from, in four queries (the active
sessions, the chunks done of those running, the nodes, recent chunk times). Never writes.

Which sessions wait: renders are marked `running` by `prepare` before they hold a node, and `node_id` is set when a
node takes them, so a session waits while it is `queued`, or `running` without a node (`waits`). A session that held
a node before keeps that node's id: one moving after its node was lost (or after yielding its slot) looks as if it
still ran there and is not seen waiting; a resumed one is `queued` with its old node's id, and counts as `moving`."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import and_, or_, select
from sqlalchemy.orm import Session

from monologue import contracts as c
from monologue.db import ChunkRow, ChunkStatus, SessionRow, utcnow
from monologue.plan import AUDIO_RATE, chunk_sizes, frame_count, plan_chunks
from monologue.queueing import QueueState, Running, Waiting
from monologue.repo import ops as repo_ops
from monologue.repo.nodes import aware, live_nodes

RECENT_CHUNKS = 50  # chunk times measured over the latest chunks of the renders running now

WAITING = or_(
    SessionRow.status == c.SessionStatus.QUEUED,
    and_(SessionRow.status == c.SessionStatus.RUNNING, SessionRow.node_id.is_(None)),
)


def waits(row: SessionRow) -> bool:
    """The session waits for a node (the row-level twin of `WAITING`)."""
    return row.status == c.SessionStatus.QUEUED or (row.status == c.SessionStatus.RUNNING and row.node_id is None)


def queue_state(db: Session, *, weight: Callable[[str], float], now: datetime | None = None) -> QueueState:
    """The queue as the database shows it now."""
    active = (c.SessionStatus.QUEUED, c.SessionStatus.RUNNING)
    rows = list(db.scalars(select(SessionRow).where(SessionRow.status.in_(active))))
    holding = [row for row in rows if not waits(row)]
    done = repo_ops.chunk_totals(db, session_ids=[row.id for row in holding])
    running = [Running(row.id, row.tenant, queue_class(row), _chunks_left(row, done.get(row.id))) for row in holding]
    waiting = [
        Waiting(row.id, row.tenant, queue_class(row), aware(row.created_at), chunks_of(row))
        for row in rows
        if waits(row)
    ]
    return QueueState(
        waiting=waiting,
        running=running,
        slots=slots(db, now=now or utcnow()),
        seconds_per_chunk=seconds_per_chunk(db, session_ids=[row.id for row in holding]),
        weight=weight,
    )


def queue_class(row: SessionRow) -> c.QueueClass:
    """The session's class, as far as its row tells: a waiting session that held a node before (resumed, or its node
    lost) is `moving`; one that gave its slot up (it no longer names a node) `yielded`. (A render that yielded to a
    fairer share queues in its own class: counted as yielded here, an estimate's error.)"""
    priority = c.render_options(row.options or {}).priority
    waiting = waits(row)
    moving, yielded = waiting and row.node_id is not None, waiting and row.node_id is None and row.preemptions > 0
    return c.QueueClass.of(c.SessionKind(row.kind), priority, moving=moving, yielded=yielded)


def chunks_of(row: SessionRow) -> int | None:
    """The session's length in chunks: known once `prepare` has sized it, else planned from its audio as `prepare`
    will. None for a live session (it lasts as long as its speaker talks)."""
    if row.kind == c.SessionKind.LIVE:
        return None
    if row.chunks_total is not None:
        return row.chunks_total
    options = c.render_options(row.options or {})
    frames = frame_count(round((row.audio_seconds or 0) * AUDIO_RATE), rate=AUDIO_RATE, fps=options.fps)
    return len(plan_chunks(frames, **chunk_sizes(options))) if frames >= 1 else 1


def _chunks_left(row: SessionRow, done: repo_ops.ChunkTotals | None) -> int | None:
    total = chunks_of(row)
    return None if total is None else max(total - (done.chunks_done if done else 0), 0)


def slots(db: Session, *, now: datetime) -> int:
    """Places on the nodes that are up and reported lately (`repo.nodes.live_nodes`); at least 1."""
    return max(1, sum(node.capacity for node in live_nodes(db, now=now)))


def seconds_per_chunk(db: Session, *, session_ids: list[str]) -> float | None:
    """A recent chunk time, measured on the renders among `session_ids` (those running now) over their latest
    RECENT_CHUNKS chunks: the median time between two chunks of one session finishing, which includes everything a
    slot spends on a chunk (encoding, storage, Temporal); before any session has two chunks, the median of the
    chunks' own stage times. None before any chunk is done."""
    if not session_ids:
        return None
    query = (
        select(ChunkRow.session_id, ChunkRow.updated_at, ChunkRow.stage_ms)
        .join(SessionRow, SessionRow.id == ChunkRow.session_id)
        .where(
            ChunkRow.session_id.in_(session_ids),
            ChunkRow.status == ChunkStatus.DONE,
            SessionRow.kind == c.SessionKind.RENDER,  # a live session's chunks wait for its speech, not its slot
        )
        .order_by(ChunkRow.updated_at.desc())
        .limit(RECENT_CHUNKS)
    )
    chunks = db.execute(query).all()
    finished: dict[str, list[datetime]] = defaultdict(list)
    for session_id, updated_at, _stages in chunks:
        finished[session_id].append(aware(updated_at))
    gaps = [
        (later - earlier).total_seconds()
        for times in finished.values()
        for later, earlier in itertools.pairwise(times)  # newest first
        if later > earlier
    ]
    if gaps:
        return statistics.median(gaps)
    stages = [sum(float(ms) for ms in (stage_ms or {}).values()) / 1000 for _, _, stage_ms in chunks]
    positive = [seconds for seconds in stages if seconds > 0]
    return statistics.median(positive) if positive else None
