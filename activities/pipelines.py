"""The node's pipelines, one per model family, each built (and its weights loaded) on first use, and the
slot that lets one chunk at a time through each.

A family's modules reuse buffers and a session's anchors change as chunks run, so one chunk at a time goes
through a pipeline (rendering is compute-bound: threads would not speed it up anyway). The other chunks wait
for the slot; they heartbeat only while the chunk holding it reports progress, so a hung chunk does not
keep the chunks queued behind it looking alive: they time out with it and their sessions move too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial

from temporalio import activity
from temporalio.exceptions import CancelledError

from activities.heartbeat import FAMILY_LOAD_LIMIT_S, long_step
from gpu_worker.models import build_family
from gpu_worker.pipeline import Pipeline
from monologue.contracts import Family
from monologue.settings import get_settings

WAIT_POLL_S = 0.2  # how often a waiting chunk looks for a cancellation


def node_pipeline(family: Family) -> Pipeline:
    """A one-process node's pipeline for `family`, its models resident on the GPU or switched in per stage
    as the node's `residency` setting says (MONOLOGUE_NODE__RESIDENCY)."""
    return Pipeline(build_family(family), residency=get_settings().node.residency)


class PipelineSlot:
    """One chunk at a time through a family's pipeline; what waits for it heartbeats with the holder's life."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._holder: str | None = None
        self._reports = 0  # the holder's progress reports, counted: a waiter beats when the count moves

    def touch(self) -> None:
        """The holder made progress (called from its heartbeat)."""
        with self._changed:
            self._reports += 1
            self._changed.notify_all()

    @contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """Wait for the slot (heartbeating while its holder advances), hold it for the block. Heartbeats are sent
        outside the lock: one waits for the worker's event loop, and nothing may wait on that holding a lock
        (activities/chunk_order.py says what that did)."""
        seen = -1
        while True:
            with self._changed:
                self._changed.wait_for(partial(self._free_or_advanced, seen), timeout=WAIT_POLL_S)
                if self._holder is None:
                    self._holder = name
                    break
                holder, reports = self._holder, self._reports
            if reports != seen:
                seen = reports
                activity.heartbeat(f"{name}: waiting for {holder}")
            if activity.is_cancelled():
                raise CancelledError(f"{name} cancelled while waiting for {holder}")
        try:
            yield
        finally:
            with self._changed:
                self._holder = None
                self._changed.notify_all()

    def _free_or_advanced(self, seen: int) -> bool:
        """(Holding the lock.) The slot is free, or its holder has reported since the waiter last looked."""
        return self._holder is None or self._reports != seen


class Pipelines:
    """Each family's pipeline and slot. `factory` builds a family's pipeline (a multi-GPU node's runs on every
    rank)."""

    def __init__(self, factory: Callable[[Family], Pipeline]) -> None:
        self._factory = factory
        self._building = threading.Lock()  # one family's weights load at a time
        self._pipelines: dict[Family, Pipeline] = {}
        self._slots: dict[Family, PipelineSlot] = {}

    def get(self, family: Family) -> Pipeline:
        """The family's pipeline, built on first use (a node builds the families it warms before it takes a
        session: node/warm.py). Building is one long call with no steps to report, a known long step: a helper
        thread heartbeats meanwhile (for the chunks that wait for it, too)."""
        built = self._pipelines.get(family)
        if built is not None:
            return built
        with long_step(f"loading the {family} family", limit_s=FAMILY_LOAD_LIMIT_S), self._building:
            if family not in self._pipelines:
                self._pipelines[family] = self._factory(family)
                self._slots[family] = PipelineSlot()
            return self._pipelines[family]

    def slot(self, family: Family) -> PipelineSlot:
        self.get(family)
        return self._slots[family]
