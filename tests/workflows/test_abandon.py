"""An activity the workflow abandons (chunks dropped at a node change, a released lease, a sink pump left behind)
has its outcome taken when it comes (`workflows.shared.abandon`): asyncio would otherwise log "exception was never
retrieved" at error level for each, false errors in every node change's logs (issue 28, item 8)."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from workflows.shared import abandon


class Handle(asyncio.Future[Any]):
    """Like Temporal's ActivityHandle: cancel() asks the server; the outcome comes later (often a failure)."""

    def cancel(self, msg: Any = None) -> bool:
        self.cancel_requested = True
        return True


def _unretrieved_reports(drop: bool) -> list[str]:
    loop = asyncio.new_event_loop()
    reports: list[str] = []
    loop.set_exception_handler(lambda _, context: reports.append(str(context.get("message"))))
    try:
        failing, done = Handle(loop=loop), Handle(loop=loop)
        done.set_exception(RuntimeError("the lease had ended before it was released"))
        if drop:
            abandon(failing)
            abandon(done)
            assert failing.cancel_requested and not hasattr(done, "cancel_requested")
        failing.set_exception(RuntimeError("the activity failed after it was abandoned"))
        loop.run_until_complete(asyncio.sleep(0))  # the done callbacks run
        del failing, done
        gc.collect()
    finally:
        loop.close()
    return reports


def test_an_abandoned_activitys_failure_is_taken_not_logged() -> None:
    assert _unretrieved_reports(drop=False) == ["Handle exception was never retrieved"] * 2  # what it guards against
    assert _unretrieved_reports(drop=True) == []
