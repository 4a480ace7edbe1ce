"""Fresh pollers after Temporal was unreachable (node/pollers.py), on a real dev server killed and started again on
its database file: the node sees the outage and the return, renews its short-task workers (the fresh ones poll under
their own identity, the old ones stop), and an activity that was running on an old worker through it all finishes
there, once (no retry), its result delivered."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from cli.stack import free_port, temporal_binary
from monologue.settings import TemporalSettings
from monologue.temporal_client import connect
from node.http_port import NodeHealth
from node.pollers import Pollers, watch_temporal

pytestmark = pytest.mark.timeout(180)
QUEUE = "pollers-test"
started, released = threading.Event(), threading.Event()  # the long activity runs; it may finish


@activity.defn
def long_step() -> int:
    """Runs until the test lets it finish; returns its attempt (1: it was never retried)."""
    started.set()
    while not released.wait(0.1):
        activity.heartbeat()
    return activity.info().attempt


@activity.defn
def short_step() -> str:
    return "done"


@workflow.defn
class LongWorkflow:
    @workflow.run
    async def run(self) -> int:
        return await workflow.execute_activity(
            long_step, start_to_close_timeout=timedelta(minutes=2), heartbeat_timeout=timedelta(seconds=60)
        )


@workflow.defn
class ShortWorkflow:
    @workflow.run
    async def run(self) -> str:
        return await workflow.execute_activity(short_step, start_to_close_timeout=timedelta(seconds=30))


class DevServer:
    """`temporal server start-dev` on a database file, which may be killed and started again on it."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._command = [
            *(temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self.port)),
            *("--headless", "--log-level", "error", "--db-filename", str(folder / "temporal.db")),
        ]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait(20)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DevServer]:
    running = DevServer(tmp_path)
    running.start()
    try:
        yield running
    finally:
        running.kill()


async def _until(check: Callable[[], object], timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "gave up waiting"
        await asyncio.sleep(0.05)


async def _client(address: str) -> Client:
    for _ in range(300):
        try:
            return await connect(TemporalSettings(address=address))
        except ConnectionError:
            await asyncio.sleep(0.2)
    raise AssertionError(f"Temporal never answered at {address}")


async def test_a_node_renews_its_pollers_when_temporal_returns_and_finishes_what_it_ran(server: DevServer) -> None:
    released.clear()
    started.clear()
    client = await _client(server.address)
    executor = ThreadPoolExecutor(max_workers=4)

    def build(on: Client, generation: int) -> list[Worker]:
        return [
            Worker(
                on,
                task_queue=QUEUE,
                identity=f"{client.identity}#{generation}",
                workflows=[LongWorkflow, ShortWorkflow],
                activities=[long_step, short_step],
                activity_executor=executor,
                graceful_shutdown_timeout=timedelta(seconds=60),  # as a node's: what runs may finish
                workflow_runner=UnsandboxedWorkflowRunner(),  # this module's workflows import what a test imports
            )
        ]

    pollers = Pollers(client, [], build, lambda: _client(server.address))
    health = NodeHealth(capacity=1)
    pollers.start()
    (first,) = pollers.current
    watching = asyncio.create_task(watch_temporal(client, health, pollers))
    try:
        running = await client.start_workflow(LongWorkflow.run, id="long", task_queue=QUEUE)
        await _until(started.is_set)
        await _until(lambda: health.temporal_ok)

        server.kill()
        await _until(lambda: not health.temporal_ok)
        assert pollers.generation == 0
        server.start()
        await _until(lambda: pollers.generation == 1, 120)
        assert health.temporal_ok and pollers.current != [first]

        await _until_polling(client, f"{client.identity}#1")
        assert await client.execute_workflow(ShortWorkflow.run, id="short", task_queue=QUEUE) == "done"
        assert not first.is_shutdown  # retired, it still runs the activity it took before the outage

        released.set()
        assert await running.result() == 1  # that activity finished on the old worker: never retried
        await _until(lambda: first.is_shutdown)  # and then the old worker stopped
    finally:
        released.set()
        watching.cancel()
        await pollers.stop()
        executor.shutdown()


async def _until_polling(client: Client, identity: str) -> None:
    """Until Temporal lists a poller of `identity` on the test's queue (a fresh worker's first poll)."""
    for _ in range(600):
        answer = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=QUEUE),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        if identity in {poller.identity for poller in answer.pollers}:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"no poller {identity} on {QUEUE}")
