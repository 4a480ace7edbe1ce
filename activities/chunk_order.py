"""Chunk order on one node: the workflow keeps the next chunks of a session scheduled while one runs (its
window), and this puts them back in generation order, refusing any from an abandoned epoch.

Positions and epochs count from zero in every workflow run (continue-as-new, resume), so everything here is
kept per run.

What must never happen: a heartbeat sent while holding the lock. A sync activity's heartbeat is handed to the
worker's event loop and waited for (up to 10 s), and that loop takes this lock too (`chunks_done`, for the node
registry): a chunk that beat while waiting its turn under the lock stalled the loop, so every heartbeat and lease
of the node, until the SDK gave up and failed the chunk with a bare TimeoutError, and the session moved.
"""

from __future__ import annotations

import threading
import time

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory, CancelledError

from monologue import contracts as c

WAIT_POLL_S = 0.2  # how often a waiting chunk heartbeats and looks for a cancellation
# The failure of a chunk refused for an abandoned epoch: the workflow abandoned it and drops its outcome, and the
# failure is benign (an expected end, not logged as a failure). Not a CancelledError: Temporal refuses a
# cancellation it did not ask for, and the node's log would say so.
ABANDONED = "ChunkAbandoned"


class ChunkOrder:
    """Which position of each workflow run this node finished last, and when."""

    def __init__(self) -> None:
        self._changed = threading.Condition()  # held briefly, never across a heartbeat (the module docstring)
        # Per workflow run: (epoch, last position done here, when), and the newest epoch seen.
        self._finished: dict[str, tuple[int, int, float]] = {}
        self._epochs: dict[str, int] = {}
        self._chunks_done = 0  # since the node started, for the node registry

    @property
    def chunks_done(self) -> int:
        """Read by the node registry on the event loop."""
        with self._changed:
            return self._chunks_done

    def wait_turn(self, request: c.GenerateChunkInput) -> float | None:
        """Block until the chunk scheduled before this one (same epoch) is done on this node; refuse a chunk
        from an abandoned epoch. Returns how long the node sat idle between that chunk and this one (ms)."""
        run = _run_key(request.session_id)
        name = f"{request.chunk.kind}{request.chunk.index}"
        with self._changed:
            self._epochs[run] = max(self._epochs.get(run, 0), request.epoch)
        while not self._turn_came(run, request, name):
            # The chunk before this one is on this node and the workflow watches it: no need to gate these beats
            # on its progress (a hung one fails first, and this one is cancelled). Outside the lock.
            activity.heartbeat(f"{name}: waiting for the previous chunk")
            if activity.is_cancelled():
                raise CancelledError(f"chunk {name} cancelled while waiting its turn")
        with self._changed:
            previous = self._finished.get(run)
        if previous is None or previous[:2] != (request.epoch, request.position - 1):
            return None
        return (time.perf_counter() - previous[2]) * 1000

    def _turn_came(self, run: str, request: c.GenerateChunkInput, name: str) -> bool:
        """Whether this chunk may run, waiting up to `WAIT_POLL_S` for it; refuses a chunk of an abandoned epoch."""

        def ready() -> bool:
            if request.epoch < self._epochs[run]:
                raise ApplicationError(
                    f"chunk {name} was abandoned (epoch {request.epoch})",
                    type=ABANDONED,
                    non_retryable=True,
                    category=ApplicationErrorCategory.BENIGN,
                )
            epoch, position, _ = self._finished.get(run, (-1, -1, 0.0))
            return request.wait_for is None or (epoch == request.epoch and position >= request.wait_for)

        with self._changed:
            return self._changed.wait_for(ready, timeout=WAIT_POLL_S)

    def finish(self, request: c.GenerateChunkInput) -> None:
        """The chunk is done and stored: the next one may run."""
        with self._changed:
            self._finished[_run_key(request.session_id)] = (request.epoch, request.position, time.perf_counter())
            self._chunks_done += 1
            self._changed.notify_all()

    def forget(self, session_id: str) -> None:
        """The session is over: drop every run's bookkeeping."""
        with self._changed:
            for run in [run for run in self._finished if run.startswith(f"{session_id}/")]:
                self._finished.pop(run, None)
                self._epochs.pop(run, None)


def _run_key(session_id: str) -> str:
    """Chunk positions and epochs count from zero in every workflow run (continue-as-new, resume)."""
    return f"{session_id}/{activity.info().workflow_run_id}"
