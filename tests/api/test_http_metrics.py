"""The API counts and times every request by method, route template and status (api/http_metrics.py): two ids of
one route are one series, a path no route has and a request the Host check refused are `unmatched`, a method no
route has is `other`, a request that raised is the 500 the server answers, and two apps in one process count apart
(each on its own registry)."""

from __future__ import annotations

from pathlib import Path

from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.app import create_app
from api.http_metrics import HttpMetricsMiddleware
from monologue.db import migrate
from monologue.metrics import HttpMetrics
from monologue.settings import Settings

Labels = tuple[tuple[str, str], ...]


def _samples(text: str, name: str) -> dict[Labels, float]:
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def _request(method: str, route: str, status: int) -> Labels:
    return (("method", method), ("route", route), ("status", str(status)))


def test_requests_are_counted_and_timed_by_route_template(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    migrate(settings.db_url)
    app, other_app = create_app(settings), create_app(settings)
    base_url = str(settings.api.public_url)
    with TestClient(app, base_url=base_url) as api, TestClient(other_app, base_url=base_url) as other:
        for session_id in ("ses_first", "ses_second"):
            assert api.get(f"/v1/renders/{session_id}").status_code == 401  # no key
        assert api.get("/no/such/path").status_code == 404
        assert api.get("/v1/renders", headers={"Host": "rebinding.example"}).status_code == 400
        assert api.request("BREW", "/healthz").status_code == 405
        assert other.get("/healthz").status_code == 200
        text, other_text = api.get("/metrics").text, other.get("/metrics").text

    requests = _samples(text, "monologue_http_requests_total")
    assert requests == {
        _request("GET", "/v1/renders/{session_id}", 401): 2,
        _request("GET", "unmatched", 404): 1,
        _request("GET", "unmatched", 400): 1,
        _request("other", "/healthz", 405): 1,
    }
    timed = _samples(text, "monologue_http_request_duration_seconds_count")
    assert timed[(("method", "GET"), ("route", "/v1/renders/{session_id}"))] == 2
    templates = {getattr(context.route, "path", None) for context in iter_route_contexts(app.routes)}
    assert {dict(labels)["route"] for labels in requests} <= templates | {"unmatched"}
    assert _samples(other_text, "monologue_http_requests_total") == {_request("GET", "/healthz", 200): 1}


def test_a_request_that_raises_is_counted_as_the_500_the_server_answers() -> None:
    def broken(_request: Request) -> Response:
        raise RuntimeError("a bug")

    registry = CollectorRegistry()
    app = Starlette(routes=[Route("/items/{item_id}", broken)])
    app.add_middleware(HttpMetricsMiddleware, metrics=HttpMetrics.on(registry))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/items/7").status_code == 500
    counted = _samples(generate_latest(registry).decode(), "monologue_http_requests_total")
    assert counted == {_request("GET", "/items/{item_id}", 500): 1}
