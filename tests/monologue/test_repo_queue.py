"""The queue snapshot reader (`monologue.repo.queue`) on real SQLite and PostgreSQL databases: which sessions wait
and in which class, their lengths (known or planned from their audio), the slots of the nodes that are up, and the
chunk time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from monologue.contracts import QueueClass
from monologue.db import ChunkRow, NodeRow, NodeStatus, SessionRow, make_engine, make_sessionmaker, migrate
from monologue.queueing import Running
from monologue.repo import nodes as repo_nodes, queue as repo_queue
from tests.helpers import postgres_database

NOW = datetime.now(UTC)
# 4 s of audio at 25 fps is 100 frames: N0 I0 N1 I1 N2, 5 chunks of 40 and 4 frames.
OPTIONS = {"fps": 25, "chunk_frames": 40, "i_frames": 4, "family": "warp", "resolution": "source"}


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    with ExitStack() as stack:
        url = f"sqlite:///{tmp_path}/db.sqlite"
        if request.param == "postgresql":
            url = stack.enter_context(postgres_database())
        migrate(url)
        engine = make_engine(url)
        yield make_sessionmaker(engine)
        engine.dispose()


def _session(sid: str, status: str, *, second: float = 0, **fields: Any) -> SessionRow:
    values: dict[str, Any] = {"tenant": "acme", "kind": "render", "options": OPTIONS, "audio_seconds": 4.0} | fields
    return SessionRow(
        id=sid, status=status, created_at=NOW - timedelta(minutes=5) + timedelta(seconds=second), **values
    )


def _chunk(sid: str, index: int, at: datetime, stage_ms: dict[str, float] | None = None) -> ChunkRow:
    stages = stage_ms or {"context": 500.0, "audio_to_video": 1000.0}
    return ChunkRow(
        session_id=sid, kind="N", index=index, first_frame=index * 44, frames=40, status="done", attempt=1,
        node_id="node-a", stage_ms=stages, updated_at=at,
    )  # fmt: skip


def _node(db: Session, node_id: str, capacity: int, status: NodeStatus = NodeStatus.UP, silent_s: float = 0) -> None:
    repo_nodes.report_node(
        db, node_id=node_id, capacity=capacity, status=status, sessions=[], chunks_done=0, memory_mb=None,
        started_at=NOW - timedelta(hours=1),
    )  # fmt: skip
    at = datetime.now(UTC) - timedelta(seconds=silent_s)  # not NOW: taken at import, it may be stale by now
    db.execute(update(NodeRow).where(NodeRow.id == node_id).values(heartbeat_at=at))
    db.commit()


def test_the_snapshot_sorts_sessions_into_waiting_and_running_with_their_classes_and_lengths(
    sessions: sessionmaker[Any],
) -> None:
    with sessions() as db:
        db.add_all(
            [
                _session("run", "running", node_id="node-a", chunks_total=5, options=OPTIONS | {"priority": "low"}),
                _session("prepared", "running", second=1, chunks_total=7),  # prepare ran; no node yet
                _session("new", "queued", second=2),  # not prepared: planned from its 4 s of audio
                _session("resumed", "queued", second=3, node_id="node-a", chunks_total=5),
                _session("talk", "queued", second=4, kind="live", tenant="beta"),
                _session("urgent", "queued", second=5, options=OPTIONS | {"priority": "high"}),
                _session("done", "completed", second=6, node_id="node-a", chunks_total=5),
                _session("gave-way", "running", second=7, chunks_total=5, preemptions=1),  # yielded: no node now
            ]
        )
        db.flush()
        db.add_all([_chunk("run", index, NOW - timedelta(seconds=10 - 2 * index)) for index in range(3)])
        db.commit()
        _node(db, "node-a", 2)
        _node(db, "node-b", 3, silent_s=30)  # gone quiet: not a place to run
        _node(db, "node-c", 4, status=NodeStatus.DRAINING)
        state = repo_queue.queue_state(db, weight=lambda tenant: 1.0)
    assert state.slots == 2
    assert state.seconds_per_chunk == pytest.approx(2.0)  # its chunks finished 2 s apart
    assert state.running == [Running("run", "acme", QueueClass.LOW, 2)]
    waiting = {session.session_id: (session.queue_class, session.chunks) for session in state.waiting}
    assert waiting == {
        "prepared": (QueueClass.NORMAL, 7),
        "new": (QueueClass.NORMAL, 5),
        "resumed": (QueueClass.MOVING, 5),
        "talk": (QueueClass.LIVE, None),
        "urgent": (QueueClass.HIGH, 5),
        "gave-way": (QueueClass.YIELDED, 5),
    }
    assert all(session.created_at.tzinfo is not None for session in state.waiting)


def test_with_no_node_up_sessions_still_wait_for_one_slot(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        db.add(_session("new", "queued"))
        db.commit()
        state = repo_queue.queue_state(db, weight=lambda tenant: 1.0)
    assert state.slots == 1 and state.seconds_per_chunk is None and state.running == []


def test_chunk_time_falls_back_to_stage_times_and_leaves_live_chunks_out(sessions: sessionmaker[Any]) -> None:
    """One chunk per render gives no gap between two: the median of the chunks' own stage times (1.5 s and 2.5 s
    and 3.5 s). The live session's chunk (paced by its speaker) is left out."""
    with sessions() as db:
        for n, seconds in enumerate((1.5, 2.5, 3.5)):
            db.add(_session(f"r{n}", "running", node_id="node-a", chunks_total=5))
            db.flush()
            db.add(_chunk(f"r{n}", 0, NOW, {"context": 500.0, "audio_to_video": seconds * 1000 - 500}))
        db.add(_session("talk", "running", kind="live", node_id="node-a"))
        db.flush()
        db.add_all([_chunk("talk", index, NOW - timedelta(seconds=60 * index)) for index in range(3)])
        db.commit()
        ids = ["r0", "r1", "r2", "talk"]
        assert repo_queue.seconds_per_chunk(db, session_ids=ids) == pytest.approx(2.5)
        assert repo_queue.seconds_per_chunk(db, session_ids=[]) is None
