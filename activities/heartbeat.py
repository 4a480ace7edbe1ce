"""Heartbeats of the node's pinned activities: how Temporal tells a working node from a hung one.

A chunk heartbeats from its own progress (each stage as it starts, each denoising step of a diffusion
family: `gpu_worker.pipeline.Progress`), never from a timer. A timer thread would keep beating while a GPU
call hangs, and the session would never leave the node; with progress-driven beats a chunk that stops
advancing stops heartbeating, and the workflow moves the session after the pinned activities' heartbeat
timeout (`NodeSettings.heartbeat_timeout_s`, seconds). That timeout must therefore exceed the longest gap
between two reports: one denoising step, or one whole stage of a family that reports no steps.

The one exception is a **known long step** (`long_step`): a call the node makes on purpose, with no steps to
report, that it knows may outlast the heartbeat timeout and that does not run on the accelerator: building a
family (weights from disk or S3, compiles), loading a session from storage (its inputs, reference and
checkpoints), aligning a transcript. While the block runs, and never past the step's own limit, a helper thread
beats for it, and tells the pipeline slot, so the chunks queued behind it stay alive too. Past the limit the
beats stop, so a load that hangs is still caught by the heartbeat timeout, only later. A chunk's stages never
run inside one: a stuck stage stops the beats within the heartbeat timeout (tests/test_hung_node.py).

Never heartbeat holding a lock that the worker's event loop may take: the SDK hands a sync activity's heartbeat to
that loop and waits for it (up to 10 s), so the two wait on each other (activities/chunk_order.py says what that
did to a healthy node).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import structlog
from temporalio import activity

BEAT_EVERY_S = 1.0  # a long step's beats: the pinned workers let one through a second anyway (node/wiring.py)
# The node's known long steps, and how long each may take (on a loaded machine) before it counts as hung:
FAMILY_LOAD_LIMIT_S = 900.0  # building a family: weights from disk or S3, the dit family's compiles
STORAGE_LOAD_LIMIT_S = 120.0  # a session's inputs and reference, or its checkpoints, from storage
ALIGN_LIMIT_S = 300.0  # a transcript's forced alignment: 2.5 s of CPU per minute of speech, 20 minutes at most

log = structlog.get_logger("node")


def describe(chunk: str, stage: str, step: int = 0, steps: int = 0) -> str:
    """The heartbeat's details (shown in Temporal's UI): `N3 audio_to_video 4/8`."""
    return f"{chunk} {stage} {step}/{steps}" if steps else f"{chunk} {stage}"


class ChunkHeartbeat:
    """A pipeline `Progress` for one chunk (or a session's set-up): each report heartbeats the running
    activity, with the chunk, the stage and the step, and is passed on to `on_report` (the pipeline slot, so
    that chunks queued behind this one know it is alive)."""

    def __init__(self, chunk: str, on_report: Callable[[], None] | None = None) -> None:
        self.chunk = chunk
        self._on_report = on_report

    def __call__(self, stage: str, step: int = 0, steps: int = 0) -> None:
        activity.heartbeat(describe(self.chunk, stage, step, steps))
        if self._on_report is not None:
            self._on_report()

    def long_step(self, stage: str, *, limit_s: float) -> AbstractContextManager[None]:
        """This chunk's `stage` as a known long step (see the module docstring): beating, the slot told of each
        beat, from now until the block ends or `limit_s` passes."""
        return long_step(describe(self.chunk, stage), limit_s=limit_s, on_beat=self._on_report)


@contextmanager
def long_step(details: str, *, limit_s: float, on_beat: Callable[[], None] | None = None) -> Iterator[None]:
    """Mark the block as a known long step: heartbeat `details` from a helper thread every `BEAT_EVERY_S` until
    it ends, or until `limit_s` has passed (then a hung step is caught as any other). Only for the node's loads
    and CPU work with no progress to report (the module docstring); outside an activity (a node warming itself
    before it takes any work) there is nobody to tell, and it beats nothing."""
    if not activity.in_activity():
        yield
        return
    activity.heartbeat(details)
    if on_beat is not None:
        on_beat()
    # The helper thread heartbeats the activity of the thread that started it: give it that context (and the log
    # fields bound to it).
    context = contextvars.copy_context()
    done = threading.Event()

    def beat() -> None:
        deadline = time.monotonic() + limit_s
        while not done.wait(BEAT_EVERY_S):
            if time.monotonic() >= deadline:
                log.warning(
                    "a known long step overran its limit: no more heartbeats for it", step=details, limit_s=limit_s
                )
                return
            _beat(details)
            if on_beat is not None:
                on_beat()

    helper = threading.Thread(target=context.run, args=(beat,), name="long-step", daemon=True)
    helper.start()
    try:
        yield
    finally:
        done.set()
        helper.join()


def _beat(details: str) -> None:
    """One heartbeat from a helper thread. The SDK hands a sync activity's heartbeat to the worker's event loop and
    waits up to 10 s for it: a loop that busy says so in the log, and the helper keeps going (the heartbeat timeout
    decides what that stall means, not this thread)."""
    try:
        activity.heartbeat(details)
    except TimeoutError:
        log.warning("the node's event loop took no heartbeat for 10 s", step=details)
