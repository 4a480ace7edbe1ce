"""The lease backlog gauges (api/backlog.py, `LeaseBacklogCollector`): leases waiting on a real Temporal dev server
(with the matcher flags the stack runs) are counted per class, served by the API's /metrics from a background
poll, and dropped, never raised, when Temporal goes away. Temporal's stats are approximate and refreshed every few
seconds, so the tests poll for the figures they expect within a generous deadline."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from google.protobuf.duration_pb2 import Duration
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from temporalio import workflow
from temporalio.api.taskqueue.v1 import TaskQueueStats
from temporalio.client import Client
from temporalio.common import Priority
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from api.app import create_app
from api.backlog import BacklogPoller, by_class
from cli.stack import free_port, matcher_flags, temporal_binary
from monologue.contracts import QueueClass, lease_task_queue
from monologue.metrics import LEASE_BACKLOG, LEASE_BACKLOG_AGE, LeaseBacklogCollector
from monologue.settings import ApiSettings, Settings, TemporalSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE_S = 60.0  # Temporal refreshes a queue's stats every few seconds; a minute is generous
POLL_S = 0.2  # how often a test looks again while it waits for the figures
# Leases per class, one class left empty (it must read 0, not be missing).
WAITING = {QueueClass.LIVE: 1, QueueClass.MOVING: 2, QueueClass.HIGH: 0, QueueClass.NORMAL: 3, QueueClass.LOW: 1}


@dataclass(frozen=True)
class ScheduleLeases:
    task_queue: str
    priority_keys: list[int]


@workflow.defn(sandboxed=False)  # defined in a test module: the sandbox would re-import pytest
class ScheduleLeasesWorkflow:
    """Schedules one activity per priority key on a queue nobody polls, so each waits in its backlog."""

    @workflow.run
    async def run(self, leases: ScheduleLeases) -> None:
        for key in leases.priority_keys:
            workflow.start_activity(
                "hold_node",
                task_queue=leases.task_queue,
                schedule_to_close_timeout=timedelta(minutes=10),
                priority=Priority(priority_key=key),
            )
        await workflow.wait_condition(lambda: False)  # the activities stay scheduled while the test looks


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    environment = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_extra_args=["--log-level", "error", *matcher_flags()]
    )
    yield environment
    await environment.shutdown()


@pytest_asyncio.fixture(loop_scope="module")
async def schedule(env: WorkflowEnvironment) -> AsyncIterator[Callable[[str], Awaitable[None]]]:
    """Schedules WAITING's leases on a lease queue (a worker runs the scheduling workflow; none polls the leases)."""
    workflow_queue = f"schedule-{uuid.uuid4()}"

    async def leases(lease_queue: str) -> None:
        keys = [queue_class.priority_key for queue_class, count in WAITING.items() for _ in range(count)]
        await env.client.start_workflow(
            ScheduleLeasesWorkflow.run,
            ScheduleLeases(lease_queue, keys),
            id=f"schedule-{uuid.uuid4()}",
            task_queue=workflow_queue,
        )

    async with Worker(env.client, task_queue=workflow_queue, workflows=[ScheduleLeasesWorkflow]):
        yield leases


def _expected(samples: Mapping[tuple[str, str], float]) -> bool:
    """Every class's count as scheduled, and an age for every class that has leases waiting."""
    for queue_class, count in WAITING.items():
        age = samples.get((LEASE_BACKLOG_AGE, queue_class.value))
        if samples.get((LEASE_BACKLOG, queue_class.value)) != count or age is None or (age > 0) != (count > 0):
            return False
    return True


def _samples(exposition: str) -> dict[tuple[str, str], float]:
    """(metric, class) → value, from Prometheus' text format as a scrape sees it."""
    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if "class" in sample.labels:
                values[(sample.name, sample.labels["class"])] = sample.value
    return values


async def test_one_poll_counts_the_leases_waiting_in_each_class(
    env: WorkflowEnvironment, schedule: Callable[[str], Awaitable[None]]
) -> None:
    queue = f"leases-{uuid.uuid4()}"
    await schedule(queue)
    poller = BacklogPoller(env.client, task_queue=queue, interval_s=5.0)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(LeaseBacklogCollector(poller.figures))

    deadline = time.monotonic() + DEADLINE_S
    await poller.poll()
    while not _expected(_samples(generate_latest(registry).decode())):
        assert time.monotonic() < deadline, dict(poller.figures())
        await asyncio.sleep(POLL_S)
        await poller.poll()


async def test_the_api_serves_the_backlog_it_polls_in_the_background(
    env: WorkflowEnvironment, schedule: Callable[[str], Awaitable[None]], tmp_path: Path
) -> None:
    """The lifespan wiring: /metrics shows what a background poll found, no request waiting on Temporal."""
    address = env.client.service_client.config.target_host
    settings = Settings(
        home=tmp_path,
        temporal=TemporalSettings(address=address, namespace=env.client.namespace, task_queue=f"q-{uuid.uuid4()}"),
        api=ApiSettings(backlog_interval_s=0.5),
    )
    await schedule(lease_task_queue(settings.temporal.task_queue))
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http,
    ):
        deadline = time.monotonic() + DEADLINE_S
        while True:
            text = (await http.get("/metrics")).text
            if _expected(_samples(text)):
                break
            assert time.monotonic() < deadline, [line for line in text.splitlines() if "lease_backlog" in line]
            await asyncio.sleep(POLL_S)  # the background poll runs on this loop meanwhile


async def test_an_unreachable_temporal_drops_the_figures_after_two_failed_polls_and_raises_nothing() -> None:
    server = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(), dev_server_extra_args=["--log-level", "error"]
    )
    poller = BacklogPoller(server.client, task_queue=f"leases-{uuid.uuid4()}", interval_s=1.0)
    await poller.poll()
    assert poller.figures()[QueueClass.LIVE.value].count == 0  # known: nothing waits
    await server.shutdown()
    await poller.poll()
    assert poller.figures(), "one lost answer is noise: the figures stay"
    await poller.poll()
    assert poller.figures() == {}
    registry = CollectorRegistry()
    registry.register(LeaseBacklogCollector(poller.figures))
    assert registry.get_sample_value(LEASE_BACKLOG, {"class": QueueClass.LIVE.value}) is None


async def test_a_temporal_never_reached_gives_no_figures_and_raises_nothing() -> None:
    client = await Client.connect(f"127.0.0.1:{free_port()}", lazy=True)  # nobody listens there
    poller = BacklogPoller(client, task_queue="monologue-nodes", interval_s=1.0)
    for _ in range(3):
        await poller.poll()
    assert poller.figures() == {}


async def test_a_priority_key_of_no_class_is_labelled_by_its_number() -> None:
    stats = {
        QueueClass.LIVE.priority_key: TaskQueueStats(
            approximate_backlog_count=4, approximate_backlog_age=Duration(seconds=7)
        ),
        7: TaskQueueStats(approximate_backlog_count=2),
    }
    figures = by_class(stats)
    assert figures[QueueClass.LIVE.value].count == 4 and figures[QueueClass.LIVE.value].age_s == 7.0
    assert figures["7"].count == 2
    assert all(
        figures[queue_class.value].count == 0 for queue_class in QueueClass if queue_class is not QueueClass.LIVE
    )


async def test_stop_ends_the_poller_when_a_cancelled_rpc_comes_back_as_an_error() -> None:
    """The Temporal client may turn a cancellation inside an RPC into an ordinary error, which poll() counts as a
    failure: stop() must still end the loop (it hung the API's shutdown)."""
    entered = asyncio.Event()

    class Swallowing(BacklogPoller):
        async def poll(self) -> None:
            entered.set()
            try:
                await asyncio.Event().wait()  # an RPC that answers only when cancelled
            except asyncio.CancelledError:
                self._failed(RuntimeError("call cancelled"))

    poller = Swallowing(None, task_queue="q", interval_s=0.01)  # type: ignore[arg-type]
    poller.start()
    await entered.wait()
    stopping = asyncio.ensure_future(poller.stop())
    done, _ = await asyncio.wait({stopping}, timeout=30)  # a guard: without the fix it never returns
    assert stopping in done, "stop() hung: the loop went on after its cancellation was swallowed"
