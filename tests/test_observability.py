"""Metrics, probes and readiness on a running stack: a real Prometheus server (Debian's package) scrapes the
API's /metrics, the node's port and both processes' Temporal SDK metrics during a render, and the figures come
back through Prometheus' HTTP API. /readyz fails, naming the part, when the database is down or not migrated;
Temporal's outage it reports without failing."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from api.app import create_app
from cli.benches.cluster import speech as speech_clip
from cli.live_stream import stream_live
from cli.prometheus_server import prometheus
from cli.stack import Stack, free_port
from monologue.contracts import TERMINAL, SessionKind, SessionStatus
from monologue.plan import plan_chunks
from monologue.settings import Settings, TemporalSettings
from node import http_port as node_http
from tests.conftest import SAMPLES
from tests.helpers import api_key, submit, wait_done

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _targets(settings: Settings) -> dict[str, list[str]]:
    api, node = settings.api, settings.node
    return {
        "api": [f"127.0.0.1:{api.port}"],
        "node": [f"127.0.0.1:{node.http_port}"],
        "temporal-sdk": [f"127.0.0.1:{api.temporal_metrics_port}", f"127.0.0.1:{node.temporal_metrics_port}"],
    }


def test_prometheus_scrapes_the_stack_during_a_render(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes, tmp_path: Path
) -> None:
    with prometheus(_targets(stack.settings)) as server:
        up = server.wait_for('sum(up{job=~"api|node|temporal-sdk"})', lambda v: v == 4)
        assert up == 4, server.query("up")
        before = server.value('sum(monologue_chunks_total{family="warp"})') or 0.0
        finished = 'sum(monologue_sessions_finished_total{kind="render",status="completed"})'
        completed_before = server.value(finished) or 0.0
        render = wait_done(
            api_url, submit(api_url, sample_portrait, sample_speech, resolution="512", preview="true").json()["id"]
        )
        assert render["status"] == "completed", render["error"]
        chunks = len(plan_chunks(render["progress"]["frames_total"], n_frames=40, i_frames=4))
        # Counts are exact: the stack's one node made this render's chunks and nothing else ran meanwhile.
        after = server.wait_for('sum(monologue_chunks_total{family="warp"})', lambda v: (v or 0) >= before + chunks)
        assert after == before + chunks
        completed = server.wait_for(finished, lambda v: (v or 0) > completed_before)
        assert completed == completed_before + 1
        # The sessions still going, from the API (its one replica holds the exporter lock): every kind and status.
        going = len(SessionKind) * len(frozenset(SessionStatus) - TERMINAL)
        assert len(server.query('monologue_sessions{job="api"}')) == going, server.query("monologue_sessions")
        created = 'sum(monologue_http_requests_total{job="api",method="POST",route="/v1/renders",status="201"})'
        assert (server.wait_for(created, lambda v: (v or 0) >= 1) or 0) >= 1
        for family in (
            'monologue_chunk_stage_seconds_count{stage="encode"}',
            'monologue_chunk_stage_seconds_count{stage="checkpoint"}',
            "monologue_checkpoint_write_seconds_count",
            'monologue_ttff_seconds_count{kind="render"}',
            "monologue_realtime_ratio_count",
            "monologue_queue_wait_seconds_count",
        ):
            assert (server.value(f"sum({family})") or 0) >= 1, family
        assert server.value("monologue_node_slots") == stack.settings.node.capacity
        # The node ScaledObject's query (infra/k8s) on these very metrics: a number, never empty (KEDA would fall back).
        demand = server.wait_for(_scaling_query(), lambda v: v is not None)
        assert demand is not None and demand >= 0, server.query(_scaling_query())
        assert (server.value('monologue_host_memory_bytes{state="total"}') or 0) > 0
        assert (server.value("process_resident_memory_bytes{job='node'}") or 0) > 0
        # Temporal's SDK metrics, from the node (its workers) and from the API (its client).
        executed = 'sum(temporal_activity_execution_latency_count{activity_type="generate_chunk"})'
        assert (server.wait_for(executed, lambda v: (v or 0) >= chunks) or 0) >= chunks
        api_sdk = f'sum(temporal_request{{instance="127.0.0.1:{stack.settings.api.temporal_metrics_port}"}})'
        assert (server.value(api_sdk) or 0) > 0
        # A live session: its time to first frame and each chunk's latency (audio stored → published).
        speech = speech_clip(tmp_path, 2.0)
        live = stream_live(api_url, SAMPLES / "portrait.jpg", speech, speed=2.0, api_key=api_key(api_url))
        assert live.session["status"] == "completed", live.session
        for family in ('monologue_ttff_seconds_count{kind="live"}', "monologue_live_latency_seconds_count"):
            assert (server.wait_for(f"sum({family})", lambda v: (v or 0) >= 1) or 0) >= 1, family


def test_the_api_and_the_node_are_alive_and_ready(stack: Stack, api_url: str) -> None:
    assert httpx.get(f"{api_url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{api_url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": True, "schema": True, "temporal": True}
    node = f"http://127.0.0.1:{stack.settings.node.http_port}"
    assert httpx.get(f"{node}/healthz").json() == {"status": "ok"}
    body = httpx.get(f"{node}/readyz").json()
    assert body["status"] == "ready" and body["slots"]["total"] == stack.settings.node.capacity, body
    assert body["checks"] == {"polling": True, "temporal": True, "database": True, "disk": True, "gpu": True}
    # Kubelets and Prometheus reach pods by address: the probes answer any Host, the API's routes do not.
    assert httpx.get(f"{api_url}/readyz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    assert httpx.get(f"{api_url}/v1/renders", headers={"Host": "10.1.2.3:8000"}).status_code == 400


def _readyz(settings: Settings) -> tuple[int, dict[str, Any]]:
    with TestClient(create_app(settings), base_url=str(settings.api.public_url)) as api:
        response = api.get("/readyz")
    return response.status_code, response.json()


def test_the_api_stays_ready_while_temporal_is_down_and_says_so(stack_settings: Settings, tmp_path: Path) -> None:
    """A Temporal blip must not take every replica out of the Service at once: the API answers what the database
    knows, and 503 with Retry-After to what needs Temporal."""
    from monologue.db import migrate

    settings = Settings(home=tmp_path, temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}"))
    migrate(settings.db_url)
    status, body = _readyz(settings)
    assert status == 200 and body["checks"] == {"database": True, "schema": True, "temporal": False}, body
    assert body["status"] == "ready, without Temporal" and body["problems"]["temporal"]


def test_api_readiness_fails_until_the_migrations_ran(stack_settings: Settings, tmp_path: Path) -> None:
    from monologue.db import migrate, schema_head

    settings = Settings(home=tmp_path, temporal=stack_settings.temporal)
    status, body = _readyz(settings)
    assert status == 503 and body["checks"] == {"database": True, "schema": False, "temporal": True}, body
    assert "monologue migrate" in body["problems"]["schema"]
    migrate(settings.db_url, "0001")
    status, body = _readyz(settings)
    assert status == 503 and f"needs {schema_head()}" in body["problems"]["schema"]
    migrate(settings.db_url)
    assert _readyz(settings)[0] == 200


def test_api_readiness_fails_when_the_database_is_down(stack_settings: Settings, tmp_path: Path) -> None:
    dead = f"postgresql+psycopg://monologue:x@127.0.0.1:{free_port()}/monologue"
    settings = Settings(home=tmp_path, database_url=dead, temporal=stack_settings.temporal)
    status, body = _readyz(settings)
    assert status == 503 and body["checks"] == {"database": False, "schema": True, "temporal": True}, body
    assert "connection" in body["problems"]["database"].lower()


def test_node_readiness_fails_while_draining_or_without_its_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    health = node_http.NodeHealth(capacity=2, polling=True, temporal_ok=True, database_ok=True)
    server = node_http.serve(health, "127.0.0.1", free_port())
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(f"{url}/readyz").status_code == 200
        health.draining = True
        drained = httpx.get(f"{url}/readyz")
        assert drained.status_code == 503 and drained.json()["checks"]["polling"] is False
        health.draining, health.require_gpu = False, True
        monkeypatch.setitem(sys.modules, "torch", None)  # no torch imported: no GPU visible
        no_gpu = httpx.get(f"{url}/readyz")
        assert no_gpu.status_code == 503 and json.loads(no_gpu.text)["checks"]["gpu"] is False
        assert "monologue_node_slots 2.0" in httpx.get(f"{url}/metrics").text
    finally:
        server.shutdown()


def _scaling_query() -> str:
    """The PromQL the node ScaledObject scales on."""
    path = Path(__file__).resolve().parent.parent / "infra" / "k8s" / "base" / "node-scaledobject.yaml"
    [trigger] = yaml.safe_load(path.read_text())["spec"]["triggers"]
    return str(trigger["metadata"]["query"])
