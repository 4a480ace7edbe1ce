"""RenderWorkflow against a real Temporal dev server with fake activities registered under the real
names: the orchestration alone, in seconds, with fresh task queues per test."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from monologue import contracts as c
from monologue.orchestration import orchestration_config
from monologue.settings import Settings
from workflows.render import RenderWorkflow

# One dev server for the module; every test shares its event loop.
pytestmark = pytest.mark.asyncio(loop_scope="module")


def orchestration(**changes: Any) -> c.Orchestration:
    """The default settings' orchestration, with `changes`."""
    return dataclasses.replace(orchestration_config(Settings(), "local"), **changes)


class FakeNodes:
    """Fake activities for a shared queue and any number of nodes; records every call.

    `fail_chunk` makes that N chunk fail like a model error does; `lose_checkpoint` makes the first
    generation of that I chunk report the checkpoint of N(k) lost (once). `stored_samples` is the live audio
    storage holds, as `stored_audio` reports it."""

    def __init__(
        self,
        env: WorkflowEnvironment,
        frames: int,
        *,
        fail_chunk: int | None = None,
        lose_checkpoint: int | None = None,
        stored_samples: int = 0,
        drop_first_lease: bool = False,
        chunk_s: float = 0.0,
        full_disk_finalizes: int = 0,
        newest_lease: int = 0,
    ) -> None:
        self.env = env
        self.newest_lease = newest_lease  # the database's newest lease: a claim below it is fenced
        self.full_disk_finalizes = full_disk_finalizes  # the first finalizes find the node's disk full
        self.chunk_s = chunk_s  # each chunk takes this long (heartbeating), as a real one does
        self.hold_chunks = threading.Event()  # set: a chunk under way does not finish (heartbeating) until cleared
        self.stored_samples = stored_samples
        self.drop_first_lease = drop_first_lease  # the first lease ends once N0 is done, as a killed node's does
        self.leases = 0
        self.frames = frames
        self.fail_chunk = fail_chunk
        self.lose_checkpoint = lose_checkpoint
        self.calls: list[str] = []
        self.fences: list[tuple[str, int]] = []  # (pinned activity, the lease number it carried), as started
        self.ended: c.RecordStatusInput | None = None
        self.notified: list[c.SessionStatus] = []  # the statuses whose webhooks were queued (running: started)
        # Like a real node: run a chunk only after the one scheduled before it (same epoch), never a stale one.
        # Per session (one fake node may hold several): (epoch, position) of the last chunk done, the newest epoch.
        self.done: dict[str, tuple[int, int]] = {}
        self.epoch: dict[str, int] = {}
        self.order = threading.Condition()
        self.queue = f"q-{uuid.uuid4().hex}"
        self.workflow_id = f"wf-{uuid.uuid4().hex}"

    def shared(self) -> list[object]:
        @activity.defn(name=c.PREPARE)
        def prepare(request: c.PrepareInput) -> c.PrepareResult:
            self.calls.append("prepare")
            return c.PrepareResult(frames=self.frames, audio_samples=self.frames * 640, width=64, height=64)

        @activity.defn(name=c.PUBLISH)
        def publish(request: c.PublishInput) -> c.PublishResult:
            self.calls.append(f"publish {request.published_frames}")
            return c.PublishResult(segments=0)

        @activity.defn(name=c.RECORD_STATUS)
        def record_status(request: c.RecordStatusInput) -> None:
            self.calls.append(f"record {request.status}")
            self.ended = request

        @activity.defn(name=c.STORED_AUDIO)
        def stored_audio(request: c.StoredAudioInput) -> c.StoredAudioResult:
            self.calls.append(f"stored audio {self.stored_samples}")
            return c.StoredAudioResult(samples=self.stored_samples)

        @activity.defn(name=c.NOTIFY_ENDED)
        def notify_session_ended(request: c.NotifyEndedInput) -> c.NotifyEndedResult:
            self.notified.append(request.status)
            return c.NotifyEndedResult(deliveries=0)

        return [prepare, publish, record_status, stored_audio, notify_session_ended]

    def lease(self, node_id: str) -> list[object]:
        @activity.defn(name=c.HOLD_NODE)
        async def hold_node(request: c.HoldNodeInput) -> None:
            self.calls.append(f"lease {node_id}")
            handle = self.env.client.get_workflow_handle(request.workflow_id)
            self.leases += 1
            drop = self.drop_first_lease and self.leases == 1
            await handle.signal(c.NODE_ACQUIRED, c.NodeAcquired(lease=request.lease, node_id=node_id))
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.2)
                if drop and any(call.startswith("N0") for call in self.calls):
                    raise ApplicationError("the node went away", non_retryable=True)

        return [hold_node]

    def node(self, node_id: str) -> list[object]:
        @activity.defn(name=c.INIT_SESSION)
        def init_session(request: c.InitSessionInput) -> c.InitSessionResult:
            self.calls.append(f"init {node_id}")
            self.fences.append(("init", request.lease))
            if request.lease < self.newest_lease:
                raise ApplicationError("fenced", self.newest_lease, type=c.LEASE_FENCED, non_retryable=True)
            return c.InitSessionResult(width=64, height=64)

        @activity.defn(name=c.GENERATE_CHUNK)
        def generate_chunk(request: c.GenerateChunkInput) -> c.GenerateChunkResult:
            self.fences.append(("chunk", request.lease))
            with self.order:
                session = request.session_id
                self.epoch[session] = max(self.epoch.get(session, 0), request.epoch)
                waited = (request.epoch, request.wait_for)
                while request.wait_for is not None and self.done.get(session, (-1, -1)) < waited:
                    if request.epoch < self.epoch[session] or activity.is_cancelled():
                        raise CancelledError("abandoned while waiting")
                    activity.heartbeat()
                    self.order.wait(0.05)
                if request.epoch < self.epoch[session]:
                    raise CancelledError("abandoned")
            chunk = request.chunk
            while self.drop_first_lease and self.leases == 1 and (chunk.kind, chunk.index) != ("N", 0):
                if activity.is_cancelled():  # the first node keeps the rest until its lease ends
                    raise CancelledError("the node went away")
                activity.heartbeat()
                time.sleep(0.05)
            name = f"{chunk.kind}{chunk.index} {chunk.first_frame}+{chunk.n_frames}"
            deadline = time.monotonic() + self.chunk_s
            while time.monotonic() < deadline or self.hold_chunks.is_set():
                if activity.is_cancelled():
                    raise CancelledError("abandoned while running")
                activity.heartbeat()
                time.sleep(0.02)
            self.calls.append(name)
            if chunk.kind == "N" and chunk.index == self.fail_chunk:
                raise ApplicationError("model: cannot render this", non_retryable=True)
            if chunk.kind == "I" and chunk.index == self.lose_checkpoint:
                self.lose_checkpoint = None
                raise ApplicationError("checkpoint gone", chunk.index, type=c.CHECKPOINT_LOST, non_retryable=True)
            with self.order:
                self.done[request.session_id] = (request.epoch, request.position)
                self.order.notify_all()
            return c.GenerateChunkResult(segment_key=name, frames=chunk.n_frames)

        @activity.defn(name=c.FINALIZE)
        def finalize(request: c.FinalizeInput) -> c.FinalizeResult:
            self.calls.append(f"finalize {request.frames}")
            self.fences.append(("finalize", request.lease))
            if self.full_disk_finalizes > 0:
                self.full_disk_finalizes -= 1
                raise ApplicationError("no space left on /scratch", type=c.NODE_DISK_FULL, non_retryable=True)
            return c.FinalizeResult(video_key="final", size_bytes=1)

        return [init_session, generate_chunk, finalize]

    async def run(
        self,
        options: c.RenderOptions,
        *,
        tenant: str = "local",
        kind: c.SessionKind = c.SessionKind.RENDER,
        **orchestration_changes: Any,
    ) -> c.RenderResult:
        node_id = f"n-{uuid.uuid4().hex[:8]}"
        with ThreadPoolExecutor(4) as executor:
            async with AsyncExitStack() as stack:
                for queue, activities, workflows in (
                    (self.queue, self.shared(), [RenderWorkflow]),
                    (c.lease_task_queue(self.queue), self.lease(node_id), []),
                    (c.node_task_queue(node_id), self.node(node_id), []),
                ):
                    await stack.enter_async_context(
                        Worker(
                            self.env.client,
                            task_queue=queue,
                            workflows=workflows,
                            activities=activities,
                            activity_executor=executor,
                            # A bug in workflow code fails the test at once instead of retrying the task forever.
                            workflow_failure_exception_types=[Exception],
                        )
                    )
                result: c.RenderResult = await self.env.client.execute_workflow(
                    RenderWorkflow.run,
                    c.RenderInput(
                        session_id="s",
                        tenant=tenant,
                        kind=kind,
                        options=options,
                        orchestration=orchestration(**orchestration_changes),
                    ),
                    id=self.workflow_id,
                    task_queue=self.queue,
                )
                return result

    def chunks(self) -> list[str]:
        return [call for call in self.calls if call[0] in "NI" or call.startswith(("finalize", "init", "lease"))]


async def test_chunks_run_in_generation_order_and_publish_in_timeline_order(env: WorkflowEnvironment) -> None:
    fake = FakeNodes(env, frames=97)
    result = await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    node = fake.calls[1].split()[1]
    assert fake.chunks() == [
        f"lease {node}",
        f"init {node}",
        "N0 0+40",
        "N1 44+40",
        "I0 40+4",
        "N2 88+9",
        "I1 84+4",
        "finalize 97",
    ]
    published = [int(call.split()[1]) for call in fake.calls if call.startswith("publish")]
    # N0 alone; then nothing until I0 (N1 is behind it in the timeline); then I0+N1; then I1+N2. One publish
    # runs at a time and the next covers everything generated by then, so a slow publish may merge two steps.
    assert published[0] == 40 and published[-1] == 97 and published == sorted(set(published))
    assert set(published) <= {40, 84, 97}
    assert fake.calls.index("publish 40") > fake.calls.index("N0 0+40")
    assert (result.frames, result.chunks, result.video_key) == (97, 5, "final")
    # session.started queued once, when the node took it; the end's messages once, at the end.
    assert fake.notified == [c.SessionStatus.RUNNING, c.SessionStatus.COMPLETED]


async def test_a_chunk_that_cannot_succeed_fails_the_session_with_its_message(env: WorkflowEnvironment) -> None:
    fake = FakeNodes(env, frames=97, fail_chunk=1)
    with pytest.raises(WorkflowFailureError) as failure:
        await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    assert fake.calls.count("N1 44+40") == 1  # not retried
    assert not any(call.startswith("finalize") for call in fake.calls)
    assert fake.ended is not None and fake.ended.status == "failed"
    assert fake.ended.error == "model: cannot render this"
    assert fake.ended.published_frames == 40  # N0 went out; the stream is closed there
    assert "model: cannot render this" in str(failure.value.cause)
    assert fake.notified == [c.SessionStatus.RUNNING, c.SessionStatus.FAILED]


async def test_a_lost_checkpoint_regenerates_from_its_n_chunk(env: WorkflowEnvironment) -> None:
    fake = FakeNodes(env, frames=97, lose_checkpoint=0)
    await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    generated = [call for call in fake.chunks() if call[0] in "NI"]
    # I0 found N0's checkpoint gone: N0 is generated again, then N1 (from N0) and I0.
    assert generated == ["N0 0+40", "N1 44+40", "I0 40+4", "N0 0+40", "N1 44+40", "I0 40+4", "N2 88+9", "I1 84+4"]


async def test_continue_as_new_keeps_the_same_chunk_sequence(env: WorkflowEnvironment) -> None:
    plain, renewed = FakeNodes(env, frames=300), FakeNodes(env, frames=300)
    await plain.run(c.RenderOptions(chunk_frames=20, i_frames=4))
    result = await renewed.run(c.RenderOptions(chunk_frames=20, i_frames=4), continue_as_new_every=3)
    assert [call for call in renewed.calls if call[0] in "NI"] == [call for call in plain.calls if call[0] in "NI"]
    assert result.frames == 300
    assert sum(call.startswith("lease") for call in renewed.calls) > 3  # one lease per run
    # Once for the session, not once per run (every run takes a node: started only in the first).
    assert renewed.notified == [c.SessionStatus.RUNNING, c.SessionStatus.COMPLETED]


async def test_every_pinned_activity_carries_its_lease_and_leases_count_on_across_runs(
    env: WorkflowEnvironment,
) -> None:
    """The fencing token (c.FENCING): each lease a higher number than any before it, in this run or an earlier one
    (continue-as-new carries it), and every chunk and finalize carries the number of the lease it runs under."""
    fake = FakeNodes(env, frames=300)
    await fake.run(c.RenderOptions(chunk_frames=20, i_frames=4), continue_as_new_every=3)
    inits = [number for what, number in fake.fences if what == "init"]
    assert len(inits) > 3 and inits == list(range(1, len(inits) + 1))
    current = 0
    for what, number in fake.fences:
        current = number if what == "init" else current
        assert number == current, fake.fences


async def test_a_run_whose_lease_numbers_are_behind_the_sessions_counts_on_from_the_newest(
    env: WorkflowEnvironment,
) -> None:
    """A claim fenced for a number below the session's newest lease (a run that did not count on) loses the node,
    and the next lease is numbered above the newest: the session completes."""
    fake = FakeNodes(env, frames=97, newest_lease=5)
    result = await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    assert [number for what, number in fake.fences if what == "init"] == [1, 6]
    assert {number for what, number in fake.fences if what != "init"} == {6}
    assert result.frames == 97


async def test_a_session_that_changes_node_queues_session_started_once(env: WorkflowEnvironment) -> None:
    fake = FakeNodes(env, frames=97, drop_first_lease=True)
    await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    assert fake.leases == 2 and sum(call.startswith("init") for call in fake.calls) == 2  # it took a node twice
    assert fake.notified == [c.SessionStatus.RUNNING, c.SessionStatus.COMPLETED]


async def test_a_finalize_that_finds_the_disk_full_moves_the_session_to_a_new_lease(env: WorkflowEnvironment) -> None:
    """NodeDiskFull loses the node: the session takes a new lease (here the same fake node) and finalizes there."""
    fake = FakeNodes(env, frames=97, full_disk_finalizes=1)
    result = await fake.run(c.RenderOptions(chunk_frames=40, i_frames=4))
    node = fake.calls[1].split()[1]
    assert fake.chunks()[-4:] == ["finalize 97", f"lease {node}", f"init {node}", "finalize 97"]
    assert result.video_key == "final" and fake.notified == [c.SessionStatus.RUNNING, c.SessionStatus.COMPLETED]


async def test_continue_as_new_carries_the_whole_input_but_the_resume_point(env: WorkflowEnvironment) -> None:
    """Every field of the first run's input (identity, options, orchestration) reaches the last run unchanged:
    continue-as-new replaces only the resume point, so a new field cannot be dropped on the way."""
    fake = FakeNodes(env, frames=120)
    options = c.RenderOptions(chunk_frames=20, i_frames=4, seed=7, prompt="a quiet room", preview=True)
    changes = dict(continue_as_new_every=2, heartbeat_timeout_s=7.5, idle_timeout_s=11.0, window=2)
    await fake.run(options, tenant="acme", **changes)
    history = await env.client.get_workflow_handle(fake.workflow_id).fetch_history()  # the last run's
    assert sum(call.startswith("lease") for call in fake.calls) > 2  # it did continue as new
    started = history.events[0].workflow_execution_started_event_attributes
    [last] = await env.client.data_converter.decode(started.input.payloads, [c.RenderInput])
    assert last.resume.cursor > 0
    first = c.RenderInput(session_id="s", tenant="acme", options=options, orchestration=orchestration(**changes))
    assert dataclasses.replace(last, resume=first.resume) == first


async def test_a_live_session_that_idles_out_plans_from_the_audio_storage_holds(env: WorkflowEnvironment) -> None:
    """No signal ever came (the API stored 2 s and crashed before telling the workflow): the idle timeout asks
    storage, and the session completes with the frames of all 2 s instead of failing with no audio."""
    fake = FakeNodes(env, frames=0, stored_samples=2 * 16_000)
    options = c.RenderOptions(chunk_frames=20, first_chunk_frames=20, i_frames=4)
    result = await fake.run(options, kind=c.SessionKind.LIVE, idle_timeout_s=1.0, max_live_s=0.0)
    assert "stored audio 32000" in fake.calls
    assert (result.frames, fake.calls[-1]) == (2 * options.fps, "finalize 50")
