"""RenderWorkflow: one render session, from stored inputs to a final MP4.

Pure orchestration: no I/O, clocks or randomness here, and no heavy imports (only the standard
library, temporalio and the stdlib-only contracts and plan modules). Activities are called by name
so their modules (numpy, PyAV, SQLAlchemy) never enter the workflow sandbox.

    prepare (shared queue) → acquire_node (shared queue, answered by a free node)
      → init_session → generate_chunk per chunk in generation order (N0 N1 I0 N2 I1 …) → finalize
        (on the node's own queue `node-<id>`), with `publish` (shared queue) appending segments to
        the HLS playlist in timeline order while the next chunk generates.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c
    from monologue.plan import plan_chunks, timeline_order

Result = TypeVar("Result")

# Bad input is marked non-retryable by the activities themselves; everything else retries with backoff.
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)


async def _shared(name: str, arg: Any, result_type: type[Result]) -> Result:
    """An activity on the shared queue (any node may run it)."""
    result: Result = await workflow.execute_activity(
        name, arg, result_type=result_type, start_to_close_timeout=timedelta(minutes=5), retry_policy=RETRY
    )
    return result


async def _pinned(name: str, arg: Any, result_type: type[Result], *, task_queue: str) -> Result:
    """An activity on one node's own queue. A dead node leaves its queue without a poller, which only
    schedule_to_start notices; the heartbeat timeout notices a node that dies mid-activity."""
    result: Result = await workflow.execute_activity(
        name,
        arg,
        result_type=result_type,
        task_queue=task_queue,
        schedule_to_start_timeout=timedelta(minutes=2),
        start_to_close_timeout=timedelta(minutes=15),
        heartbeat_timeout=timedelta(seconds=30),
        retry_policy=RETRY,
    )
    return result


@workflow.defn(name="RenderWorkflow")
class RenderWorkflow:
    def __init__(self) -> None:
        self._progress = c.Progress()

    @workflow.query
    def progress(self) -> c.Progress:
        return self._progress

    @workflow.run
    async def run(self, request: c.RenderInput) -> c.RenderResult:
        session_id = request.session_id
        try:
            return await self._render(request)
        except ActivityError as err:
            message = _root_message(err)
            workflow.logger.warning("session failed", extra={"session_id": session_id, "error": message})
            self._progress.status = "failed"
            await _shared(c.RECORD_FAILURE, c.RecordFailureInput(session_id=session_id, error=message), type(None))
            raise ApplicationError(f"session {session_id} failed: {message}", non_retryable=True) from err

    async def _render(self, request: c.RenderInput) -> c.RenderResult:
        session_id, options = request.session_id, request.options
        prepared = await _shared(c.PREPARE, c.PrepareInput(session_id=session_id, options=options), c.PrepareResult)
        plan = plan_chunks(prepared.frames, n_frames=options.chunk_frames, i_frames=options.i_frames)
        timeline = timeline_order(plan)
        self._progress.chunks_total = len(plan)

        node = await _shared(c.ACQUIRE_NODE, c.AcquireNodeInput(session_id=session_id), c.AcquireNodeResult)
        self._progress.node_id = node.node_id
        self._progress.status = "running"
        queue = node.task_queue
        await _pinned(
            c.INIT_SESSION,
            c.InitSessionInput(session_id=session_id, node_id=node.node_id, options=options),
            c.InitSessionResult,
            task_queue=queue,
        )
        generated: set[str] = set()
        published = 0  # timeline chunks published so far (a prefix of the timeline)
        publishing: workflow.ActivityHandle[c.PublishResult] | None = None
        for spec in plan:  # generation order: N0 N1 I0 N2 I1 …
            chunk = c.GenerateChunkInput(
                session_id=session_id,
                node_id=node.node_id,
                options=options,
                kind=spec.kind,
                index=spec.index,
                first_frame=spec.first_frame,
                n_frames=spec.n_frames,
            )
            await _pinned(c.GENERATE_CHUNK, chunk, c.GenerateChunkResult, task_queue=queue)
            generated.add(spec.name)
            self._progress.chunks_done += 1
            before = published
            while published < len(timeline) and timeline[published].name in generated:
                published += 1
            if published > before:
                # Segments go out in timeline order, while the next chunk generates.
                if publishing is not None:
                    await publishing
                publishing = _start_publish(session_id, options, prepared.frames, timeline[published - 1].end_frame)
        if publishing is not None:
            await publishing

        final = await _pinned(
            c.FINALIZE,
            c.FinalizeInput(session_id=session_id, node_id=node.node_id, options=options, frames=prepared.frames),
            c.FinalizeResult,
            task_queue=queue,
        )
        self._progress.status = "completed"
        return c.RenderResult(
            session_id=session_id, video_key=final.video_key, frames=prepared.frames, chunks=len(plan)
        )


def _start_publish(
    session_id: str, options: c.RenderOptions, total_frames: int, published_frames: int
) -> workflow.ActivityHandle[c.PublishResult]:
    return workflow.start_activity(
        c.PUBLISH,
        c.PublishInput(
            session_id=session_id, options=options, total_frames=total_frames, published_frames=published_frames
        ),
        result_type=c.PublishResult,
        start_to_close_timeout=timedelta(minutes=1),
        retry_policy=RETRY,
    )


def _root_message(err: BaseException) -> str:
    """The innermost cause's message: what actually went wrong, without Temporal's wrapping."""
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err.message) if isinstance(err, ApplicationError) else str(err)
