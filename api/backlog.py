"""The lease queue's backlog by class, for the node autoscaler: asked of Temporal (DescribeTaskQueue with its stats
by priority key) in a background task every `api.backlog_interval_s`, and served from the last answer by
`/metrics` (`monologue.metrics.LeaseBacklogCollector`). A request, a scrape included, must never wait on Temporal
here; and a Temporal that does not answer must never take the API down nor leave an old figure on show: after
`MAX_FAILURES` failed polls in a row the figures are dropped, so the autoscaler sees "unknown" and holds."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from datetime import timedelta

import structlog
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue, TaskQueueStats
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from monologue.contracts import QueueClass, lease_task_queue
from monologue.metrics import QueueBacklog
from monologue.settings import Settings

log = structlog.get_logger("api.backlog")

MAX_FAILURES = 2  # one lost answer is noise; two in a row (10 s at the default interval) is an outage
CLASS_OF_KEY = {queue_class.priority_key: queue_class for queue_class in QueueClass}


def by_class(stats: Mapping[int, TaskQueueStats]) -> dict[str, QueueBacklog]:
    """Figures by class label from Temporal's stats by priority key. Every class gets a figure (0 when Temporal
    lists no task of its key), so "nothing waits" reads as 0, not as a missing series. A key that is no
    QueueClass's (only a server configured with more priority levels could report one) keeps its number as its
    label rather than being folded into a neighbour: it shows up instead of silently moving a class's figure."""
    figures = {queue_class.value: QueueBacklog(count=0, age_s=0.0) for queue_class in QueueClass}
    for key, stat in sorted(stats.items()):
        label = CLASS_OF_KEY[key].value if key in CLASS_OF_KEY else str(key)
        figures[label] = QueueBacklog(
            count=stat.approximate_backlog_count, age_s=stat.approximate_backlog_age.ToTimedelta().total_seconds()
        )
    return figures


class BacklogPoller:
    """Polls one task queue's backlog and keeps the last figures (`figures()`, for the collector)."""

    def __init__(self, client: Client, *, task_queue: str, interval_s: float) -> None:
        self._client, self._task_queue, self._interval_s = client, task_queue, interval_s
        self._figures: dict[str, QueueBacklog] = {}
        self._failures = 0
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @classmethod
    def for_settings(cls, client: Client, settings: Settings) -> BacklogPoller:
        """The poller of this deployment's lease queue."""
        queue = lease_task_queue(settings.temporal.task_queue)
        return cls(client, task_queue=queue, interval_s=settings.api.backlog_interval_s)

    def figures(self) -> Mapping[str, QueueBacklog]:
        return self._figures

    async def poll(self) -> None:
        """Ask Temporal once and keep the answer; on failure count it, and drop the figures after MAX_FAILURES.
        Never raises (but for cancellation): what goes wrong is logged once per outage."""
        try:
            # Bounded by the interval on both sides: the RPC's own deadline, and wait_for for a connect that hangs.
            timeout_s = self._interval_s
            figures = by_class(await asyncio.wait_for(self._stats(timedelta(seconds=timeout_s)), timeout_s + 1))
        except Exception as err:  # any RPC failure, a lazy client's failed connect, a timeout: Temporal is away
            self._failed(err)
            return
        if self._failures >= MAX_FAILURES:
            log.info("lease backlog known again", task_queue=self._task_queue)
        self._failures, self._figures = 0, figures

    async def _stats(self, timeout: timedelta) -> Mapping[int, TaskQueueStats]:
        request = DescribeTaskQueueRequest(
            namespace=self._client.namespace,
            task_queue=TaskQueue(name=self._task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            report_stats=True,
        )
        response = await self._client.workflow_service.describe_task_queue(request, timeout=timeout)
        if response.stats_by_priority_key:
            return dict(response.stats_by_priority_key)
        # A server that does not split its stats by key ignores priorities: every task waits at the default key.
        return {QueueClass.NORMAL.priority_key: response.stats}

    def _failed(self, err: Exception) -> None:
        self._failures += 1
        if self._failures == MAX_FAILURES:
            self._figures = {}
            log.warning(
                "lease backlog unknown: Temporal does not answer; its figures are dropped from /metrics",
                task_queue=self._task_queue,
                error=str(err).strip().split("\n")[0][:300] or type(err).__name__,
            )

    async def _run(self) -> None:
        # Not `while True`: the Temporal client may turn a cancellation that lands in an RPC (or a lazy client's
        # connect) into an ordinary error, which poll() counts as a failure, so the loop must also see the flag; a
        # stop() during an RPC hung the API's shutdown (a test's TestClient waited past its 120 s).
        while not self._stopping:
            await self.poll()
            if not self._stopping:
                await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        """Poll in the background until `stop()` (the API's lifespan)."""
        self._task = asyncio.create_task(self._run(), name="lease-backlog")

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
