"""Data access for preemption: which render gives its slot up to a session waiting for a node, and the record of it.

Three kinds of session ask (docs/scheduling.md, "Preemption"), each for at most one render at a time:
- a live session (`AskReason.LIVE`), or a session whose node was lost (`AskReason.NODE_LOST`): any render yields
  to it (and queues again as `yielded`, below it);
- a render of a tenant below its fair share of the slots renders hold (`AskReason.FAIR_SHARE`): a render of the
  same or a lower class, of the tenant furthest above its share, yields; only while the move brings both nearer
  their shares, so two tenants never trade a slot back and forth.
Which render: only renders holding a node now (the node registry's lists, not `sessions.node_id`, which a session
that lost its node still carries), never live sessions, and none while a node reports a free slot; the tenant
furthest above its share first (fair share), or the lowest class and then the tenant holding the most slots per
weight (live, node lost); then the most recently started; a render that has yielded `max_preemptions` times
last. A render asked and not yet done (within `grace_s`) is not asked again, and its asker asks nobody else while a
node still holds that render."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from monologue.contracts import TERMINAL, AskReason, QueueClass, SessionKind, render_options
from monologue.db import SessionRow, utcnow
from monologue.repo.nodes import FRESH_HEARTBEAT_S, live_nodes


@dataclass(frozen=True)
class Asker:
    session_id: str
    tenant: str
    queue_class: QueueClass
    why: AskReason


@dataclass(frozen=True)
class Asked:
    """The render marked to give way, and the node whose slot it gives up."""

    session_id: str
    node_id: str


def render_class(row: SessionRow) -> QueueClass:
    return QueueClass(render_options(row.options or {}).priority.value)


def yield_order(row: SessionRow, max_preemptions: int, tenant_slots: float = 0.0) -> tuple[bool, int, float, float]:
    """Sort key among renders: the one that should yield first sorts first. `tenant_slots`: the slots its tenant
    holds per unit of weight (within a class, the tenant furthest above its share gives a slot up first)."""
    started = row.started_at.timestamp() if row.started_at is not None else 0.0
    return row.preemptions >= max_preemptions, -render_class(row).priority_key, -tenant_slots, -started


def ask_to_yield(
    db: Session,
    asker: Asker,
    *,
    weight: Callable[[str], float],
    max_preemptions: int,
    grace_s: float,
    now: datetime | None = None,
    lost_after_s: float = FRESH_HEARTBEAT_S,
    passed_over: frozenset[str] = frozenset(),
) -> Asked | None:
    """Mark the render that should give way to `asker` now and return it; None when it already has one asked,
    or none may be, or a node that is up reports a free slot (its lease will find it: the asker asks with its lease,
    before the matcher has had a chance, and nobody should yield for a slot that is free). Renders of a node silent
    for `lost_after_s` (the lease timeout: it is being declared lost) are not asked: they are about to move
    themselves, and would only answer that they could not yield; nor are sessions that have ended or given their
    node up (their rows say so), which a node's report may still list. For the same reasons a render asked earlier
    whose node has gone silent since, or which has ended, is no longer waited for: its mark is cleared and another
    render asked. `passed_over`: renders the caller found ended (their workflows took no signal) before their rows
    say so."""
    now = now or utcnow()
    recent = now - timedelta(seconds=grace_s)
    fresh_mark = and_(SessionRow.yield_asked_at.is_not(None), SessionRow.yield_asked_at >= recent)
    nodes = live_nodes(db, now=now, fresh_s=min(lost_after_s, FRESH_HEARTBEAT_S))
    if any(len(node.sessions) < node.capacity for node in nodes):
        return None  # a slot is free (or was, at its node's last report): the lease takes it, nobody need yield
    listed: dict[str, set[str]] = defaultdict(set)  # session → the nodes whose last report lists it
    for node in nodes:
        for session in node.sessions:
            listed[session].add(node.id)
    # A report lags up to its interval: a session that has ended, or has given its node up (its row names no node,
    # or another), may still be listed there. It holds no slot to give.
    query = select(SessionRow).where(SessionRow.id.in_(list(listed)), SessionRow.status.not_in(TERMINAL))
    rows = [row for row in db.scalars(query) if row.node_id in listed[row.id]]
    asked = db.scalar(select(SessionRow.id).where(SessionRow.yield_for == asker.session_id, fresh_mark))
    if asked is not None:
        if asked in {row.id for row in rows}:
            return None  # its render is on its way
        unmark(db, asked, asker.session_id)  # its node went silent under it, or it ended: it will not yield
    candidates = [
        row
        for row in rows
        if row.kind == SessionKind.RENDER and row.id != asker.session_id and row.id not in passed_over
    ]
    if asker.why is AskReason.FAIR_SHARE:
        candidates = _over_share(asker, rows, candidates, slots=_slots(db, now=now), weight=weight)
    else:
        holding = Counter(row.tenant for row in rows)
        candidates.sort(key=lambda row: yield_order(row, max_preemptions, holding[row.tenant] / weight(row.tenant)))
    not_marked = or_(SessionRow.yield_asked_at.is_(None), SessionRow.yield_asked_at < recent)
    for row in candidates:
        chosen = Asked(row.id, row.node_id or "")
        # Compare-and-set: another asker may have marked it between our read and this write.
        marked = db.execute(
            update(SessionRow)
            .where(SessionRow.id == row.id, not_marked)
            .values(yield_asked_at=now, yield_for=asker.session_id)
        )
        db.commit()
        if marked.rowcount:  # type: ignore[attr-defined]
            return chosen
    return None


def unmark(db: Session, session_id: str, asker_id: str) -> None:
    """Clear the ask of `asker_id` on `session_id` (only that one: another asker may have marked it meanwhile): it
    will not yield (its node went silent, or its workflow had ended when the signal came)."""
    db.execute(
        update(SessionRow)
        .where(SessionRow.id == session_id, SessionRow.yield_for == asker_id)
        .values(yield_asked_at=None, yield_for=None)
    )
    db.commit()


def _over_share(
    asker: Asker, held: list[SessionRow], renders: list[SessionRow], *, slots: int, weight: Callable[[str], float]
) -> list[SessionRow]:
    """The renders that may yield to a render of a tenant below its share, best first: of a tenant that stays at or
    above its share after giving one slot up, of the asker's class or a lower one. Shares are of the slots renders
    hold, as Temporal's fairness is within a class: a tenant's live sessions (which take their slots whatever the
    shares) do not count against its renders."""
    rendering = [row for row in held if row.kind == SessionKind.RENDER]
    slots -= len(held) - len(rendering)
    holding = Counter(row.tenant for row in rendering)
    weights = {tenant: weight(tenant) for tenant in {*holding, asker.tenant}}
    share = {tenant: slots * weights[tenant] / sum(weights.values()) for tenant in weights}
    if holding[asker.tenant] + 1 > share[asker.tenant]:
        return []
    allowed = [
        row
        for row in renders
        if row.tenant != asker.tenant
        and holding[row.tenant] - 1 >= share[row.tenant]
        and render_class(row).priority_key >= asker.queue_class.priority_key
    ]
    return sorted(allowed, key=lambda row: (-holding[row.tenant] / weights[row.tenant], yield_order(row, 1 << 30)))


def _slots(db: Session, *, now: datetime) -> int:
    return sum(node.capacity for node in live_nodes(db, now=now))


def record_yield(db: Session, *, session_id: str, yielded: bool) -> bool:
    """The render gave its slot up (`yielded`: one more preemption, and no node held until its next one takes it,
    `set_node`; the workflow asks for that lease only after this), or could not (it held no node when asked). Either
    way it is no longer asked. Idempotent (an activity's retry): only a render still marked counts, and this clears
    the mark. Returns whether it counted."""
    values: dict[str, object] = {"yield_asked_at": None, "yield_for": None}
    if yielded:
        values |= {"preemptions": SessionRow.preemptions + 1, "node_id": None}
    counted = db.execute(
        update(SessionRow).where(SessionRow.id == session_id, SessionRow.yield_asked_at.is_not(None)).values(**values)
    )
    db.commit()
    return bool(counted.rowcount) and yielded  # type: ignore[attr-defined]
