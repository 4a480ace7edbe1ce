"""A node warms before it takes work, and a load it knows is long keeps a session on its node.

- Readiness means warm: until its warm-up is done a node polls no queue, so it takes no lease, and /readyz says
  not ready; once warm, both change. A node in this process whose warm-up waits for the test to let it go.
- A session whose load from storage stalls for longer than the heartbeat timeout (the testing-only setting
  `node.session_load_delay_s`: a slow read, silent) stays on its node: the load is a known long step, which
  heartbeats for it. A hung chunk, in no such step, still moves (tests/test_hung_node.py).
States are awaited with deadlines, never guessed with sleeps: the machine may be slow.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client

from activities.node import NodeActivities
from activities.pipelines import node_pipeline
from cli.stack import Stack, free_port
from gpu_worker.pipeline import Pipeline
from monologue import contracts as c
from monologue.db import migrate
from monologue.settings import ApiSettings, NodeSettings, Settings, TemporalSettings
from node.worker import run_node
from tests.helpers import node_of, register_api, submit, wait_done
from tests.test_hung_node import activity_pollers, heartbeat_timeouts_and_moves

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
NODE = "node-slow-load"
HEARTBEAT_TIMEOUT_S = 3.0
LOAD_DELAY_S = 2 * HEARTBEAT_TIMEOUT_S  # the session's load stalls two heartbeat timeouts long
OPTIONS = {"resolution": "512", "preview": "true", "chunk_frames": "16", "i_frames": "4"}
DEADLINE_S = 120.0  # what any awaited state may take on a loaded machine


@pytest.fixture(scope="module")
def slow_load_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("slow-load"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(
            id=NODE,
            heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S,
            lease_timeout_s=3.0,
            graceful_shutdown_s=5.0,
            session_load_delay_s=LOAD_DELAY_S,
        ),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


async def test_a_session_whose_load_stalls_inside_a_known_long_step_stays_on_its_node(
    slow_load_stack: Stack, sample_portrait: bytes, sample_speech: bytes
) -> None:
    url = str(slow_load_stack.settings.api.public_url)
    session_id = submit(url, sample_portrait, sample_speech, **OPTIONS).json()["id"]
    render = await asyncio.to_thread(wait_done, url, session_id, DEADLINE_S)
    assert render["status"] == "completed", render["error"]
    log = (slow_load_stack.log_dir / f"node-{NODE}.log").read_text()
    assert "loading the session slowly on purpose" in log  # the stall happened
    timed_out, node_changes = await heartbeat_timeouts_and_moves(slow_load_stack, session_id)
    assert (timed_out, node_changes) == ([], 0)
    assert node_of(url, session_id) == NODE


async def test_a_node_takes_no_lease_and_is_not_ready_until_it_is_warm(slow_load_stack: Stack, tmp_path: Path) -> None:
    """The warm-up's build of the warp family waits for the test: meanwhile no queue of the node has a poller and
    /readyz answers 503 with `warm` false; once it is let go, the node becomes ready and polls the lease queue."""
    building, release = threading.Event(), threading.Event()

    def held_build(family: c.Family) -> Pipeline:
        building.set()
        if not release.wait(timeout=DEADLINE_S):
            raise RuntimeError("the test never let the warm-up go")
        return node_pipeline(family)

    port = free_port()
    queue = "warm-test"
    temporal = TemporalSettings(address=slow_load_stack.settings.temporal.address, task_queue=queue)
    settings = Settings(
        home=tmp_path, log_format="json", temporal=temporal, node=NodeSettings(id="warm-test-node", http_port=port)
    )
    migrate(settings.db_url)
    stop = asyncio.Event()
    node = asyncio.create_task(
        run_node(
            settings,
            stop=stop,
            handle_signals=False,
            node_activities=partial(NodeActivities, pipeline_factory=held_build),
        )
    )
    client = await Client.connect(temporal.address)
    queues = [queue, c.lease_task_queue(queue), c.node_task_queue("warm-test-node")]
    readyz = f"http://127.0.0.1:{port}/readyz"
    try:
        await _until(building.is_set, "the warm-up to start building")
        status, body = await _until_answered(readyz)
        assert status == 503 and body["warm"] is False and body["checks"]["polling"] is False, body
        assert [await activity_pollers(client, name) for name in queues] == [0, 0, 0]
        release.set()
        status, body = await _until_answered(readyz, lambda status, _: status == 200)
        assert body["warm"] is True and body["checks"]["polling"] is True, body
        # Its workers run once it is ready; Temporal lists a poller once the first poll has reached it.
        await _until_polled(client, c.lease_task_queue(queue))
    finally:
        release.set()
        stop.set()
        await node


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {DEADLINE_S} s for {what}")
        await asyncio.sleep(0.05)


async def _until_polled(client: Client, task_queue: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while await activity_pollers(client, task_queue) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {DEADLINE_S} s for a poller of {task_queue}")
        await asyncio.sleep(0.1)


async def _until_answered(
    url: str, accept: Callable[[int, dict[str, Any]], bool] = lambda status, body: True
) -> tuple[int, dict[str, Any]]:
    """The first answer of `url` that `accept` takes (the port opens once the node has connected)."""
    deadline = time.monotonic() + DEADLINE_S
    async with httpx.AsyncClient(timeout=5) as http:
        while time.monotonic() < deadline:
            try:
                response = await http.get(url)
            except httpx.TransportError:
                response = None
            if response is not None and accept(response.status_code, response.json()):
                return response.status_code, response.json()
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} gave no accepted answer within {DEADLINE_S} s")
