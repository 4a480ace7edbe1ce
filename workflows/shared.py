"""What every part of RenderWorkflow uses to call activities: the retry policy, and calls on the shared queue.

Workflow code: standard library, temporalio and the stdlib-only contracts only."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c

Result = TypeVar("Result")

# Bad input is marked non-retryable by the activities themselves; everything else retries with backoff: attempts
# at most 1 s apart for about 14 s (0.5, 0.75, then 1 s), so a database or Temporal back from an outage is used
# again within a second, and an outage up to about 14 s costs no session (README, "When a service beneath fails").
RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=0.5),
    backoff_coefficient=1.5,
    maximum_interval=timedelta(seconds=1),
    maximum_attempts=16,
    non_retryable_error_types=[c.NODE_DRAINING, c.CHECKPOINT_LOST],
)


# A shared activity runs on whichever node polls first and does not heartbeat, so a node killed under it is noticed
# only at its start_to_close timeout, and the workflow waits that long. The ones that are a database transaction or
# two (record a status or a yield, ask a render to yield, read the stored audio, queue the webhooks, publish the
# playlist) get a short one: the contention bench saw sessions wait the 5 minutes once a kill landed on one, and a
# render wait 53 s for its last publish, then timed out at 1 minute (docs/benchmarks.md, issue 27).
SHORT = timedelta(seconds=15)
LONG = timedelta(minutes=5)  # prepare: decoding and checking the uploads can take a while


def start_shared(
    name: str, arg: Any, result_type: type[Result], timeout: timedelta = LONG
) -> workflow.ActivityHandle[Result]:
    """An activity on the shared queue (any node may run it), retried elsewhere after `timeout` on a dead node."""
    return workflow.start_activity(
        name, arg, result_type=result_type, start_to_close_timeout=timeout, retry_policy=RETRY
    )


async def run_shared(name: str, arg: Any, result_type: type[Result], timeout: timedelta = LONG) -> Result:
    """`start_shared`, awaited."""
    return await start_shared(name, arg, result_type, timeout)


def abandon(handle: asyncio.Future[Any]) -> None:
    """Cancel an activity nobody will await, and take its outcome whenever it comes (a failure or the cancellation
    itself): otherwise asyncio logs "exception was never retrieved", an error line about nothing wrong."""
    if not handle.done():
        handle.cancel()
    handle.add_done_callback(_retrieve)


def _retrieve(handle: asyncio.Future[Any]) -> None:
    if not handle.cancelled():
        handle.exception()
