"""The node's Temporal workers while it serves, and fresh pollers once Temporal answers again after an outage.

Why: the SDK retries a failed long poll with a backoff that doubles from 0.2 s up to 10 s, fixed in its core (a
client's `RetryConfig` does not reach polls). After Temporal was unreachable for a few seconds (a frontend restart,
a partition), a worker's next poll may come up to 10 s after the server is back, and every session, a live stream's
first, waits that long beyond the outage. So the node watches Temporal itself (`watch_temporal`: a health check every
WATCH_S, every PROBE_S while it does not answer) and, once it answers again after failing, renews the workers whose
tasks are short (`Pollers.renew`): the shared queue's (workflow tasks, short activities) and the node's own pinned
queue's. The fresh workers poll at once; the old ones stop polling and finish what they run (their graceful
shutdown). The workers whose activities last as long as a session (the lease, the sink pumps) and the webhook
worker are never renewed: a shutdown would end what they hold, and their queues are not on a stream's path.

A worker that fails for good (the SDK's fatal error) ends the node (`failed`), as before; a fresh worker that cannot
start (Temporal gone again at once) is dropped and the old ones kept: the next recovery tries again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog
from temporalio.client import Client
from temporalio.worker import Worker

from node.http_port import NodeHealth

WATCH_S = 1.0  # how often a node asks whether Temporal answers
PROBE_S = 0.25  # how often while it does not: a recovery is seen within this
CHECK_TIMEOUT = timedelta(seconds=1)
START_TIMEOUT_S = 10.0  # a fresh worker that has not started polling by then is dropped

log = structlog.get_logger("node")


class Pollers:
    """The node's workers: `steady` run from start to stop; `build(client, generation)` makes the renewable ones, on
    `client` first, made again by `renew` on a client of their own from `connect` (the SDK allows one worker per task
    queue on a client, and the old ones still run). `failed` resolves with the first fatal error of a worker that is
    not being retired."""

    def __init__(
        self,
        client: Client,
        steady: list[Worker],
        build: Callable[[Client, int], list[Worker]],
        connect: Callable[[], Awaitable[Client]],
    ) -> None:
        self._client, self._build, self._connect = client, build, connect
        self.generation = 0
        self._steady = steady
        self._current: list[Worker] = []
        self._retiring: set[asyncio.Task[None]] = set()
        self.failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    @property
    def current(self) -> list[Worker]:
        """The renewable workers of the newest generation."""
        return list(self._current)

    def start(self) -> None:
        """Start every worker (the renewable ones of generation 0); a worker's fatal error resolves `failed`."""
        self._current = self._build(self._client, 0)
        for worker in [*self._steady, *self._current]:
            self._run(worker)

    async def renew(self) -> bool:
        """Start the renewable workers afresh and retire the old ones (they finish what they run); whether the fresh
        ones started (if not, the old ones stay)."""
        fresh = self._build(await self._connect(), self.generation + 1)
        started = [self._run(worker) for worker in fresh]
        if not all([await self._started(worker, run) for worker, run in started]):
            for worker, _ in started:
                self._retire(worker)
            return False
        old, self._current, self.generation = self._current, fresh, self.generation + 1
        for worker in old:
            self._retire(worker)
        return True

    async def stop(self) -> None:
        """Shut every worker down (each finishes what it runs, within its graceful shutdown) and wait for them."""
        for worker in [*self._steady, *self._current]:
            self._retire(worker)
        if self._retiring:
            await asyncio.wait(self._retiring)

    def _run(self, worker: Worker) -> tuple[Worker, asyncio.Task[None]]:
        run = asyncio.create_task(worker.run())
        run.add_done_callback(lambda task: self._ended(worker, task))
        return worker, run

    def _ended(self, worker: Worker, run: asyncio.Task[None]) -> None:
        error = None if run.cancelled() else run.exception()
        if error is None:
            return
        if worker in self._steady or worker in self._current:  # not one retired, nor a fresh one that did not start
            if not self.failed.done():
                self.failed.set_result(error)
        else:
            log.warning("a worker ended with an error", task_queue=worker.task_queue, error=str(error))

    async def _started(self, worker: Worker, run: asyncio.Task[None]) -> bool:
        """Wait until `worker` polls (its start checks the namespace with Temporal) or its run ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + START_TIMEOUT_S
        while not worker.is_running and not run.done() and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return worker.is_running

    def _retire(self, worker: Worker) -> None:
        async def retire() -> None:
            with contextlib.suppress(Exception):  # its run's own error is reported by `_ended`
                await worker.shutdown()

        task = asyncio.create_task(retire())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)


async def watch_temporal(client: Client, health: NodeHealth, pollers: Pollers) -> None:
    """Ask Temporal whether it answers every WATCH_S (PROBE_S while it does not) for /readyz; once it answers after
    failing, renew the pollers."""
    loop = asyncio.get_running_loop()
    down_since: float | None = None
    while True:
        problem = await _problem(client)
        health.temporal_ok = problem is None
        if problem is not None:
            health.problems["temporal"] = problem
            if down_since is None:
                down_since = loop.time()
                log.warning("temporal unreachable", error=problem)
        else:
            health.problems.pop("temporal", None)
            if down_since is not None:
                renewed = await _renewed(pollers)
                log.info(
                    "temporal back: fresh pollers" if renewed else "temporal back: fresh pollers did not start",
                    down_s=round(loop.time() - down_since, 2),
                    generation=pollers.generation,
                )
                down_since = None if renewed else down_since
        await asyncio.sleep(WATCH_S if down_since is None else PROBE_S)


async def _renewed(pollers: Pollers) -> bool:
    try:
        return await pollers.renew()
    except Exception:  # a worker that cannot be made: keep the old ones, and say why
        log.exception("fresh pollers not made")
        return False


async def _problem(client: Client) -> str | None:
    """Why Temporal does not answer a health check now, or None when it does."""
    try:
        if await client.service_client.check_health(timeout=CHECK_TIMEOUT):
            return None
        return "the health check says not serving"
    except Exception as err:  # any failure of the RPC means the same to a probe: not reachable
        return str(err)[:200] or type(err).__name__
