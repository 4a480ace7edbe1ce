"""A session's terminal status is set once: finalize and a cancel racing to end it cannot both win, on SQLite
and on a real PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue import repo
from monologue.contracts import SessionStatus
from monologue.db import make_engine, make_sessionmaker, migrate
from tests.helpers import postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[sessionmaker[Any]]:
    if request.param == "sqlite":
        yield from _sessions(f"sqlite:///{tmp_path}/test.db")
        return
    with postgres_database() as url:
        yield from _sessions(url)


def _sessions(url: str) -> Iterator[sessionmaker[Any]]:
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _running(sessions: sessionmaker[Any], session_id: str) -> None:
    with sessions() as db:
        repo.create_session(
            db,
            session_id=session_id,
            tenant="local",
            options={"fps": 25},
            workflow_id=f"render-{session_id}",
            audio_seconds=3.0,
            width=512,
            height=512,
        )
        repo.mark_running(db, session_id=session_id, frames=75, chunks_total=2)


def _complete(sessions: sessionmaker[Any], session_id: str) -> bool:
    with sessions() as db:
        return repo.mark_completed(db, session_id=session_id, video_key="final.mp4", frames=75, chunks=2)


def _cancel(sessions: sessionmaker[Any], session_id: str) -> bool:
    with sessions() as db:
        return repo.mark_ended(db, session_id=session_id, status=SessionStatus.CANCELLED, error=None)


def _row(sessions: sessionmaker[Any], session_id: str) -> tuple[str, str | None]:
    with sessions() as db:
        row = repo.get_session(db, session_id=session_id)
        assert row is not None
        return row.status, row.video_key


def test_cancel_after_completion_leaves_the_video_completed(sessions: sessionmaker[Any]) -> None:
    _running(sessions, "s1")
    assert _complete(sessions, "s1")
    assert not _cancel(sessions, "s1")
    assert _row(sessions, "s1") == (SessionStatus.COMPLETED, "final.mp4")
    assert _complete(sessions, "s1"), "a retried finalize finds its own completion"


def test_finalize_after_cancel_does_not_complete_the_session(sessions: sessionmaker[Any]) -> None:
    _running(sessions, "s1")
    assert _cancel(sessions, "s1")
    assert not _complete(sessions, "s1")
    with sessions() as db:
        assert not repo.mark_ended(db, session_id="s1", status=SessionStatus.FAILED, error="late")
    assert _row(sessions, "s1") == (SessionStatus.CANCELLED, None)


def test_resumed_session_can_end_again(sessions: sessionmaker[Any]) -> None:
    _running(sessions, "s1")
    assert _cancel(sessions, "s1")
    with sessions() as db:
        repo.mark_resumed(db, session_id="s1")
        repo.mark_running(db, session_id="s1", frames=75, chunks_total=2)
    assert _complete(sessions, "s1")
    assert _row(sessions, "s1") == (SessionStatus.COMPLETED, "final.mp4")


def test_late_prepare_or_lease_does_not_revive_an_ended_session(sessions: sessionmaker[Any]) -> None:
    _running(sessions, "s1")
    assert _cancel(sessions, "s1")
    with sessions() as db:
        repo.mark_running(db, session_id="s1", frames=75, chunks_total=2)
    assert _row(sessions, "s1")[0] == SessionStatus.CANCELLED
    with sessions() as db:
        repo.set_node(db, session_id="s1", node_id="late-node")  # a lease taken just before the cancel
    assert _row(sessions, "s1")[0] == SessionStatus.CANCELLED


def test_concurrent_completion_and_cancel_have_exactly_one_winner(sessions: sessionmaker[Any]) -> None:
    """Each round, finalize and a cancel write at the same moment from two connections: one wins, and the
    row says who."""
    for round_number in range(10):
        session_id = f"race{round_number}"
        _running(sessions, session_id)
        won = _race(sessions, session_id)
        assert sorted(won.values()) == [False, True], won
        winner = next(name for name, first in won.items() if first)
        assert _row(sessions, session_id)[0] == winner


def _race(sessions: sessionmaker[Any], session_id: str) -> dict[str, bool]:
    """Complete and cancel `session_id` from two threads released together; which of them ended it."""
    start = threading.Barrier(2)
    won: dict[str, bool] = {}

    def end(name: str, write: Any) -> None:
        start.wait()
        won[name] = write(sessions, session_id)

    threads = [
        threading.Thread(target=end, args=(SessionStatus.COMPLETED, _complete)),
        threading.Thread(target=end, args=(SessionStatus.CANCELLED, _cancel)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return won


def test_ending_without_a_video_as_completed_is_refused(sessions: sessionmaker[Any]) -> None:
    _running(sessions, "s1")
    with sessions() as db, pytest.raises(ValueError, match="completed"):
        repo.mark_ended(db, session_id="s1", status=SessionStatus.COMPLETED, error=None)
