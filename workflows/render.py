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
activity cannot start (schedule-to-start timeout), the session takes another lease and carries on
from its cursor; the new node restores the reference and the anchors from storage, so the frames are
the ones the first node would have made. Every `continue_as_new_every` chunks the workflow continues
as new with its cursor, so the history stays bounded however long the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c
    from monologue.plan import (
        AUDIO_RATE,
        ChunkSpec,
        IncrementalPlanner,
        chunk_sizes,
        live_frames,
        live_samples_needed,
        timeline_order,
    )

Result = TypeVar("Result")
SINK_DRAIN_S = 120  # a cancelled or failed session lets its sinks deliver what was published for this long
STATUS_KEY = SearchAttributeKey.for_keyword("MonologueStatus")
NODE_KEY = SearchAttributeKey.for_keyword("MonologueNode")
TENANT_KEY = SearchAttributeKey.for_keyword("MonologueTenant")

# Bad input is marked non-retryable by the activities themselves; everything else retries with backoff.
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[c.NODE_DRAINING, c.CHECKPOINT_LOST],
)


class NodeLost(Exception):
    """The node holding the session died, is draining, or stopped taking its work."""


async def _shared(name: str, arg: Any, result_type: type[Result]) -> Result:
    """An activity on the shared queue (any node may run it)."""
    result: Result = await workflow.execute_activity(
        name, arg, result_type=result_type, start_to_close_timeout=timedelta(minutes=5), retry_policy=RETRY
    )
    return result


@workflow.defn(name="RenderWorkflow")
class RenderWorkflow:
    def __init__(self) -> None:
        self._progress = c.Progress()
        self._lease: workflow.ActivityHandle[None] | None = None
        self._lease_number = 0
        self._node_id: str | None = None
        self._offered: c.NodeAcquired | None = None
        self._epoch = 0  # bumped when scheduled chunks are abandoned, so a node never runs a stale one
        self._publishing: workflow.ActivityHandle[c.PublishResult] | None = None
        self._published = 0  # frames of the timeline whose segments can go out (all generated)
        self._published_sent = 0  # frames the playlist was last asked to show
        # Live sessions: the audio stored so far, and when it arrived (from AUDIO_AVAILABLE signals).
        self._samples, self._ended, self._audio_news = 0, False, False
        self._audio_marks: deque[tuple[int, float]] = deque()
        self._audio_ready: dict[str, float] = {}  # planned live chunks: when their audio was stored (epoch ms)
        # Set once the audio has ended and the last chunks are planned (sessions with a lifetime only, so that
        # older histories replay): audio signalled later (the API still sending) is not part of the session.
        self._audio_closed = False

    @workflow.query
    def progress(self) -> c.Progress:
        return self._progress

    @workflow.signal(name=c.NODE_ACQUIRED)
    def node_acquired(self, acquired: c.NodeAcquired) -> None:
        if acquired.lease == self._lease_number:  # a stale lease's signal is ignored
            self._offered = acquired

    def _set_status(self, status: str) -> None:
        """The status in the progress query and, where enabled, in Temporal's search attributes."""
        self._progress.status = status
        if self._request.search_attributes:
            workflow.upsert_search_attributes(
                [
                    STATUS_KEY.value_set(status),
                    NODE_KEY.value_set(self._progress.node_id or ""),
                    TENANT_KEY.value_set(self._request.tenant),
                ]
            )

    @workflow.run
    async def run(self, request: c.RenderInput) -> c.RenderResult:
        self._request = request
        # A live session's lifetime counts from its first run's start, carried by every later run.
        self._live_since_ms = request.live_since_ms or workflow.now().timestamp() * 1000
        self._set_status("queued")
        self._frames = request.frames
        self._published = 0
        try:
            return await self._render(request)
        except asyncio.CancelledError:
            # Cancelled by the API: close the stream so what was published stays playable, record it, and
            # release the node. Activities still run here because the cancellation was caught.
            self._release()
            self._set_status("cancelled")
            await self._record("cancelled", None)
            await self._wait_for_sinks(timeout_s=SINK_DRAIN_S)  # they send what was published, then stop
            raise
        except (ActivityError, ApplicationError) as err:
            message = _root_message(err)
            workflow.logger.warning("session failed", extra={"session_id": request.session_id, "error": message})
            self._release()
            self._set_status("failed")
            await self._record("failed", message)
            await self._wait_for_sinks(timeout_s=SINK_DRAIN_S)
            raise ApplicationError(f"session {request.session_id} failed: {message}", non_retryable=True) from err

    async def _render(self, request: c.RenderInput) -> c.RenderResult:
        session_id, options = request.session_id, request.options
        if self._frames == 0 and not request.live:
            prepared = await _shared(c.PREPARE, c.PrepareInput(session_id=session_id, options=options), c.PrepareResult)
            self._frames = prepared.frames
        self._plan_chunks()
        self._start_sinks()
        plan, timeline = self._plan, self._timeline
        cursor = request.cursor
        generated = {spec.name for spec in plan[:cursor]}
        published = _published_prefix(timeline, generated, 0)
        self._published = timeline[published - 1].end_frame if published else 0
        self._progress.chunks_done = cursor
        started_at = cursor
        # Chunk activities already scheduled on the node, oldest first: (position, spec, handle). Keeping the
        # next chunk scheduled while one runs hides Temporal's round trip; the node runs them in order.
        inflight: deque[tuple[int, ChunkSpec, workflow.ActivityHandle[c.GenerateChunkResult]]] = deque()

        while cursor < len(plan) or not self._planned_all():
            if self._lifetime_over():  # audio may still be coming: the session ends with what it has
                self._end_audio("live session reached its lifetime: ending it")
            if self._audio_news:  # a live session's audio grew (or ended) since we last looked: plan it
                self._audio_news = False
                self._extend_plan()
                continue
            if cursor == len(plan):  # a live session waiting for audio (holding its node)
                await self._wait_for_audio()
                continue
            renew = (
                cursor - started_at >= request.continue_as_new_every or workflow.info().is_continue_as_new_suggested()
            )
            if renew and not inflight:
                if self._publishing is not None:
                    await self._publishing
                await self._stop_sinks()
                self._release()
                workflow.continue_as_new(
                    c.RenderInput(
                        session_id=session_id,
                        options=options,
                        cursor=cursor,
                        frames=self._frames,
                        lease_timeout_s=request.lease_timeout_s,
                        continue_as_new_every=request.continue_as_new_every,
                        window=request.window,
                        tenant=request.tenant,
                        search_attributes=request.search_attributes,
                        live=request.live,
                        audio_samples=self._samples,
                        audio_ended=self._ended,
                        idle_timeout_s=request.idle_timeout_s,
                        max_live_s=request.max_live_s,
                        live_since_ms=self._live_since_ms,
                    )
                )
            try:
                await self._ensure_node()
                next_position = cursor + len(inflight)
                while not renew and len(inflight) < request.window and next_position < len(plan):
                    wait_for = next_position - 1 if inflight else None
                    chunk_input = self._chunk_input(plan[next_position], next_position, wait_for)
                    handle = self._start_on_node(c.GENERATE_CHUNK, chunk_input, c.GenerateChunkResult)
                    inflight.append((next_position, plan[next_position], handle))
                    next_position += 1
                _, spec, handle = inflight[0]
                await self._await_on_node(handle, c.GENERATE_CHUNK)
            except NodeLost:
                self._abandon(inflight)
                self._lose_node()
                continue
            except ActivityError as err:
                lost = _lost_checkpoint(err)
                if lost is None:
                    raise
                # Regenerate from the N chunk whose checkpoint is gone (its own dependency is checked the
                # same way): the frames come out identical, so nothing published changes.
                workflow.logger.warning("checkpoint lost", extra={"session_id": session_id, "chunk": f"N{lost}"})
                self._abandon(inflight)
                cursor = next(i for i, s in enumerate(plan) if (s.kind, s.index) == ("N", lost))
                continue
            inflight.popleft()
            generated.add(spec.name)
            self._audio_ready.pop(spec.name, None)
            cursor += 1
            self._progress.chunks_done = max(self._progress.chunks_done, cursor)
            published = _published_prefix(timeline, generated, published)
            if published:
                self._published = timeline[published - 1].end_frame
            self._publish()
        while self._publishing is not None:  # the last segments
            await self._publishing
            self._publishing = None
            self._publish()

        finalize = c.FinalizeInput(session_id=session_id, node_id="", options=options, frames=self._frames)
        while True:
            try:
                await self._ensure_node()
                finalize.node_id = self._node_id or ""
                final = await self._on_node(c.FINALIZE, finalize, c.FinalizeResult)
                break
            except NodeLost:
                self._lose_node()
        self._release()
        await self._wait_for_sinks()
        self._set_status("completed")
        return c.RenderResult(session_id=session_id, video_key=final.video_key, frames=self._frames, chunks=len(plan))

    # --- the chunk plan: fixed for a render, growing with the audio for a live session ---

    def _plan_chunks(self) -> None:
        request = self._request
        self._plan: list[ChunkSpec] = []
        self._timeline: list[ChunkSpec] = []
        self._planner = IncrementalPlanner(**chunk_sizes(request.options))
        if request.live:
            if request.audio_ended and request.max_live_s > 0:  # ended before this run: later signals do not count
                self._samples, self._ended = request.audio_samples, True
            else:
                self._samples = max(self._samples, request.audio_samples)  # a signal may have come in first
                self._ended = self._ended or request.audio_ended
            self._extend_plan()
        else:
            self._samples, self._ended = 0, True
            self._extend_plan(frames=self._frames)

    def _extend_plan(self, frames: int | None = None) -> None:
        """Add the chunks the audio stored so far makes possible (chunks only ever get appended, and newly
        planned chunks always come after the planned ones in timeline order)."""
        options = self._request.options
        if frames is None:
            frames = live_frames(self._samples, rate=AUDIO_RATE, fps=options.fps, ended=self._ended)
            if self._ended:
                if frames < 1:
                    raise ApplicationError(
                        f"live session {self._request.session_id} ended with no audio"
                        f" ({self._samples} samples is less than one frame)",
                        non_retryable=True,
                    )
                self._frames = frames
        new = list(self._planner.advance(frames, final=self._ended))
        if self._request.live:
            self._note_audio_ready(new)
            self._audio_closed = self._ended and self._request.max_live_s > 0
        self._plan.extend(new)
        self._timeline.extend(timeline_order(new))
        self._progress.chunks_total = len(self._plan) if self._planned_all() else 0

    def _planned_all(self) -> bool:
        return self._planner.finished

    @workflow.signal(name=c.AUDIO_AVAILABLE)
    def audio_available(self, audio: c.AudioAvailable) -> None:
        """More of a live session's audio is stored (signals may repeat or arrive late: take the maximum)."""
        if self._audio_closed:
            return
        for samples, received_ms in audio.marks:
            self._audio_marks.append((int(samples), received_ms))
        if audio.samples > self._samples or (audio.ended and not self._ended):
            self._samples = max(self._samples, audio.samples)
            self._ended = self._ended or audio.ended
            self._audio_news = True

    async def _wait_for_audio(self) -> None:
        """Wait for a live session's next audio; none for `idle_timeout_s`, or the end of its lifetime, ends the
        session with the audio it has."""
        timeout_s = self._request.idle_timeout_s
        lifetime_left_s = self._lifetime_left_s()
        if lifetime_left_s is not None:
            timeout_s = min(timeout_s, lifetime_left_s)
        try:
            await workflow.wait_condition(lambda: self._audio_news, timeout=timedelta(seconds=timeout_s))
        except TimeoutError:  # the builtin: wait_condition's timeout
            over = self._lifetime_over()
            self._end_audio("live session reached its lifetime: ending it" if over else "live session idle: ending it")

    def _lifetime_left_s(self) -> float | None:
        """Seconds a live session has left before its lifetime ends it; None without a lifetime (a render, a
        session whose audio has ended, or one started before lifetimes existed). Temporal's clock: replays agree."""
        if not self._request.live or self._request.max_live_s <= 0 or self._ended:
            return None
        lived_s = (workflow.now().timestamp() * 1000 - self._live_since_ms) / 1000
        return self._request.max_live_s - lived_s

    def _lifetime_over(self) -> bool:
        left_s = self._lifetime_left_s()
        return left_s is not None and left_s <= 0

    def _end_audio(self, reason: str) -> None:
        """No more audio: plan the session's last chunks from what is stored."""
        workflow.logger.info(reason, extra={"session_id": self._request.session_id, "samples": self._samples})
        self._ended = True
        self._extend_plan()

    def _note_audio_ready(self, new: list[ChunkSpec]) -> None:
        """When the API had stored the audio each newly planned live chunk needs (its frames and the
        look-ahead): the first arrival mark that covers it. Marks before the newest are then dropped: later
        chunks need more audio than these."""
        for spec in new:
            needed = live_samples_needed(spec.end_frame, rate=AUDIO_RATE, fps=self._request.options.fps)
            ready = next((ms for samples, ms in self._audio_marks if samples >= needed), None)
            if ready is None and self._audio_marks:
                ready = self._audio_marks[-1][1]  # the last chunks of an ended session: the end of the audio
            if ready is not None:
                self._audio_ready[spec.name] = ready
        while len(self._audio_marks) > 1:
            self._audio_marks.popleft()

    # --- sinks: one pump activity per sink, fed from storage; never in the way of generation ---

    def _start_sinks(self) -> None:
        self._sinks: list[workflow.ActivityHandle[c.RunSinkResult]] = []
        for spec in self._request.options.sinks:
            self._sinks.append(
                workflow.start_activity(
                    c.RUN_SINK,
                    c.RunSinkInput(session_id=self._request.session_id, options=self._request.options, sink=spec),
                    result_type=c.RunSinkResult,
                    task_queue=c.sink_task_queue(workflow.info().task_queue),
                    start_to_close_timeout=timedelta(days=30),
                    heartbeat_timeout=timedelta(seconds=30),
                    retry_policy=RetryPolicy(
                        initial_interval=timedelta(seconds=1),
                        maximum_interval=timedelta(seconds=30),
                        maximum_attempts=c.SINK_ATTEMPTS,
                    ),
                    # Wait for a cancelled pump to hand over (close its connection) before starting the next.
                    cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
            )

    async def _wait_for_sinks(self, timeout_s: float | None = None) -> None:
        """Let the pumps deliver the rest of the stream. A sink that failed for good is recorded on the session
        by its pump and does not fail the session: the video is in storage either way."""
        pending = [handle for handle in self._sinks if not handle.done()]
        if pending:
            await workflow.wait(pending, timeout=timeout_s)
        for handle in self._sinks:
            if not handle.done():
                handle.cancel()
            elif handle.exception() is not None:
                workflow.logger.warning(
                    "sink failed", extra={"session_id": self._request.session_id, "error": str(handle.exception())}
                )

    async def _stop_sinks(self) -> None:
        """Before continuing as new: stop the pumps (each records how far its sink got; the next run's resume)."""
        for handle in self._sinks:
            if not handle.done():
                handle.cancel()
        for handle in self._sinks:
            with contextlib.suppress(ActivityError, asyncio.CancelledError):  # it recorded where it got to
                await handle

    def _publish(self) -> None:
        """Extend the playlist to everything generated so far, one publish at a time and never waiting for
        one: segments go out in timeline order while the node keeps generating."""
        if self._publishing is not None:
            if not self._publishing.done():
                return
            self._publishing.result()  # a publish that failed for good fails the session
            self._publishing = None
        if self._published > self._published_sent:
            self._published_sent = self._published
            self._publishing = workflow.start_activity(
                c.PUBLISH,
                c.PublishInput(
                    session_id=self._request.session_id,
                    options=self._request.options,
                    total_frames=self._frames,
                    published_frames=self._published,
                    live=self._request.live,
                ),
                result_type=c.PublishResult,
                start_to_close_timeout=timedelta(minutes=1),
                retry_policy=RETRY,
            )

    def _chunk_input(self, spec: ChunkSpec, position: int, wait_for: int | None) -> c.GenerateChunkInput:
        return c.GenerateChunkInput(
            session_id=self._request.session_id,
            node_id=self._node_id or "",
            options=self._request.options,
            kind=spec.kind,
            index=spec.index,
            first_frame=spec.first_frame,
            n_frames=spec.n_frames,
            position=position,
            wait_for=wait_for,
            epoch=self._epoch,
            live=self._request.live,
            audio_samples=self._samples,
            audio_ended=self._ended,
            audio_ready_ms=self._audio_ready.get(spec.name),
        )

    async def _ensure_node(self) -> None:
        """Hold a node: start a lease, wait until a node with a free slot takes it, set the session up there."""
        while self._node_id is None:
            self._lease_number += 1
            self._offered = None
            self._lease = workflow.start_activity(
                c.HOLD_NODE,
                c.HoldNodeInput(
                    session_id=self._request.session_id,
                    workflow_id=workflow.info().workflow_id,
                    lease=self._lease_number,
                    heartbeat_s=min(1.0, self._request.lease_timeout_s / 4),
                ),
                task_queue=c.lease_task_queue(workflow.info().task_queue),
                # Waiting for a free slot can take as long as other sessions take; a held lease lasts the session.
                schedule_to_close_timeout=timedelta(days=7),
                heartbeat_timeout=timedelta(seconds=self._request.lease_timeout_s),
                retry_policy=RetryPolicy(maximum_attempts=1),  # this workflow decides what to do next
            )
            await workflow.wait_condition(self._offered_or_lease_ended)
            if self._offered is None:  # the lease ended before any node took it
                self._lease = None
                continue
            self._node_id = self._offered.node_id
            self._progress.node_id = self._node_id
            self._set_status("running")
            try:
                await self._on_node(
                    c.INIT_SESSION,
                    c.InitSessionInput(
                        session_id=self._request.session_id,
                        node_id=self._node_id,
                        options=self._request.options,
                        live=self._request.live,
                    ),
                    c.InitSessionResult,
                )
            except NodeLost:
                self._lose_node()

    def _offered_or_lease_ended(self) -> bool:
        return self._offered is not None or self._lease is None or self._lease.done()

    async def _on_node(self, name: str, arg: Any, result_type: type[Result]) -> Result:
        """Run an activity on the held node, watching the lease: if the node goes, so does the activity."""
        return await self._await_on_node(self._start_on_node(name, arg, result_type), name)

    def _start_on_node(self, name: str, arg: Any, result_type: type[Result]) -> workflow.ActivityHandle[Result]:
        if self._node_id is None:
            raise NodeLost("no node held")
        return workflow.start_activity(
            name,
            arg,
            result_type=result_type,
            task_queue=c.node_task_queue(self._node_id),
            # A dead node's queue has no poller: only schedule_to_start notices that.
            schedule_to_start_timeout=timedelta(seconds=3 * self._request.lease_timeout_s),
            start_to_close_timeout=timedelta(minutes=15),
            heartbeat_timeout=timedelta(minutes=2),
            retry_policy=RETRY,
        )

    async def _await_on_node(self, handle: workflow.ActivityHandle[Result], name: str) -> Result:
        """The activity's result, unless the lease ends first (node lost or draining)."""
        lease = self._lease
        if lease is None:
            raise NodeLost("no node held")
        await workflow.wait([handle, lease], return_when=asyncio.FIRST_COMPLETED)
        if not handle.done():
            if _draining(lease):
                try:
                    finished: Result = await handle  # a draining node finishes the activity it has
                    return finished
                except ActivityError as err:
                    raise NodeLost(f"node {self._node_id} drained during {name}") from err
            handle.cancel()
            raise NodeLost(f"node {self._node_id} lost during {name}")
        try:
            result: Result = handle.result()
            return result
        except ActivityError as err:
            if isinstance(err.cause, ActivityTimeout) and err.cause.type in (
                TimeoutType.SCHEDULE_TO_START,
                TimeoutType.HEARTBEAT,
            ):
                raise NodeLost(f"node {self._node_id} stopped taking work ({err.cause.type.name})") from err
            raise

    def _abandon(self, inflight: deque[tuple[int, ChunkSpec, workflow.ActivityHandle[c.GenerateChunkResult]]]) -> None:
        """Cancel the chunks scheduled ahead; the new epoch keeps a node from running any that linger."""
        for _, _, handle in inflight:
            if not handle.done():
                handle.cancel()
        inflight.clear()
        self._epoch += 1

    def _lose_node(self) -> None:
        workflow.logger.warning("node lost", extra={"session_id": self._request.session_id, "node_id": self._node_id})
        self._release()
        self._progress.node_changes += 1

    def _release(self) -> None:
        """Give the node's slot back (the lease activity sees the cancellation at its next heartbeat)."""
        if self._lease is not None and not self._lease.done():
            self._lease.cancel()
        self._lease, self._node_id = None, None

    async def _record(self, status: str, error: str | None) -> None:
        await _shared(
            c.RECORD_STATUS,
            c.RecordStatusInput(
                session_id=self._request.session_id,
                status=status,
                options=self._request.options,
                total_frames=self._frames,
                published_frames=self._published,
                error=error,
                live=self._request.live,
            ),
            type(None),
        )


def _published_prefix(timeline: list[ChunkSpec], generated: set[str], count: int) -> int:
    """How many timeline chunks, from the start, are all generated (so their segments can go out), given
    that the first `count` are."""
    while count < len(timeline) and timeline[count].name in generated:
        count += 1
    return count


def _draining(lease: workflow.ActivityHandle[None]) -> bool:
    error = lease.exception() if lease.done() and not lease.cancelled() else None
    return (
        isinstance(error, ActivityError)
        and isinstance(error.cause, ApplicationError)
        and (error.cause.type == c.NODE_DRAINING)
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
