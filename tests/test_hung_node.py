"""A node whose chunk hangs loses its session to another node within seconds, with the same frames.

A hung GPU call makes no progress, so the chunk stops heartbeating (nodes heartbeat from the pipeline's
progress, never from a timer) while the node itself stays alive and keeps its lease. The testing-only setting
`node.hang_chunk` makes one node's N1 hang exactly so; the pinned activities' heartbeat timeout
(`node.heartbeat_timeout_s`) is what notices it. A separate stack: the hanging node holds the session first,
then a healthy node joins and must finish it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueType, TimeoutType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from cli.stack import Stack, free_port
from monologue import contracts as c
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from tests.helpers import get, node_of, register_api, submit, wait_done

pytestmark = pytest.mark.slow
HUNG, SPARE = "node-hung", "node-spare"
HEARTBEAT_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def hung_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("hung"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(
            id=HUNG,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            lease_timeout_s=3.0,
            graceful_shutdown_s=5.0,
            hang_chunk="N1",
        ),
    )
    stack = Stack(settings)
    stack.start()  # the hanging node only, so it is the one that takes the session
    register_api(stack)
    yield stack
    stack.stop()


def _wait_for(url: str, session_id: str, condition: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        render: dict[str, Any] = get(f"{url}/v1/renders/{session_id}", timeout=10).json()
        render["node_id"] = node_of(url, session_id)  # the operator's view: tenants' answers do not name nodes
        if condition(render):
            return render
        time.sleep(0.05)
    raise TimeoutError(f"render {session_id} never reached the condition within {timeout_s} s")


def _hashes(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    manifest = Path(root) / "sessions" / session_id / "out" / "frames.jsonl"
    return [json.loads(line)["sha256"] for line in manifest.read_text().splitlines()]


async def activity_pollers(client: Client, queue: str) -> int:
    """Workers polling `queue` for activities now (a node polls its queues only once it is warm)."""
    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return len(response.pollers)


async def heartbeat_timeouts_and_moves(stack: Stack, session_id: str) -> tuple[list[str], int]:
    """From Temporal: the activities that timed out on their heartbeat, and the workflow's count of node moves."""
    client = await Client.connect(stack.settings.temporal.address)
    handle = client.get_workflow_handle(c.render_workflow_id(session_id))
    scheduled: dict[int, str] = {}
    timed_out: list[str] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
            attributes = event.activity_task_timed_out_event_attributes
            if attributes.failure.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT:
                timed_out.append(scheduled[attributes.scheduled_event_id])
    progress = await handle.query("progress", result_type=c.Progress)
    return timed_out, progress.node_changes


async def test_a_hung_chunk_moves_its_session_to_another_node_with_identical_frames(
    hung_stack: Stack, stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(hung_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech).json()["id"]
    _wait_for(url, session_id, lambda r: r["node_id"] == HUNG, timeout_s=60)
    # A healthy node joins while the session is on the hanging one (its N0 runs, then N1 hangs there).
    hung_stack.settings = hung_stack.settings.model_copy(
        update={"node": hung_stack.settings.node.model_copy(update={"hang_chunk": ""})}
    )
    hung_stack.start_node(SPARE)
    _wait_for(url, session_id, lambda r: r["progress"]["chunks_done"] >= 1, timeout_s=60)  # N1 is hanging
    # The spare takes work once it has started and warmed (it polls nothing before: node/warm.py).
    client = await Client.connect(hung_stack.settings.temporal.address)
    deadline = time.monotonic() + 60
    while await activity_pollers(client, c.node_task_queue(SPARE)) == 0:
        assert time.monotonic() < deadline, "the spare node never polled"
        await asyncio.sleep(0.1)
    # The heartbeat timeout plus a few seconds (generously): a heartbeat timeout moves the session at once; it
    # is not retried on the hung node, where a retry finds no free slot or a pipeline that never frees.
    moved = _wait_for(url, session_id, lambda r: r["node_id"] == SPARE, timeout_s=HEARTBEAT_TIMEOUT_S + 8)
    assert moved["status"] == "running"
    render = wait_done(url, session_id, timeout_s=120)
    assert render["status"] == "completed", render["error"]
    assert node_of(url, session_id) == SPARE
    timed_out, node_changes = await heartbeat_timeouts_and_moves(hung_stack, session_id)
    assert c.GENERATE_CHUNK in timed_out and node_changes >= 1
    # The frames of an uninterrupted render of the same inputs (the default stack's).
    api = str(stack.settings.api.public_url)
    baseline = wait_done(api, submit(api, sample_portrait, sample_speech).json()["id"])
    assert baseline["status"] == "completed"
    assert _hashes(hung_stack, session_id) == _hashes(stack, baseline["id"])
