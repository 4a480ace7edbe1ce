"""Which render yields its slot to a waiting live session (monologue/repo/sched.py): lowest class first, then the most
recently started; a render that has yielded `max_preemptions` times only when no other can; one render asked per
live session waiting; live sessions never asked; the record counts once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue.contracts import RenderPriority, SessionKind, SessionStatus
from monologue.db import SessionRow, make_engine, make_sessionmaker, migrate
from monologue.repo import sched as repo_sched

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _add(db: Any, session_id: str, *, started_s_ago: float = 60.0, **fields: Any) -> None:
    values: dict[str, Any] = {
        "kind": SessionKind.RENDER,
        "status": SessionStatus.RUNNING,
        "node_id": "node-a",
        "options": {},
        "started_at": NOW - timedelta(seconds=started_s_ago),
    } | fields
    db.add(SessionRow(id=session_id, tenant="t", **values))
    db.commit()


def _ask(db: Any, *, max_preemptions: int = 2, now: datetime = NOW) -> str | None:
    return repo_sched.ask_to_yield(db, max_preemptions=max_preemptions, grace_s=30.0, now=now)


def test_the_lowest_class_then_the_most_recently_started_render_yields(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "live", kind=SessionKind.LIVE, status=SessionStatus.QUEUED, node_id=None)
        _add(db, "live-running", kind=SessionKind.LIVE)  # never asked: live sessions do not yield to live
        _add(db, "high-new", options={"priority": RenderPriority.HIGH}, started_s_ago=1)
        _add(db, "normal-old", started_s_ago=100)
        _add(db, "normal-new", started_s_ago=5)
        _add(db, "low-old", options={"priority": RenderPriority.LOW}, started_s_ago=500)
        _add(db, "waiting", node_id=None)  # prepared, no node yet: nothing to give
        _add(db, "done", status=SessionStatus.COMPLETED)
        assert _ask(db) == "low-old"
        # One live session waits and one render is yielding: nobody else is asked until it has.
        assert _ask(db) is None
        assert repo_sched.record_yield(db, session_id="low-old")
        assert not repo_sched.record_yield(db, session_id="low-old")  # a retry counts once
        assert _ask(db) == "normal-new"  # low-old holds no node now: nothing to give
        _yield_and_take_a_node_again(db, "normal-new")
        assert _ask(db) == "normal-new"  # yielded once: still first of its class (max 2)
        _yield_and_take_a_node_again(db, "normal-new")
        assert _ask(db) == "normal-old"  # normal-new has yielded twice: its turn comes next
        rows = {row.id: row for row in db.query(SessionRow)}
        assert (rows["low-old"].preemptions, rows["normal-new"].preemptions) == (1, 2)
        assert rows["low-old"].node_id is None
        assert rows["normal-old"].yield_asked_at is not None and rows["high-new"].yield_asked_at is None


def _yield_and_take_a_node_again(db: Any, session_id: str) -> None:
    assert repo_sched.record_yield(db, session_id=session_id)
    db.query(SessionRow).filter(SessionRow.id == session_id).update({"node_id": "node-b"})  # its next lease's node
    db.commit()


def test_each_waiting_live_session_gets_one_render_and_stale_asks_expire(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "live-1", kind=SessionKind.LIVE, status=SessionStatus.QUEUED, node_id=None)
        _add(db, "live-2", kind=SessionKind.LIVE, status=SessionStatus.QUEUED, node_id=None)
        _add(db, "r1", started_s_ago=10)
        _add(db, "r2", started_s_ago=20)
        assert [_ask(db), _ask(db), _ask(db)] == ["r1", "r2", None]
        # An ask older than the grace (its render ended, or never got the signal) no longer counts as under way.
        later = NOW + timedelta(seconds=31)
        assert _ask(db, now=later) == "r1"


def test_a_render_that_yielded_its_limit_is_still_asked_when_it_is_the_only_one(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _add(db, "live", kind=SessionKind.LIVE, status=SessionStatus.QUEUED, node_id=None)
        _add(db, "only", preemptions=5)
        assert _ask(db) == "only"


def test_no_live_session_waiting_still_asks_one_render_for_the_caller(sessions: sessionmaker[Any]) -> None:
    """The caller is a live session that waits (its row may already say running after a node change): it gets one."""
    with sessions() as db:
        _add(db, "r", started_s_ago=10)
        assert (_ask(db), _ask(db)) == ("r", None)
