"""Heartbeats of the node's pinned activities: how Temporal tells a working node from a hung one.

A chunk heartbeats from its own progress (each stage as it starts, each denoising step of a diffusion
family: `gpu_worker.pipeline.Progress`), never from a timer. A timer thread would keep beating while a GPU
call hangs, and the session would never leave the node; with progress-driven beats a chunk that stops
advancing stops heartbeating, and the workflow moves the session after the pinned activities' heartbeat
timeout (`NodeSettings.heartbeat_timeout_s`, seconds). That timeout must therefore exceed the longest gap
between two reports: one denoising step, or one whole stage of a family that reports no steps.

The one exception is `beating`: a helper thread for a call that has no steps to report and does not run on
the accelerator (loading a family's weights from disk), bounded by the activity's start-to-close timeout.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from temporalio import activity


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


@contextmanager
def beating(details: str, every_s: float = 1.0) -> Iterator[None]:
    """Heartbeat from a helper thread while the block runs. Only for calls with no progress to report that
    cannot hang the accelerator (see the module docstring): anything else reports its progress instead."""
    activity.heartbeat(details)
    # The helper thread heartbeats the activity of the thread that started it: give it that context.
    context = contextvars.copy_context()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            context.run(activity.heartbeat, details)

    helper = threading.Thread(target=beat, name="heartbeat", daemon=True)
    helper.start()
    try:
        yield
    finally:
        done.set()
        helper.join()
