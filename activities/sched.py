"""Preemption's activities, on the shared queue: a session that waits for a node (a live one, one whose node was lost,
a render below its tenant's share) asks a render to yield its slot (`ask_to_yield`: the policy is
`monologue.repo.sched`), and a render that yielded, or could not, records it (`record_yield`: the session's count,
the metric, the log line the ops UI and the session's events show)."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog
from sqlalchemy.orm import sessionmaker
from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from monologue import contracts as c, metrics
from monologue.repo import sched as repo_sched
from monologue.settings import SchedSettings

log = structlog.get_logger("sched")
CHOICES = 3  # renders an ask tries before it gives up until its next one (each ended before its signal came)


class SchedActivities:
    def __init__(
        self, *, client: Client, sessions: sessionmaker[Any], settings: SchedSettings, lost_after_s: float
    ) -> None:
        self._client = client
        self._sessions = sessions
        self._settings = settings
        self._lost_after_s = lost_after_s  # the lease timeout: a node silent this long is being declared lost

    @activity.defn(name=c.ASK_TO_YIELD)
    async def ask_to_yield(self, request: c.AskToYieldInput) -> c.AskToYieldResult:
        """Pick the render that should give way to `request.session_id` and tell it (a signal: it yields at its next
        chunk boundary). Nothing is asked while the asker's last one is on its way, or when no render may yield. A
        render whose workflow had ended (a node's report lags it) is unmarked and the next one asked."""
        # To a live session or one that lost its node, the render queues again ahead of every render (as `yielded`,
        # below the session it gave way to); to a fairer share, in its own class, so the tenants' weights decide.
        slot = c.YieldSlot(for_session=request.session_id, as_moving=request.why is not c.AskReason.FAIR_SHARE)
        passed_over: frozenset[str] = frozenset()
        for _ in range(CHOICES):
            chosen = await asyncio.to_thread(self._choose, request, passed_over)
            if chosen is None:
                break
            asked = chosen.session_id
            try:
                await self._client.get_workflow_handle(c.render_workflow_id(asked)).signal(c.YIELD_SLOT, slot)
            except RPCError as err:  # it ended meanwhile: it has no slot to give, another render may
                log.info("render asked to yield had ended", session_id=asked, error=str(err))
                await asyncio.to_thread(self._unmark, asked, request.session_id)
                passed_over |= {asked}
                continue
            log.info(
                "render asked to yield",
                session_id=asked,
                for_session=request.session_id,
                why=request.why,
                node_id=chosen.node_id,
            )
            return c.AskToYieldResult(asked=asked, node_id=chosen.node_id)
        return c.AskToYieldResult(asked=None)

    def _unmark(self, asked: str, asker: str) -> None:
        with self._sessions() as db:
            repo_sched.unmark(db, asked, asker)

    def _choose(self, request: c.AskToYieldInput, passed_over: frozenset[str]) -> repo_sched.Asked | None:
        asker = repo_sched.Asker(request.session_id, request.tenant, request.queue_class, request.why)
        settings = self._settings
        with self._sessions() as db:
            return repo_sched.ask_to_yield(
                db,
                asker,
                weight=settings.weight,
                max_preemptions=settings.max_preemptions,
                grace_s=settings.yield_grace_s,
                lost_after_s=self._lost_after_s,
                passed_over=passed_over,
            )

    @activity.defn(name=c.RECORD_YIELD)
    def record_yield(self, request: c.RecordYieldInput) -> None:
        """The render gave its slot up at a chunk boundary (it moves, and resumes from its anchors), or could not (it
        held no node when asked: its asker asks another)."""
        with self._sessions() as db:
            counted = repo_sched.record_yield(db, session_id=request.session_id, yielded=request.yielded)
        if counted:
            metrics.PREEMPTIONS.inc()
        log.info(
            "preempted" if request.yielded else "could not yield",
            session_id=request.session_id,
            for_session=request.for_session,
            node_id=request.node_id,
            chunks_done=request.chunks_done,
        )
