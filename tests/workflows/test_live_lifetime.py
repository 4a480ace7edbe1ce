"""A live session's lifetime, enforced by RenderWorkflow itself (so a session whose API is gone cannot hold its
node forever): against a real Temporal dev server with the fake activities of test_render_workflow."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from monologue import contracts as c
from monologue.plan import AUDIO_RATE, frame_count
from tests.workflows.test_render_workflow import FakeNodes, orchestration
from workflows.render import RenderWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="module")
OPTIONS = c.RenderOptions(chunk_frames=10, first_chunk_frames=10, i_frames=2)  # a chunk per 0.4 s of audio
PIECE = AUDIO_RATE // 5  # the audio "API" stores 0.2 s every 0.2 s


@asynccontextmanager
async def workers(fake: FakeNodes) -> AsyncIterator[None]:
    """The shared queue (with the workflow), the lease queue and one node's queue, as FakeNodes.run has them."""
    node_id = f"n-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(4) as executor:
        async with AsyncExitStack() as stack:
            for queue, activities, workflows in (
                (fake.queue, fake.shared(), [RenderWorkflow]),
                (c.lease_task_queue(fake.queue), fake.lease(node_id), []),
                (c.node_task_queue(node_id), fake.node(node_id), []),
            ):
                worker = Worker(
                    fake.env.client,
                    task_queue=queue,
                    workflows=workflows,
                    activities=activities,
                    activity_executor=executor,
                    workflow_failure_exception_types=[Exception],
                )
                await stack.enter_async_context(worker)
            yield


async def _feed_audio(handle: WorkflowHandle[RenderWorkflow, c.RenderResult]) -> int:
    """Signal ever more stored audio, never `ended`, until the workflow closes; returns the samples sent."""
    samples = 0
    result = asyncio.ensure_future(handle.result())
    while not result.done():
        samples += PIECE
        try:
            await handle.signal(c.AUDIO_AVAILABLE, c.AudioAvailable(samples=samples))
        except RPCError:  # it closed between the check and the signal: as the API's late signal would find it
            break
        await asyncio.wait([result], timeout=0.2)
    await asyncio.wait([result])
    return samples


@pytest.mark.parametrize("continue_as_new_every", [500, 2], ids=["one-run", "continued-as-new"])
async def test_a_live_session_ends_at_its_lifetime_although_audio_keeps_coming(
    env: WorkflowEnvironment, continue_as_new_every: int
) -> None:
    """Audio keeps arriving, no `end` comes and the idle timeout is far away: only the lifetime (3 s, counted
    from the first run's start across continue-as-new) can end the session, which then completes with the
    audio it had."""
    fake = FakeNodes(env, frames=0)
    request = c.RenderInput(
        session_id="s",
        kind=c.SessionKind.LIVE,
        options=OPTIONS,
        orchestration=orchestration(idle_timeout_s=600.0, max_live_s=3.0, continue_as_new_every=continue_as_new_every),
    )
    async with workers(fake):
        handle = await env.client.start_workflow(
            RenderWorkflow.run, request, id=f"wf-{uuid.uuid4().hex}", task_queue=fake.queue
        )
        sent = await asyncio.wait_for(_feed_audio(handle), timeout=60)
        result = await handle.result()
    assert fake.ended is None  # completed, not failed or cancelled
    assert fake.calls[-1] == f"finalize {result.frames}"
    assert 0 < result.frames <= frame_count(sent, rate=AUDIO_RATE, fps=OPTIONS.fps)
    assert max(_end_frame(call) for call in fake.calls if call[0] in "NI") == result.frames  # the plan was closed


def _end_frame(chunk_call: str) -> int:
    """The end of a generated chunk from its call record, e.g. "N3 30+10" → 40."""
    first, n_frames = chunk_call.split()[1].split("+")
    return int(first) + int(n_frames)


async def test_a_live_session_without_a_lifetime_keeps_taking_audio(env: WorkflowEnvironment) -> None:
    """max_live_s 0 (sessions started before lifetimes existed): audio after 3 s still counts, until `end`."""
    fake = FakeNodes(env, frames=0)
    request = c.RenderInput(
        session_id="s",
        kind=c.SessionKind.LIVE,
        options=OPTIONS,
        orchestration=orchestration(idle_timeout_s=600.0, max_live_s=0.0),
    )
    async with workers(fake):
        handle = await env.client.start_workflow(
            RenderWorkflow.run, request, id=f"wf-{uuid.uuid4().hex}", task_queue=fake.queue
        )
        sent = 0
        for _ in range(20):  # 4 s of audio over 4 s
            sent += PIECE
            await handle.signal(c.AUDIO_AVAILABLE, c.AudioAvailable(samples=sent))
            await asyncio.sleep(0.2)
        await handle.signal(c.AUDIO_AVAILABLE, c.AudioAvailable(samples=sent, ended=True))
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.frames == frame_count(sent, rate=AUDIO_RATE, fps=OPTIONS.fps) == 100
