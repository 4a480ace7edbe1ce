"""RenderWorkflow: one render session, from stored inputs to a final MP4, surviving lost nodes.

Pure orchestration: no I/O, clocks or randomness here, and no heavy imports (only the standard
library, temporalio and the stdlib-only contracts and plan modules). Activities are called by name
so their modules (numpy, PyAV, SQLAlchemy) never enter the workflow sandbox.

    prepare (shared queue)
    hold_node (lease queue): a node with a free slot starts it, signals `node_acquired` and heartbeats
      until released; the session's work then runs on that node's own queue `node-<id>`:
      init_session → generate_chunk in generation order (N0 N1 I0 N2 I1 …) → finalize,
      with `publish` (shared queue) appending segments to the playlist in timeline order.

If the lease dies (node killed: heartbeat timeout; node shutting down: NodeDraining) or a pinned
activity stops (schedule-to-start or heartbeat timeout), the session takes another lease and carries on
from its cursor; the new node restores the reference and the anchors from storage, so the frames are
the ones the first node would have made. Every `continue_as_new_every` chunks the workflow continues
as new with its resume point, so the history stays bounded however long the session.

This module is the main loop; its parts live beside it: `lease` (the node lease race and pinned activities),
`chunks` (the chunks scheduled on the node), `planning` (the chunk plan, live audio), `publishing` (playlist
and sinks), `shared` (the retry policy, shared-queue calls).
"""

from __future__ import annotations

import asyncio
import dataclasses

from temporalio import workflow
from temporalio.common import SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError

from workflows.chunks import ChunkWindow
from workflows.lease import NodeLease, NodeLost
from workflows.planning import LIFETIME_OVER, AudioFeed, SessionPlan
from workflows.publishing import SINK_DRAIN_S, Publisher
from workflows.shared import SHORT, run_shared

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c
    from monologue.contracts import Chunk

# Sessions that ended before webhooks existed queued no messages; their histories must not get the activity on replay.
WEBHOOKS_PATCH = "webhooks-at-session-end"
# Nor did sessions that a node took before `session.started` existed queue one then.
STARTED_PATCH = "webhook-session-started"
# A live session takes its node when it starts, before its first audio: the API admits it only once it has one
# (MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S), and its first chunk finds the node ready. Earlier sessions waited for audio.
LIVE_HOLDS_FIRST_PATCH = "live-holds-node-at-start"
# A render asked to yield whose node died as its chunk finished (both heard at once: its workflow's task was on the dead
# node) moves as a lost session, not as a yield: before this it queued as `yielded`, behind every moving session.
LOST_NOT_YIELDED_PATCH = "a-dead-node-is-lost-not-yielded"
STATUS_KEY = SearchAttributeKey.for_keyword("MonologueStatus")
NODE_KEY = SearchAttributeKey.for_keyword("MonologueNode")
TENANT_KEY = SearchAttributeKey.for_keyword("MonologueTenant")


@workflow.defn(name="RenderWorkflow")
class RenderWorkflow:
    @workflow.init
    def __init__(self, request: c.RenderInputs) -> None:
        # The parts exist before `run` starts: a signal may come in first.
        self._request = request = c.upgraded(request)  # sessions started by older code have a flat input
        self._progress = c.Progress()
        self._audio = AudioFeed()
        self._plan = SessionPlan(request, self._audio, self._progress)
        self._publisher = Publisher(request, self._plan)
        self._lease = NodeLease(request, self._progress, on_acquired=self._node_acquired)
        self._took_node = False  # a node has taken the session in this run
        self._started_notice: asyncio.Task[None] | None = None  # queueing `session.started`
        self._chunks = ChunkWindow(request, self._lease, self._plan, self._audio)
        self._finalizing: workflow.ActivityHandle[c.FinalizeResult] | None = None  # the latest finalize started
        self._final: c.FinalizeResult | None = None  # what finalize returned: the session is completed

    @workflow.query
    def progress(self) -> c.Progress:
        return self._progress

    @workflow.signal(name=c.NODE_ACQUIRED)
    def node_acquired(self, acquired: c.NodeAcquired) -> None:
        self._lease.offer(acquired)

    @workflow.signal(name=c.YIELD_SLOT, unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def yield_slot(self, asked: c.YieldSlot) -> None:
        """A waiting session asked for this render's slot: it goes at the next chunk boundary. One that holds no node
        (or a live session) says so at once, so its asker asks another."""
        if not self._lease.ask_to_yield(asked):
            await self._record_yield(asked.for_session, node_id="", cursor=self._progress.chunks_done, yielded=False)

    @workflow.signal(name=c.AUDIO_AVAILABLE)
    def audio_available(self, audio: c.AudioAvailable) -> None:
        """More of a live session's audio is stored, or it ended."""
        self._audio.receive(audio)

    def _node_acquired(self) -> None:
        """A node took the session: it is running. The first time in a run that a create or a resume started
        (not a continue-as-new, not a node change), queue `session.started` beside the chunks, which do not wait."""
        self._set_status(c.SessionStatus.RUNNING)
        first, self._took_node = not self._took_node, True
        if first and workflow.info().continued_run_id is None and workflow.patched(STARTED_PATCH):
            self._started_notice = asyncio.create_task(self._queue_webhooks(c.SessionStatus.RUNNING))

    def _set_status(self, status: c.SessionStatus) -> None:
        """The status in the progress query and, where enabled, in Temporal's search attributes."""
        self._progress.status = status
        if self._request.orchestration.search_attributes:
            workflow.upsert_search_attributes(
                [
                    STATUS_KEY.value_set(status),
                    NODE_KEY.value_set(self._progress.node_id or ""),
                    TENANT_KEY.value_set(self._request.tenant),
                ]
            )

    @workflow.run
    async def run(self, request: c.RenderInputs) -> c.RenderResult:
        """The session, from its resume point (`request` is the one `__init__` took)."""
        # A live session's lifetime counts from its first run's start, carried by every later run.
        self._plan.live_since_ms = self._request.resume.live_since_ms or workflow.now().timestamp() * 1000
        self._set_status(c.SessionStatus.QUEUED)
        try:
            return await self._render()
        except asyncio.CancelledError:
            # A cancel that comes once finalize has begun loses to it: the session whose video finalize made
            # (and recorded as completed) completes, so Temporal and the database agree.
            final = await self._finalized_despite_cancel()
            if final is not None:
                return await self._complete(final, sink_timeout_s=SINK_DRAIN_S)
            # Cancelled by the API: close the stream so what was published stays playable, record it, and
            # release the node. Activities still run here because the cancellation was caught.
            await self._end(c.SessionStatus.CANCELLED, None)
            raise
        except (ActivityError, ApplicationError) as err:
            message = _root_message(err)
            session_id = self._request.session_id
            workflow.logger.warning("session failed", extra={"session_id": session_id, "error": message})
            await self._end(c.SessionStatus.FAILED, message)
            raise ApplicationError(f"session {session_id} failed: {message}", non_retryable=True) from err

    async def _render(self) -> c.RenderResult:
        request, plan = self._request, self._plan
        if plan.frames == 0 and request.kind == c.SessionKind.RENDER:
            prepare = c.PrepareInput(session_id=request.session_id, options=request.options)
            plan.frames = (await run_shared(c.PREPARE, prepare, c.PrepareResult)).frames
        plan.start()
        self._publisher.start_sinks()
        self._publisher.restore(request.resume.cursor)
        self._progress.chunks_done = request.resume.cursor
        if request.kind is c.SessionKind.LIVE and workflow.patched(LIVE_HOLDS_FIRST_PATCH):
            await self._lease.hold()
        await self._generate()
        await self._publisher.flush()
        self._final = await self._finalize()
        return await self._complete(self._final)

    async def _complete(self, final: c.FinalizeResult, sink_timeout_s: float | None = None) -> c.RenderResult:
        self._lease.release()
        await self._publisher.wait_for_sinks(timeout_s=sink_timeout_s)
        self._set_status(c.SessionStatus.COMPLETED)
        await self._notify(c.SessionStatus.COMPLETED)
        request, plan = self._request, self._plan
        return c.RenderResult(
            session_id=request.session_id, video_key=final.video_key, frames=plan.frames, chunks=len(plan.chunks)
        )

    async def _finalized_despite_cancel(self) -> c.FinalizeResult | None:
        """The final video if finalize returned it, or returns it now: a cancel does not stop a finalize
        under way (it only concatenates what is stored), so its outcome decides how the session ends."""
        finalizing = self._finalizing
        if self._final is not None or finalizing is None or finalizing.cancelled():
            return self._final
        try:
            return await self._lease.wait(finalizing, c.FINALIZE)
        except (ActivityError, NodeLost):
            return None

    async def _generate(self) -> None:
        """Every chunk of the plan (a live session's plan grows while this runs), in generation order."""
        plan, audio, chunks, lease = self._plan, self._audio, self._chunks, self._lease
        cursor = started_at = self._request.resume.cursor
        while cursor < len(plan.chunks) or not plan.planned_all:
            if plan.lifetime_over():  # audio may still be coming: the session ends with what it has
                await plan.end_audio(LIFETIME_OVER)
            if audio.news:  # a live session's audio grew (or ended) since we last looked: plan it
                audio.news = False
                plan.extend()
                continue
            if cursor == len(plan.chunks):  # a live session waiting for audio (holding its node)
                await plan.wait_for_audio()
                continue
            renew = self._should_renew(cursor - started_at)
            if renew and not chunks.scheduled:
                await self._continue_as_new(cursor)
            try:
                await lease.hold()
                if not renew:
                    chunks.fill(cursor)
                spec = await chunks.next_generated()
            except NodeLost:
                chunks.abandon()
                lease.lose()
                continue
            except ActivityError as err:
                cursor = self._regenerate_from(err)
                continue
            cursor += 1
            self._chunk_generated(spec, cursor)
            if lease.yield_for is not None and lease.ended() and workflow.patched(LOST_NOT_YIELDED_PATCH):
                chunks.abandon()
                lease.lose()
            elif lease.yield_for is not None:
                await self._give_way(cursor)

    async def _give_way(self, cursor: int) -> None:
        """Yield the slot to the live session that asked: the chunks scheduled ahead are dropped (the next node makes
        them again from the anchors, the same frames), and the session queues again as moving."""
        asked = self._lease.yield_for
        for_session = asked.for_session if asked is not None else ""
        self._chunks.abandon()
        node_id = self._lease.give_way()
        session_id = self._request.session_id
        workflow.logger.info("yielded", extra={"session_id": session_id, "for_session": for_session, "node": node_id})
        await self._record_yield(for_session, node_id=node_id, cursor=cursor, yielded=True)

    async def _record_yield(self, for_session: str, *, node_id: str, cursor: int, yielded: bool) -> None:
        session_id = self._request.session_id
        record = c.RecordYieldInput(
            session_id=session_id, for_session=for_session, node_id=node_id, chunks_done=cursor, yielded=yielded
        )
        try:
            await run_shared(c.RECORD_YIELD, record, type(None), SHORT)
        except ActivityError as err:  # the record is for people and the policy's bookkeeping; the session goes on
            workflow.logger.warning("yield not recorded", extra={"session_id": session_id, "error": str(err)})

    def _should_renew(self, chunks_this_run: int) -> bool:
        """Time to continue as new (once the chunks scheduled are done), so the history stays bounded."""
        every = self._request.orchestration.continue_as_new_every
        return chunks_this_run >= every or workflow.info().is_continue_as_new_suggested()

    def _chunk_generated(self, spec: Chunk, cursor: int) -> None:
        self._plan.audio_ready.pop(spec.name, None)
        self._progress.chunks_done = max(self._progress.chunks_done, cursor)
        self._publisher.chunk_generated(spec)

    def _regenerate_from(self, err: ActivityError) -> int:
        """A chunk found the checkpoint of an N chunk gone: the cursor moves back to that N chunk (its own
        dependency is checked the same way). The frames come out identical, so nothing published changes.
        Any other error is the session's failure."""
        lost = _lost_checkpoint(err)
        if lost is None:
            raise err
        workflow.logger.warning("checkpoint lost", extra={"session_id": self._request.session_id, "chunk": f"N{lost}"})
        self._chunks.abandon()
        return next(i for i, spec in enumerate(self._plan.chunks) if (spec.kind, spec.index) == (c.ChunkKind.N, lost))

    async def _continue_as_new(self, cursor: int) -> None:
        """A new run of this session from `cursor`: the same input with a new resume point."""
        await self._publisher.settle()
        await self._publisher.stop_sinks()
        await self._started_queued()
        self._lease.release()
        resume = c.ResumePoint(
            cursor=cursor,
            frames=self._plan.frames,
            audio_samples=self._audio.samples,
            audio_ended=self._audio.ended,
            live_since_ms=self._plan.live_since_ms,
            lease=self._lease.number,
        )
        workflow.continue_as_new(dataclasses.replace(self._request, resume=resume))

    async def _finalize(self) -> c.FinalizeResult:
        """The final MP4, made on a held node (whichever holds the session by then)."""
        lease = self._lease
        finalize = c.FinalizeInput(
            session_id=self._request.session_id, node_id="", options=self._request.options, frames=self._plan.frames
        )
        while True:
            try:
                await lease.hold()
                finalize.node_id, finalize.lease = lease.node_id or "", lease.number
                self._finalizing = lease.start(c.FINALIZE, finalize, c.FinalizeResult)
                return await lease.wait(self._finalizing, c.FINALIZE)
            except NodeLost:
                lease.lose()

    async def _end(self, status: c.SessionStatus, error: str | None) -> None:
        """A failed or cancelled session: release the node, record the end (which closes the stream, so what
        was published stays playable), and give the sinks a while to deliver it."""
        self._lease.release()
        self._set_status(status)
        record = c.RecordStatusInput(
            session_id=self._request.session_id,
            status=status,
            options=self._request.options,
            total_frames=self._plan.frames,
            published_frames=self._publisher.published,
            error=error,
            session_kind=self._request.kind,
        )
        await run_shared(c.RECORD_STATUS, record, type(None), SHORT)
        await self._notify(status)
        await self._publisher.wait_for_sinks(timeout_s=SINK_DRAIN_S)  # they send what was published, then stop

    async def _notify(self, status: c.SessionStatus) -> None:
        """Queue the messages of the session's end, after its `session.started` ones."""
        await self._started_queued()
        if workflow.patched(WEBHOOKS_PATCH):
            await self._queue_webhooks(status)

    async def _started_queued(self) -> None:
        """Until `session.started` is queued (or failed to be), however its task ended: no run ends before."""
        if self._started_notice is not None:
            await workflow.wait([self._started_notice])

    async def _queue_webhooks(self, status: c.SessionStatus) -> None:
        """Queue the session's webhook messages for `status` (each is then delivered by its own workflow, so a
        receiver that is down never holds this session open). A failure to queue them is logged; the session
        goes on as it is."""
        notice = c.NotifyEndedInput(session_id=self._request.session_id, tenant=self._request.tenant, status=status)
        try:
            await run_shared(c.NOTIFY_ENDED, notice, c.NotifyEndedResult, SHORT)
        except ActivityError as err:
            workflow.logger.warning(
                "webhooks not queued", extra={"session_id": self._request.session_id, "error": _root_message(err)}
            )


def _lost_checkpoint(err: ActivityError) -> int | None:
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == c.CHECKPOINT_LOST and cause.details:
        return int(cause.details[0])
    return None


def _root_message(err: BaseException) -> str:
    """The innermost cause's message: what actually went wrong, without Temporal's wrapping."""
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err.message) if isinstance(err, ApplicationError) else str(err)
