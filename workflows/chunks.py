"""The chunk activities a session keeps scheduled on its node, inside RenderWorkflow.

Keeping the next chunks scheduled while one runs hides Temporal's round trip; the node runs them in order
(`wait_for`). When the node is lost or a checkpoint is gone the scheduled chunks are abandoned, and a new epoch
keeps a node from running any that linger. Workflow code: standard library, temporalio and the stdlib-only
contracts and plan only."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from temporalio import workflow

from workflows.lease import NodeLease
from workflows.planning import AudioFeed, SessionPlan
from workflows.shared import abandon

with workflow.unsafe.imports_passed_through():
    from monologue import contracts as c
    from monologue.contracts import Chunk


class Scheduled(NamedTuple):
    position: int  # in the generation order
    spec: Chunk
    handle: workflow.ActivityHandle[c.GenerateChunkResult]


class ChunkWindow:
    """Up to `orchestration.window` chunk activities scheduled on the held node, oldest first."""

    def __init__(self, request: c.RenderInput, lease: NodeLease, plan: SessionPlan, feed: AudioFeed) -> None:
        self._request, self._lease, self._plan, self._feed = request, lease, plan, feed
        self.scheduled: deque[Scheduled] = deque()
        self._epoch = 0  # bumped when scheduled chunks are abandoned, so a node never runs a stale one

    def fill(self, cursor: int) -> None:
        """Schedule the chunks after the ones scheduled, from `cursor`, until the window is full."""
        chunks = self._plan.chunks
        position = cursor + len(self.scheduled)
        while len(self.scheduled) < self._request.orchestration.window and position < len(chunks):
            wait_for = position - 1 if self.scheduled else None
            handle = self._lease.start(
                c.GENERATE_CHUNK, self._input(chunks[position], position, wait_for), c.GenerateChunkResult
            )
            self.scheduled.append(Scheduled(position, chunks[position], handle))
            position += 1

    async def next_generated(self) -> Chunk:
        """Wait for the oldest scheduled chunk (raises NodeLost if the node goes first)."""
        oldest = self.scheduled[0]
        await self._lease.wait(oldest.handle, c.GENERATE_CHUNK)
        self.scheduled.popleft()
        return oldest.spec

    def abandon(self) -> None:
        """Cancel the chunks scheduled ahead; the new epoch keeps a node from running any that linger."""
        for scheduled in self.scheduled:
            abandon(scheduled.handle)
        self.scheduled.clear()
        self._epoch += 1

    def _input(self, spec: Chunk, position: int, wait_for: int | None) -> c.GenerateChunkInput:
        return c.GenerateChunkInput(
            session_id=self._request.session_id,
            node_id=self._lease.node_id or "",
            options=self._request.options,
            chunk=spec,
            position=position,
            wait_for=wait_for,
            epoch=self._epoch,
            session_kind=self._request.kind,
            audio_samples=self._feed.samples,
            audio_ended=self._feed.ended,
            audio_ready_ms=self._plan.audio_ready.get(spec.name),
            lease=self._lease.number,
        )
