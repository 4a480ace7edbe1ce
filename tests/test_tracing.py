"""One trace per render: the HTTP request's server span is the ancestor of the workflow it starts and of every
chunk activity, the publisher and finalize (request → StartWorkflow → StartActivity → RunActivity, with the
workflow's own RunWorkflow span beside the StartActivity spans, as Temporal's TracingInterceptor draws it). The
API and a node run in this process (spans go to an in-memory exporter), on the session stack's Temporal server
but on queues of their own, so the stack's node takes none of this session's work."""

from __future__ import annotations

import asyncio
import io
import time
import wave
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import get_current_span

from api.app import create_app
from monologue import tracing
from monologue.db import migrate
from monologue.plan import plan_chunks
from monologue.settings import NodeSettings, Settings, TemporalSettings
from node.worker import run_node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
OPTIONS = {"resolution": "512", "preview": "true", "chunk_frames": "16", "i_frames": "4", "seed": "3"}


def _speech(sample_speech: bytes, seconds: float) -> bytes:
    """The first `seconds` of the bundled speech, as a WAV."""
    with wave.open(io.BytesIO(sample_speech)) as source:
        rate, frames = source.getframerate(), source.readframes(int(source.getframerate() * seconds))
        channels, width = source.getnchannels(), source.getsampwidth()
    out = io.BytesIO()
    with wave.open(out, "wb") as target:
        target.setnchannels(channels)
        target.setsampwidth(width)
        target.setframerate(rate)
        target.writeframes(frames)
    return out.getvalue()


def _render(settings: Settings, key: str, files: dict[str, Any]) -> dict[str, Any]:
    """Submit through the API (in this process) and wait for the render to end."""
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(settings), base_url=str(settings.api.public_url)) as api:
        created = api.post("/v1/renders", headers=headers, files=files, data=OPTIONS)
        assert created.status_code == 201, created.text
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            render: dict[str, Any] = api.get(f"/v1/renders/{created.json()['id']}", headers=headers).json()
            if render["status"] in ("completed", "failed"):
                return render
            time.sleep(0.3)
    raise TimeoutError("the traced render did not finish")


def _ancestors(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> list[str]:
    names, parent = [], span.parent
    while parent is not None and parent.span_id in by_id:
        names.append(by_id[parent.span_id].name)
        parent = by_id[parent.span_id].parent
    return names


async def test_one_trace_runs_from_the_request_through_the_workflow_to_every_chunk(
    stack_settings: Settings,
    stack: Any,
    tmp_path: Path,
    sample_portrait: bytes,
    sample_speech: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_provider", provider)  # as tracing.configure does, undone after the test
    monkeypatch.setattr(tracing, "_current_span", get_current_span)  # log lines name their spans
    temporal = TemporalSettings(address=stack_settings.temporal.address, task_queue="traced")
    settings = Settings(home=tmp_path, log_format="json", temporal=temporal, node=NodeSettings(id="traced-node"))
    migrate(settings.db_url)
    from monologue import apikeys
    from monologue.db import make_engine, make_sessionmaker

    with make_sessionmaker(make_engine(settings.db_url))() as db:
        key = apikeys.create_key(db, tenant="traced")[1]
    stop = asyncio.Event()
    node = asyncio.create_task(run_node(settings, stop=stop, handle_signals=False))
    files = {"portrait": ("p.jpg", sample_portrait), "audio": ("s.wav", _speech(sample_speech, 2.0))}
    try:
        render = await asyncio.to_thread(_render, settings, key, files)
    finally:
        stop.set()
        await node
    assert render["status"] == "completed", render["error"]

    spans = exporter.get_finished_spans()
    [request] = [span for span in spans if span.name == "POST /v1/renders" and span.parent is None]
    trace = [span for span in spans if span.context.trace_id == request.context.trace_id]
    by_id = {span.context.span_id: span for span in trace}
    names = Counter(span.name for span in trace)
    chunks = len(plan_chunks(render["progress"]["frames_total"], n_frames=16, i_frames=4))
    assert names["RunActivity:generate_chunk"] == chunks >= 4, names
    for name in ("StartWorkflow:RenderWorkflow", "RunWorkflow:RenderWorkflow", "RunActivity:finalize"):
        assert names[name] >= 1, (name, names)
    assert names["RunActivity:publish"] >= 1 and names["RunActivity:validate_inputs"] == 1, names
    for span in trace:
        if span.name.startswith("RunActivity:"):
            chain = _ancestors(span, by_id)
            assert chain[-1] == "POST /v1/renders", (span.name, chain)
            workflow = "ValidateInputsWorkflow" if span.name == "RunActivity:validate_inputs" else "RenderWorkflow"
            assert chain[:2] == [f"StartActivity:{span.name.partition(':')[2]}", f"StartWorkflow:{workflow}"], chain
    run = next(span for span in trace if span.name == "RunWorkflow:RenderWorkflow")
    assert _ancestors(run, by_id) == ["StartWorkflow:RenderWorkflow", "POST /v1/renders"]
