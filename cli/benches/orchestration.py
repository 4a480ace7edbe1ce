"""`monologue bench orchestration`: what Temporal and the node leases cost a long render.

Starts its own embedded stack (two nodes, in a temporary home), renders minutes of real speech, kills
the node holding a second render, and prints: node idle time between consecutive chunks (p50/p95),
Temporal's raw round trip per activity, checkpoint write time, history events per chunk, and recovery
time after a node kill (SIGKILL → the next chunk done on another node). Figures, not assertions.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from cli.stack import Stack, free_port
from monologue import SAMPLES
from monologue.client import Client, auth
from monologue.contracts import SessionStatus
from monologue.media import decode_wav, encode_wav, normalise_audio
from monologue.schemas import RenderPublic
from monologue.settings import ApiSettings, NodeSettings, RenderDefaults, Settings, TemporalSettings


@dataclass
class OrchestrationReport:
    minutes: float
    chunks: int
    idle_ms_p50: float
    idle_ms_p95: float
    round_trip_ms: float
    checkpoint_ms_p50: float
    checkpoint_ms_p95: float
    history_events_per_chunk: float
    lease_timeout_s: float
    recovery_s: float

    def table(self) -> str:
        return "\n".join(
            [
                f"orchestration: {self.minutes:g} min render, {self.chunks} chunks",
                f"  node idle between chunks    p50 {self.idle_ms_p50:7.2f} ms   p95 {self.idle_ms_p95:7.2f} ms",
                f"  Temporal round trip         {self.round_trip_ms:7.2f} ms per activity (no-op, sequential)",
                f"  checkpoint write            p50 {self.checkpoint_ms_p50:7.2f} ms"
                f"   p95 {self.checkpoint_ms_p95:7.2f} ms",
                f"  history events per chunk    {self.history_events_per_chunk:7.2f}",
                f"  recovery after a node kill  {self.recovery_s:7.2f} s (lease timeout {self.lease_timeout_s:g} s)",
            ]
        )


def _speech(minutes: float, folder: Path) -> Path:
    speech = decode_wav(normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav)
    samples = int(minutes * 60 * 16_000)
    path = folder / "speech.wav"
    path.write_bytes(encode_wav(np.resize(speech, samples)))
    return path


_KEY: dict[str, str] = {}  # the private stack's API key, by API URL


def _submit(api: str, audio: Path) -> str:
    with Client(api, api_key=_KEY.get(api)) as client:
        return client.create_render(portrait=SAMPLES / "portrait.jpg", audio=audio).id


def _wait(api: str, session_id: str, until: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Poll the session (as JSON, with its `node_id` from the operator's view: a tenant's answer does not name
    nodes) every 20 ms until `until` holds."""

    def seen(render: RenderPublic) -> dict[str, Any]:
        answer = httpx.get(f"{api}/ops/api/sessions/{session_id}", headers=auth(_KEY.get(api)), timeout=10)
        answer.raise_for_status()  # the stack's own key has the ops scope
        return render.model_dump(mode="json") | {"node_id": answer.json()["session"]["node_id"]}

    with Client(api, api_key=_KEY.get(api)) as client:
        found = client.poll(session_id, lambda render: bool(until(seen(render))), poll_s=0.02, timeout_s=1800)
    return seen(found)


async def _round_trip_ms(address: str, count: int = 50) -> float:
    from temporalio.client import Client
    from temporalio.worker import Worker

    from workflows.bench import RoundTripWorkflow, noop

    client = await Client.connect(address)
    queue = f"bench-{uuid.uuid4().hex}"
    async with Worker(client, task_queue=queue, workflows=[RoundTripWorkflow], activities=[noop]):
        await client.execute_workflow(RoundTripWorkflow.run, 2, id=f"warm-{queue}", task_queue=queue)
        started = time.perf_counter()
        await client.execute_workflow(RoundTripWorkflow.run, count, id=f"rt-{queue}", task_queue=queue)
    return (time.perf_counter() - started) * 1000 / count


async def _history_events(address: str, workflow_id: str) -> int:
    from temporalio.client import Client

    client = await Client.connect(address)
    events = 0
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
        events += len(history.events)
    return events


def bench_orchestration(*, minutes: float = 1.0, lease_timeout_s: float = 5.0) -> OrchestrationReport:
    """Run the measurements on a fresh embedded stack (preview frames: this measures orchestration)."""
    from sqlalchemy import select

    from monologue.db import ChunkRow, make_engine, make_sessionmaker

    with tempfile.TemporaryDirectory(prefix="monologue-bench-") as scratch:
        folder = Path(scratch)
        settings = Settings(
            home=folder / "home",
            log_format="json",
            temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
            api=ApiSettings(port=free_port()),
            node=NodeSettings(id="bench-a", lease_timeout_s=lease_timeout_s),
            render=RenderDefaults(preview=True),
        )
        with Stack(settings) as stack:
            stack.start_node("bench-b")
            api = str(settings.api.public_url)
            _KEY[api] = stack.api_key
            audio = _speech(minutes, folder)
            session_id = _submit(api, audio)
            render = _wait(api, session_id, lambda r: r["status"] in (SessionStatus.COMPLETED, SessionStatus.FAILED))
            if render["status"] != SessionStatus.COMPLETED:
                raise RuntimeError(f"the benchmark render failed: {render['error']}")
            engine = make_engine(settings.db_url)
            with make_sessionmaker(engine)() as db:
                rows = list(db.scalars(select(ChunkRow).where(ChunkRow.session_id == session_id)))
            engine.dispose()
            idle = [row.stage_ms["idle_before"] for row in rows if "idle_before" in row.stage_ms]
            checkpoints = [row.stage_ms["checkpoint"] for row in rows if "checkpoint" in row.stage_ms]
            events = asyncio.run(_history_events(settings.temporal.address, f"render-{session_id}"))
            round_trip = asyncio.run(_round_trip_ms(settings.temporal.address))

            # Recovery: kill the node holding a render mid-way; time until another node finishes a chunk.
            victim_id = _submit(api, audio)
            running = _wait(api, victim_id, lambda r: r["node_id"] and r["progress"]["chunks_done"] >= 3)
            done_before = running["progress"]["chunks_done"]
            child = next(ch for ch in stack.children if ch.name == f"node-{running['node_id']}")
            child.process.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            _wait(
                api,
                victim_id,
                lambda r: r["node_id"] != running["node_id"] and r["progress"]["chunks_done"] > done_before + 1,
            )
            recovery = time.monotonic() - killed
    return OrchestrationReport(
        minutes=minutes,
        chunks=len(rows),
        idle_ms_p50=float(np.percentile(idle, 50)),
        idle_ms_p95=float(np.percentile(idle, 95)),
        round_trip_ms=round_trip,
        checkpoint_ms_p50=float(np.percentile(checkpoints, 50)),
        checkpoint_ms_p95=float(np.percentile(checkpoints, 95)),
        history_events_per_chunk=events / len(rows),
        lease_timeout_s=lease_timeout_s,
        recovery_s=recovery,
    )
