"""The node's reporter writes its row on a timer, at once on a status change, and `stopped` last."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker

from monologue.db import NodeStatus, make_engine, make_sessionmaker, migrate
from monologue.repo import nodes as repo_nodes
from node.registry import NodeReporter, resident_mb


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _row(sessions: sessionmaker[Any]) -> tuple[str, list[str], int, float | None] | None:
    with sessions() as db:
        node = repo_nodes.get_node(db, node_id="node-a")
        return None if node is None else (node.status, node.sessions, node.chunks_done, node.memory_mb)


async def _eventually(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def _reporter(sessions: sessionmaker[Any], held: list[str], chunks: list[int], interval_s: float) -> NodeReporter:
    return NodeReporter(
        sessions=sessions,
        node_id="node-a",
        capacity=2,
        held_sessions=lambda: list(held),
        chunks_done=lambda: chunks[0],
        interval_s=interval_s,
    )


async def test_reporter_refreshes_sessions_and_chunk_count_every_tick(sessions: sessionmaker[Any]) -> None:
    held, chunks = ["s1"], [0]
    reporter = _reporter(sessions, held, chunks, interval_s=0.05)
    running = asyncio.create_task(reporter.run())
    await _eventually(lambda: _row(sessions) is not None)
    row = _row(sessions)
    assert row is not None and row[:3] == ("up", ["s1"], 0) and row[3] is not None and row[3] > 10
    held.append("s2")
    chunks[0] = 5
    await _eventually(lambda: (_row(sessions) or ())[:3] == ("up", ["s1", "s2"], 5))
    reporter.set_status(NodeStatus.STOPPED)
    await asyncio.wait_for(running, timeout=5)


async def test_a_status_change_is_written_at_once_and_stopped_last(sessions: sessionmaker[Any]) -> None:
    held, chunks = ["s1"], [3]
    reporter = _reporter(sessions, held, chunks, interval_s=60)  # no tick during the test
    running = asyncio.create_task(reporter.run())
    await _eventually(lambda: (_row(sessions) or ("",))[0] == "up")
    reporter.set_status(NodeStatus.DRAINING)
    await _eventually(lambda: (_row(sessions) or ("",))[0] == "draining")
    held.clear()
    reporter.set_status(NodeStatus.STOPPED)
    await asyncio.wait_for(running, timeout=5)  # returns once `stopped` is written
    assert (_row(sessions) or ())[:3] == ("stopped", [], 3)


def test_resident_memory_comes_from_proc(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 9000 kB\nVmRSS:\t  204800 kB\n")
    assert resident_mb(status) == 200.0
    assert resident_mb(tmp_path / "missing") is None
    assert (resident_mb() or 0) > 10  # this very process, on Linux
