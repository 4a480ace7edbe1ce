"""Fencing: a node's writes for a session land only while its lease is the session's newest.

The workflow numbers its node leases (1, 2, … counting on across runs: `ResumePoint.lease`) and every pinned activity
carries the number it runs under. `claim` (init_session) records a lease as the session's newest unless a newer one
has claimed it already; `hold` opens every later write's transaction by checking that the lease is still the newest.
It does so with an UPDATE of the session's row, so the check holds until the transaction commits: PostgreSQL locks
the row and SQLite the database until then, and a newer lease's `claim` waits behind it. A node cut off from the
cluster that comes back after its session moved therefore writes nothing: its first write raises LeaseFenced.
Object storage is fenced by what the node writes there (activities/node.py): published objects are created only
where none exists, and checkpoints are written under the lease's own key.

Lease 0 is unfenced: the activities of sessions started before fencing carry it and behave as they always did."""

from __future__ import annotations

from typing import Any, NoReturn

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from monologue.db import SessionRow
from monologue.errors import LeaseFenced

UNFENCED = 0


def claim(db: Session, *, session_id: str, lease: int) -> None:
    """Make `lease` the session's newest (in the caller's transaction), or raise LeaseFenced if a newer one is."""
    if lease == UNFENCED:
        return
    query = update(SessionRow).where(SessionRow.id == session_id, SessionRow.lease <= lease).values(lease=lease)
    if db.execute(query).rowcount != 1:  # type: ignore[attr-defined]
        _refuse(db, session_id, f"lease {lease} is older than the one that holds it now")


def hold(db: Session, *, session_id: str, lease: int) -> None:
    """Check that `lease` is still the session's newest, holding the row (or database) until the caller commits;
    raise LeaseFenced (nothing written) if a newer lease has claimed the session."""
    if lease == UNFENCED:
        return
    query = update(SessionRow).where(SessionRow.id == session_id, SessionRow.lease == lease).values(lease=lease)
    if db.execute(query).rowcount != 1:  # type: ignore[attr-defined]
        _refuse(db, session_id, f"lease {lease} no longer holds it (a newer lease does)")


def _refuse(db: Session, session_id: str, why: str) -> NoReturn:
    """Roll the transaction back (nothing of it is written) and raise LeaseFenced with the session's newest lease."""
    db.rollback()
    newest = db.scalar(select(SessionRow.lease).where(SessionRow.id == session_id))
    raise LeaseFenced(f"session {session_id}: {why}", newest or 0)


def check(sessions: sessionmaker[Any], *, session_id: str, lease: int) -> None:
    """LeaseFenced unless `lease` is the session's newest now: a node checks before it writes to object storage,
    so one cut off and back stops before its first write (the database write after it is fenced by `hold`)."""
    with sessions() as db:
        hold(db, session_id=session_id, lease=lease)
        db.commit()
