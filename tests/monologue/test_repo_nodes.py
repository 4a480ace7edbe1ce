"""The node registry: a node's report is an idempotent upsert; the reader computes heartbeat age and rate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue.repo import nodes as repo_nodes

START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def _report(db: Any, node_id: str = "node-a", **fields: Any) -> None:
    values: dict[str, Any] = {
        "capacity": 2,
        "status": "up",
        "sessions": [],
        "chunks_done": 0,
        "memory_mb": 150.0,
        "started_at": START,
    } | fields
    repo_nodes.report_node(db, node_id=node_id, **values)


def test_a_report_overwrites_the_nodes_row_and_refreshes_its_heartbeat(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _report(db)
        first = repo_nodes.get_node(db, node_id="node-a")
        assert first is not None
        first_beat = first.heartbeat_at
        _report(db, status="draining", sessions=["s1", "s2"], chunks_done=7)
        _report(db, node_id="node-b")
    with sessions() as db:
        nodes = repo_nodes.list_nodes(db)
        assert [node.id for node in nodes] == ["node-a", "node-b"]
        node = nodes[0]
        assert (node.status, node.sessions, node.chunks_done, node.capacity) == ("draining", ["s1", "s2"], 7, 2)
        assert node.heartbeat_at >= first_beat


def test_the_reader_computes_heartbeat_age_and_chunks_per_minute(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _report(db, chunks_done=30)
        node = repo_nodes.get_node(db, node_id="node-a")
        assert node is not None
        beat = repo_nodes.aware(node.heartbeat_at)  # SQLite hands back naive UTC
        assert repo_nodes.heartbeat_age_s(node, now=beat + timedelta(seconds=12)) == pytest.approx(12)
        now = START + timedelta(minutes=10)
        assert repo_nodes.chunks_per_minute(node, now=now) == pytest.approx(3.0)
        assert repo_nodes.chunks_per_minute(node, now=START) == 0.0


def test_a_stopped_nodes_rate_ends_at_its_last_heartbeat(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        _report(db, status="stopped", chunks_done=10, started_at=datetime.now(UTC) - timedelta(minutes=5))
        node = repo_nodes.get_node(db, node_id="node-a")
        assert node is not None
        later = datetime.now(UTC) + timedelta(hours=1)
        assert repo_nodes.chunks_per_minute(node, now=later) == pytest.approx(2.0, rel=0.01)


def test_an_unknown_status_is_refused(sessions: sessionmaker[Any]) -> None:
    with sessions() as db, pytest.raises(ValueError, match="'lost'"):
        _report(db, status="lost")
