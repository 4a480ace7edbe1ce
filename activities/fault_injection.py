"""Faults the tests inject into a node (testing-only settings `node.chunk_delay_s`, `node.hang_chunk`,
`node.finalize_delay_s` and `node.session_load_delay_s`): never set in production. Kept here, apart from the
activities, so the activities read as they run."""

from __future__ import annotations

import time
from dataclasses import dataclass

import structlog
from temporalio import activity
from temporalio.exceptions import ApplicationError

log = structlog.get_logger("node")


@dataclass(frozen=True)
class Faults:
    chunk_delay_s: float = 0.0  # every chunk takes this much longer, heartbeating (to kill a node mid-chunk)
    hang_chunk: str = ""  # this chunk ("N1") hangs on this node without heartbeating, as a stuck GPU call would
    # finalize pauses (heartbeating) with the final MP4 stored but the session not yet completed: a window in
    # which a test can kill the node and see another node repeat finalize over what this one left behind
    finalize_delay_s: float = 0.0
    # loading a session from storage takes this much longer, silently (a slow read): the known long step around the
    # load must keep the activity alive, where a hung chunk (`hang_chunk`) is caught
    session_load_delay_s: float = 0.0

    def stretch(self, chunk: str) -> None:
        """Sleep `chunk_delay_s`, heartbeating meanwhile: a slow chunk, not a hung one."""
        _sleep_heartbeating(self.chunk_delay_s, f"{chunk} (test delay)")

    def pause_finalize(self, session_id: str) -> None:
        """Sleep `finalize_delay_s`, heartbeating; the log line tells a test that finalize is under way."""
        if self.finalize_delay_s <= 0:
            return
        log.warning("pausing finalize on purpose (node.finalize_delay_s)", session_id=session_id)
        _sleep_heartbeating(self.finalize_delay_s, "finalize (test delay)")

    def slow_load(self) -> None:
        """Sleep `session_load_delay_s` without a heartbeat, as a slow read from storage would: what heartbeats
        meanwhile is the known long step the load runs in (activities/heartbeat.py), not this."""
        if self.session_load_delay_s > 0:
            log.warning("loading the session slowly on purpose (node.session_load_delay_s)")
            time.sleep(self.session_load_delay_s)

    def hang(self, chunk: str) -> None:
        """If `chunk` is the one to hang: block without a heartbeat until the worker shuts down (so the node
        still stops cleanly), then fail. By then Temporal has timed the attempt out and moved the session."""
        if chunk != self.hang_chunk:
            return
        log.warning("hanging on purpose (node.hang_chunk)", chunk=chunk)
        activity.wait_for_worker_shutdown_sync()
        raise ApplicationError(f"chunk {chunk} hung on purpose (node.hang_chunk)", non_retryable=True)


def _sleep_heartbeating(seconds: float, detail: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        activity.heartbeat(detail)
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
