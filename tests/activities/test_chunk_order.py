"""Chunks waiting on a node (their turn, or the family's pipeline) heartbeat without holding the locks they wait
on. The SDK hands a sync activity's heartbeat to the worker's event loop and waits for it, and that loop reads
`ChunkOrder.chunks_done` (the node registry) under the order's lock: a chunk that beat under it held the loop
until the SDK gave up after 10 s, failing the chunk with a bare TimeoutError while every heartbeat and lease of the
node stalled (a healthy node's session moved). Here a heartbeat goes through a stand-in for the loop that takes
those locks, and must never find them held. In Temporal's ActivityEnvironment."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

from activities.chunk_order import ABANDONED, ChunkOrder
from activities.pipelines import PipelineSlot
from monologue import contracts as c

LOOP_DEADLINE_S = 10.0  # what the stand-in loop may take to read the lock when nothing holds it (a loaded machine)


def _request(position: int, epoch: int = 0) -> c.GenerateChunkInput:
    chunk = c.Chunk(c.ChunkKind.N, position, 8 * position, 8)
    return c.GenerateChunkInput(
        session_id="s",
        node_id="n",
        options=c.RenderOptions(),
        chunk=chunk,
        position=position,
        wait_for=None if position == 0 else position - 1,
        epoch=epoch,
    )


class LoopStandIn:
    """A heartbeat as the SDK sends it: another thread (the event loop) must run before it returns, and that thread
    does what the node's loop does, `reads` (a lock the activity may also take). Heartbeats whose loop could not run
    within the deadline are `blocked`; after `then` beats, `then_do` runs once (in the activity's context)."""

    def __init__(self, reads: Callable[[], object], then: int = 0, then_do: Callable[[], None] | None = None) -> None:
        self.reads, self.then, self.then_do = reads, then, then_do
        self.beats: list[str] = []
        self.blocked: list[str] = []

    def __call__(self, *details: Any) -> None:
        self.beats.append(str(details[0]))
        loop = threading.Thread(target=self.reads, daemon=True)
        loop.start()
        loop.join(timeout=LOOP_DEADLINE_S)
        if loop.is_alive():  # it waits for a lock this thread holds: the deadlock the SDK ends after 10 s
            self.blocked.append(str(details[0]))
        if len(self.beats) == self.then and self.then_do is not None:
            self.then_do()


def test_a_chunk_waiting_its_turn_never_heartbeats_holding_the_lock_the_event_loop_reads() -> None:
    order = ChunkOrder()
    loop = LoopStandIn(lambda: order.chunks_done, then=3, then_do=lambda: order.finish(_request(0)))
    env = ActivityEnvironment()
    env.on_heartbeat = loop
    assert env.run(order.wait_turn, _request(1)) is not None  # N0 finished after three beats; N1's turn came
    assert loop.blocked == [] and len(loop.beats) >= 3


def test_a_chunk_waiting_for_the_pipeline_never_heartbeats_holding_the_slots_lock() -> None:
    slot, held, release = PipelineSlot(), threading.Event(), threading.Event()

    def holder() -> None:
        with slot.hold("N0"):
            held.set()
            release.wait(timeout=60)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(timeout=60)
    loop = LoopStandIn(slot.touch, then=3, then_do=release.set)  # the holder's progress takes the same lock

    def wait_for_the_slot() -> None:
        with slot.hold("N1"):
            pass

    env = ActivityEnvironment()
    env.on_heartbeat = loop
    env.run(wait_for_the_slot)
    thread.join()
    assert loop.blocked == [] and len(loop.beats) >= 3


def test_a_chunk_of_an_abandoned_epoch_is_refused_as_a_benign_failure_not_a_cancellation() -> None:
    """Temporal refuses a cancellation it did not ask for (the node's log then carries its refusal), and the
    workflow drops the outcome of a chunk it abandoned: a benign, non-retryable failure says so quietly."""
    order = ChunkOrder()
    env = ActivityEnvironment()
    env.run(order.wait_turn, _request(0, epoch=1))  # the workflow moved on to epoch 1
    with pytest.raises(ApplicationError) as refused:
        env.run(order.wait_turn, _request(1, epoch=0))
    assert refused.value.type == ABANDONED and refused.value.non_retryable
    assert refused.value.category == ApplicationErrorCategory.BENIGN
