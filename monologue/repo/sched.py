"""Data access for preemption: which render gives its slot up to a waiting live session, and the record of it.

The policy (docs/scheduling.md): only renders yield, never live sessions; the lowest class first (low, then normal,
then high), and within a class the most recently started; a render that has yielded `max_preemptions` times is
asked only when no other can. One render is asked per live session waiting: a render asked within `grace_s` that
has not yet yielded counts as yielding, so two waiting live sessions ask two renders, and one asks one however often
it asks."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from monologue.contracts import QueueClass, RenderPriority, SessionKind, SessionStatus
from monologue.db import SessionRow, utcnow


def yield_order(row: SessionRow, max_preemptions: int) -> tuple[bool, int, float]:
    """Sort key: the render that should yield first sorts first."""
    priority = RenderPriority(str((row.options or {}).get("priority", RenderPriority.NORMAL)))
    started = row.started_at.timestamp() if row.started_at is not None else 0.0
    return row.preemptions >= max_preemptions, -QueueClass(priority.value).priority_key, -started


def ask_to_yield(db: Session, *, max_preemptions: int, grace_s: float, now: datetime | None = None) -> str | None:
    """Mark the render that should give way now and return its id; None when renders already yielding cover the
    live sessions waiting, or when no render holds a node."""
    now = now or utcnow()
    recent = now - timedelta(seconds=grace_s)
    waiting_live = db.scalar(
        select(func.count()).where(SessionRow.kind == SessionKind.LIVE, SessionRow.status == SessionStatus.QUEUED)
    )
    renders = select(SessionRow).where(
        SessionRow.kind == SessionKind.RENDER,
        SessionRow.status == SessionStatus.RUNNING,
        SessionRow.node_id.is_not(None),
    )
    yielding = db.scalar(
        select(func.count()).select_from(renders.where(SessionRow.yield_asked_at >= recent).subquery())
    )
    if (yielding or 0) >= max(waiting_live or 0, 1):
        return None
    fresh = or_(SessionRow.yield_asked_at.is_(None), SessionRow.yield_asked_at < recent)
    candidates = sorted(db.scalars(renders.where(fresh)), key=lambda row: yield_order(row, max_preemptions))
    for row in candidates:
        # Compare-and-set: another live session's request may have marked it between our read and this write.
        marked = db.execute(update(SessionRow).where(SessionRow.id == row.id, fresh).values(yield_asked_at=now))
        db.commit()
        if marked.rowcount:  # type: ignore[attr-defined]
            return row.id
    return None


def record_yield(db: Session, *, session_id: str) -> bool:
    """The render gave its slot up: one more preemption, no longer asked, and no node held until its next one takes
    it (`set_node`; the workflow asks for that lease only after this). Idempotent (an activity's retry): only a render
    still marked counts, and this clears the mark. Returns whether it counted."""
    counted = db.execute(
        update(SessionRow)
        .where(SessionRow.id == session_id, SessionRow.yield_asked_at.is_not(None))
        .values(preemptions=SessionRow.preemptions + 1, yield_asked_at=None, node_id=None)
    )
    db.commit()
    return bool(counted.rowcount)  # type: ignore[attr-defined]
