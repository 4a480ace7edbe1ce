"""Telling a live session's workflow about its audio (AUDIO_AVAILABLE signals) without ever holding the socket up.

The socket acknowledges audio once storage holds it; the signal only lets the workflow plan sooner. So the socket
never waits on Temporal: it `offer`s what storage holds now, and a task of its own sends the newest offer (offers
merge: the samples and `ended` only grow, arrival marks add up). While Temporal is down (`api.outages`) the task
tries again, backing off up to BACKOFF_MAX_S, and the socket keeps taking and acknowledging audio; once Temporal
answers, one signal carries everything stored meanwhile. A signal Temporal refuses for the request itself (the
workflow has ended) is `refused`, and the socket closes. The task outlives its socket until the last offer is
sent (a client that sent `end` during an outage is told `ended`: its audio and the end are stored), for at most
GIVE_UP_S; should it never get through, the workflow still ends the session from storage at its idle timeout
(`stored_audio`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import structlog
from temporalio.service import RPCError

from monologue import contracts as c

from .outages import temporal_down

BACKOFF_S, BACKOFF_MAX_S = 0.2, 1.0  # a signal goes through within about a second of Temporal's return
GIVE_UP_S = 600.0  # a closed socket's signal not sent after this long is left to the workflow's idle timeout
MAX_MARKS = 64  # arrival marks per signal (latency figures); older ones are thinned out
log = structlog.get_logger("api.sessions")

# Tasks still sending after their socket closed: held here so they are not collected before they finish.
_outliving: set[asyncio.Task[None]] = set()


class WorkflowSignaller:
    """One socket's AUDIO_AVAILABLE signals to its session's workflow, sent in the background."""

    def __init__(self, temporal: Any, session_id: str) -> None:
        self._handle = temporal.get_workflow_handle(c.render_workflow_id(session_id))
        self._session_id = session_id
        self._pending: c.AudioAvailable | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed_at: float | None = None  # when the socket closed (the loop's clock)
        self.refused: str | None = None  # why Temporal refused the signal for good (the workflow has ended)
        self.sent_samples = 0  # the samples the workflow has been told of

    def offer(self, samples: int, *, ended: bool, marks: list[list[float]]) -> None:
        """Tell the workflow (soon) that storage holds `samples` (and whether the audio has ended)."""
        pending = self._pending
        if pending is not None:
            samples, ended = max(samples, pending.samples), ended or pending.ended
            marks = [*pending.marks, *marks]
        self._pending = c.AudioAvailable(samples=samples, ended=ended, marks=marks[-MAX_MARKS:])
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._send_all())

    async def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the offers to be sent (or refused); whether they were sent."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._pending is not None and self.refused is None:
                    await asyncio.sleep(0.02)
        return self._pending is None and self.refused is None

    def outlive(self) -> None:
        """The socket closes: send what is pending in the background (for at most GIVE_UP_S), then stop."""
        task = self._task
        if task is None or task.done():
            return
        self._closed_at = asyncio.get_running_loop().time()
        self._wake.set()
        _outliving.add(task)
        task.add_done_callback(_outliving.discard)

    async def _send_all(self) -> None:
        while self.refused is None:
            if self._pending is None:
                if self._closed_at is not None:
                    return
                await self._wake.wait()
                self._wake.clear()
                continue
            await self._send_pending()

    async def _send_pending(self) -> None:
        """Send the newest offer, trying again while Temporal is down."""
        loop, wait_s = asyncio.get_running_loop(), BACKOFF_S
        while (pending := self._pending) is not None:
            try:
                await self._handle.signal(c.AUDIO_AVAILABLE, pending)
            except RPCError as err:
                if not temporal_down(err):
                    self.refused = f"the session is no longer running ({err.message})"
                    return
                if self._closed_at is not None and loop.time() - self._closed_at > GIVE_UP_S:
                    log.warning(
                        "audio signal dropped: the workflow ends the session from storage", session_id=self._session_id
                    )
                    self._pending = None
                    return
                log.warning("audio signal waits for Temporal", session_id=self._session_id, error=err.message)
                await asyncio.sleep(wait_s)
                wait_s = min(2 * wait_s, BACKOFF_MAX_S)
                continue
            self.sent_samples = max(self.sent_samples, pending.samples)
            if self._pending is pending:  # nothing newer came while it was sent
                self._pending = None
