"""A node warms before it takes work: readiness means warm.

Before any of its workers polls (so before it can take a lease), the node builds each family of
`NodeSettings.warm_families` and runs one throwaway session through it (activities/warm_up.py); only then do its
workers start and `/readyz` answer ready. A first session then meets a node that has nothing left to load, instead
of paying the family's first use under its chunks' heartbeat timeout.

Bounded and said: one log line with what it took, and a warm-up that fails or overruns
`NodeSettings.warm_up_timeout_s` stops the node with the reason (an accelerator or a disk that slow is broken, and
a restart is the cure; a family that cannot run one chunk would fail every session of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

import structlog

from activities.pipelines import Pipelines
from activities.warm_up import Warmed, warm_family
from monologue.settings import NodeSettings
from node.http_port import NodeHealth

log = structlog.get_logger("node")


async def warm(node: NodeSettings, pipelines: Pipelines, health: NodeHealth) -> None:
    """Warm `node.warm_families` on a thread of their own, then mark the node warm; SystemExit if that fails or
    overruns its timeout."""
    started = time.perf_counter()
    try:
        warmed = await asyncio.wait_for(
            _in_daemon_thread(lambda: [warm_family(pipelines, family) for family in node.warm_families]),
            timeout=node.warm_up_timeout_s,
        )
    except TimeoutError:
        log.error("warm-up overran; node not started", node_id=node.id, timeout_s=node.warm_up_timeout_s)
        raise SystemExit(f"node not started: warm-up took over {node.warm_up_timeout_s} s") from None
    except Exception as exc:  # whatever a family's first session raises: the node must not take sessions of it
        log.error("warm-up failed; node not started", node_id=node.id, error=repr(exc))
        raise SystemExit(f"node not started: warm-up failed: {exc!r}") from exc
    health.warm = True
    log.info(
        "node warm",
        node_id=node.id,
        ms=round((time.perf_counter() - started) * 1000),
        families={item.family.value: _figures(item) for item in warmed},
    )


def _figures(item: Warmed) -> dict[str, int]:
    return {"build_ms": round(item.build_ms), "session_ms": round(item.session_ms)}


def _in_daemon_thread(work: Callable[[], list[Warmed]]) -> asyncio.Future[list[Warmed]]:
    """`work` on a daemon thread of its own (not the loop's executor, whose threads the interpreter waits for at
    exit: a warm-up that hangs must not keep a stopping node alive); its outcome as a future of this loop."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[list[Warmed]] = loop.create_future()

    def settle(result: list[Warmed] | None, error: BaseException | None) -> None:
        if outcome.done():  # the wait timed out and cancelled it
            return
        if error is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(result or [])

    def run() -> None:
        result: list[Warmed] | None = None
        error: BaseException | None = None
        try:
            result = work()
        except BaseException as exc:  # handed to the waiting loop, which decides
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is gone: the node stopped without waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="warm-up", daemon=True).start()
    return outcome
