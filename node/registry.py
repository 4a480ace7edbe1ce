"""The node's entry in the node registry (the `nodes` table, read by the ops UI).

`NodeReporter` writes the node's row every couple of seconds: capacity, status, the sessions it
holds now, chunks done since it started and its resident memory. The node sets `status` to
`draining` when told to stop and writes `stopped` last thing before it exits. The registry is for
people: the workflow never reads it (a lost node is noticed by its lease's heartbeat timeout)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from monologue.db import NodeStatus, utcnow
from monologue.repo import nodes as repo_nodes

log = structlog.get_logger("node")

REPORT_EVERY_S = 2.0


class NodeReporter:
    def __init__(
        self,
        *,
        sessions: sessionmaker[Any],
        node_id: str,
        capacity: int,
        held_sessions: Callable[[], list[str]],
        chunks_done: Callable[[], int],
        interval_s: float = REPORT_EVERY_S,
        media_url: str | None = None,
    ) -> None:
        self._sessions = sessions
        self._node_id = node_id
        self._capacity = capacity
        self._held_sessions = held_sessions
        self._chunks_done = chunks_done
        self._interval_s = interval_s
        self.media_url = media_url  # set once the WebRTC port listens (node/webrtc/server.py)
        self._started_at = utcnow()
        self._wake = asyncio.Event()
        self.status = NodeStatus.UP

    async def run(self) -> None:
        """Report every `interval_s`, and at once after `set_status`; return after reporting `stopped`."""
        while True:
            status = self.status
            await self._report(status)
            if status == NodeStatus.STOPPED:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._interval_s)
            self._wake.clear()

    def set_status(self, status: NodeStatus) -> None:
        self.status = status
        self._wake.set()

    async def _report(self, status: NodeStatus) -> None:
        # In a thread: SQLite may wait on its lock, and the event loop must keep heartbeating. A database
        # hiccup is logged and retried at the next tick, never fatal to the node.
        held, chunks_done = self._held_sessions(), self._chunks_done()  # read here, on the loop that owns them
        try:
            await asyncio.to_thread(self._write, status, held, chunks_done)
        except SQLAlchemyError as err:
            log.warning("node report failed", node_id=self._node_id, error=str(err))

    def _write(self, status: NodeStatus, held: list[str], chunks_done: int) -> None:
        with self._sessions() as db:
            repo_nodes.report_node(
                db,
                node_id=self._node_id,
                capacity=self._capacity,
                status=status,
                sessions=held,
                chunks_done=chunks_done,
                memory_mb=resident_mb(),
                started_at=self._started_at,
                media_url=self.media_url,
            )


def resident_mb(status_file: Path = Path("/proc/self/status")) -> float | None:
    """This process's resident set size (VmRSS) in MB, or None where /proc is not there."""
    try:
        text = status_file.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024  # reported in kB
    return None
