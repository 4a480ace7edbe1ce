"""The public API's surface, in process on a real SQLite database and local storage, no Temporal (nothing here
reaches it): the OpenAPI schema (bearer scheme, webhooks, problem codes), problem details with stable codes,
Retry-After on every 429 and 503, and `node_id` kept from tenants."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi import FastAPI, HTTPException
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

from api import errors, outages, streams
from api.app import create_app
from api.deps import ops_access, require_key
from api.problems import CODE_OF_STATUS
from monologue import webhooks
from monologue.db import SessionRow, make_engine, make_sessionmaker
from monologue.problems import PROBLEM_TYPE_BASE, PROBLEMS, ProblemCode
from monologue.schemas import WebhookEvent
from monologue.settings import ApiSettings, LimitSettings, LinkSettings, Settings
from tests.api.in_process import key, make_app, stored

API = Path(__file__).resolve().parents[2] / "api"


@pytest.fixture
def app(tmp_path: Path, db_sessions: sessionmaker[Any]) -> FastAPI:
    return make_app(tmp_path, db_sessions)


def test_the_bearer_scheme_is_on_exactly_the_routes_that_take_a_key(app: FastAPI, db_sessions: Any) -> None:
    """Derived from each route's dependencies: /v1 routes carry it; playback links, WebRTC signalling, health and
    /problems do not."""
    schema = TestClient(app).get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schema["components"]["securitySchemes"]["bearer"]["description"],
    }
    routes = [context.route for context in iter_route_contexts(app.routes) if isinstance(context.route, APIRoute)]
    keyed = {
        (route.path, method.lower())
        for route in routes
        if route.include_in_schema and _takes(route, require_key)
        for method in route.methods
    }
    secured = {
        (path, method) for path, ops in schema["paths"].items() for method, op in ops.items() if "security" in op
    }
    assert secured == keyed and len(keyed) >= 15
    assert all(
        op["security"] == [{"bearer": []}]
        for ops in schema["paths"].values()
        for op in ops.values()
        if "security" in op
    )
    open_paths = {path for path, ops in schema["paths"].items() if not any("security" in op for op in ops.values())}
    # Playback links and WebRTC signalling (a playback token or an audio ticket as the Bearer: api/routes/live.py)
    signed = {path for path in schema["paths"] if path.startswith(("/play/", "/v1/live/"))}
    assert open_paths == {"/healthz", "/readyz"} | signed
    _, operator = key(db_sessions, "ops-team", "ops")
    ops_schema = TestClient(app, headers=operator).get("/ops/api/openapi.json").json()
    assert all("security" in op for ops in ops_schema["paths"].values() for op in ops.values())
    assert any(_takes(route, ops_access) for route in routes)


def _takes(route: APIRoute, dependency: Any) -> bool:
    pending = list(route.dependant.dependencies)
    while pending:
        found = pending.pop()
        if found.call is dependency:
            return True
        pending.extend(found.dependencies)
    return False


def test_every_error_the_api_can_answer_has_a_problem_code() -> None:
    """Every documented error status lists its codes; every HTTPException status raised in api/ has a code of that
    status; every Refusal names a code."""
    app = create_app(Settings(api=ApiSettings(allowed_hosts=["testserver"])))
    schema = app.openapi()
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status != "default" and int(status) >= 400:
                    codes = response.get("x-problem-codes")
                    assert codes and all(PROBLEMS[ProblemCode(c)].status == int(status) for c in codes), (path, method)
    raised = _http_exception_statuses()
    assert raised and all(PROBLEMS[CODE_OF_STATUS[status]].status == status for status in raised), raised
    refusals = _subclasses(errors.Refusal)
    assert {cls.__name__ for cls in refusals} >= {"TooManySessions", "TooManyStreams", "NoNodeForLive"}
    assert all(isinstance(cls.code, ProblemCode) for cls in refusals)
    assert set(PROBLEMS) == set(ProblemCode)


def _http_exception_statuses() -> set[int]:
    statuses = set()
    for source in API.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            called = isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", ""))
            if called == "HTTPException" and node.args and isinstance(node.args[0], ast.Constant):
                statuses.add(int(node.args[0].value))
    return statuses


def _subclasses(cls: type) -> list[type]:
    found = cls.__subclasses__()
    return found + [sub for child in found for sub in _subclasses(child)]


def test_problems_carry_a_stable_code_its_type_uri_and_a_page(app: FastAPI, db_sessions: Any) -> None:
    _, acme = key(db_sessions, "acme")
    client = TestClient(app)
    answers = {
        ProblemCode.UNAUTHORIZED: client.get("/v1/renders"),
        ProblemCode.NOT_FOUND: client.get("/v1/renders/nope", headers=acme),
        ProblemCode.METHOD_NOT_ALLOWED: client.put("/v1/renders", headers=acme),
        ProblemCode.INVALID_REQUEST: client.get("/v1/renders", params={"limit": 0}, headers=acme),
        ProblemCode.HOST_NOT_ALLOWED: client.get("/v1/renders", headers={"Host": "evil.example", **acme}),
        ProblemCode.CROSS_SITE_REQUEST: client.post(
            "/v1/renders/x/cancel", headers={"Origin": "https://evil.example", **acme}
        ),
    }
    for code, answer in answers.items():
        body = answer.json()
        assert answer.headers["content-type"] == "application/problem+json", answer.text
        assert (answer.status_code, body["code"], body["type"]) == (
            PROBLEMS[code].status,
            code.value,
            f"{PROBLEM_TYPE_BASE}{code.value}",
        ), body
    page = client.get(f"/problems/{ProblemCode.TOO_MANY_SESSIONS.value}")
    assert page.status_code == 200 and PROBLEMS[ProblemCode.TOO_MANY_SESSIONS].summary in page.text
    assert client.get("/problems/no-such-code").json()["code"] == ProblemCode.NOT_FOUND.value


def test_the_webhooks_section_documents_each_event_as_it_is_sent(app: FastAPI, db_sessions: Any) -> None:
    schema = TestClient(app).get("/openapi.json").json()
    assert set(schema["webhooks"]) == {event.value for event in WebhookEvent}
    components = schema["components"]
    stored(db_sessions, "s1")
    with db_sessions() as db:
        row = db.get(SessionRow, "s1")
    sent_headers = webhooks.headers(webhooks.new_secret(), "msg_1", 1_700_000_000, b"{}")
    for event in WebhookEvent:
        post = schema["webhooks"][event.value]["post"]
        documented = {parameter["name"] for parameter in post["parameters"]}
        assert documented <= set(sent_headers) and {"webhook-id", "webhook-signature"} <= documented
        message = json.loads(webhooks.body(webhooks.payload(row, event, app.state.services.settings)))
        body_schema = post["requestBody"]["content"]["application/json"]["schema"] | {"components": components}
        jsonschema.validate(message, body_schema)  # what is sent is what is documented
        other = next(e for e in WebhookEvent if e is not event)
        with pytest.raises(jsonschema.ValidationError):  # and each entry is that event's only
            jsonschema.validate(message | {"type": other.value}, body_schema)


def test_tenants_never_see_node_ids_operators_do(app: FastAPI, db_sessions: Any) -> None:
    stored(db_sessions, "s1", node="gpu-7")
    _, acme = key(db_sessions, "acme")
    _, operator = key(db_sessions, "ops-team", "ops")
    client = TestClient(app)
    schema = client.get("/openapi.json").json()
    assert "node_id" not in schema["components"]["schemas"]["RenderPublic"]["properties"]
    assert "node_id" not in client.get("/v1/renders/s1", headers=acme).json()
    assert "node_id" not in client.get("/v1/renders", headers=acme).json()["items"][0]
    assert "gpu-7" not in json.dumps(schema) + client.get("/v1/renders", headers=acme).text
    assert client.get("/ops/api/sessions/s1", headers=operator).json()["session"]["node_id"] == "gpu-7"


def test_too_many_streams_of_a_key_or_a_link_is_429_with_retry_after(tmp_path: Path, db_sessions: Any) -> None:
    app = make_app(
        tmp_path,
        db_sessions,
        limits=LimitSettings(max_streams_per_key=1),
        links=LinkSettings(max_streams_per_session=1),
    )
    stored(db_sessions, "s1")
    key_id, acme = key(db_sessions, "acme")
    client = TestClient(app)
    slots = streams.stream_slots(app.state)
    slots.take(key_id, 1)  # the key's one stream, held open
    slots.take("link:s1", 1)  # the session's one playback stream
    playback = client.get("/v1/renders/s1", headers=acme).json()["links"]["playback"]["events"]
    for answer in (client.get("/v1/renders/s1/events", headers=acme), client.get(playback.split(":8000")[1])):
        assert answer.status_code == 429, answer.text
        assert answer.json()["code"] == ProblemCode.TOO_MANY_STREAMS.value
        assert int(answer.headers["retry-after"]) == errors.TooManyStreams.RETRY_AFTER_S


def test_a_tenant_at_its_session_limit_gets_429_with_retry_after(tmp_path: Path, db_sessions: Any) -> None:
    """Refused before any node is asked (so no Temporal here), for a JSON create as for a form."""
    app = make_app(tmp_path, db_sessions, limits=LimitSettings(max_sessions_per_tenant=1))
    stored(db_sessions, "s1")
    _, acme = key(db_sessions, "acme")
    client = TestClient(app, headers=acme)
    body = {
        kind: {"asset_id": client.post("/v1/assets", data={"kind": kind}, files={"file": ("f", b"x")}).json()["id"]}
        for kind in ("portrait", "audio")
    }
    answer = client.post("/v1/renders", json=body)
    assert answer.status_code == 429 and answer.json()["code"] == ProblemCode.TOO_MANY_SESSIONS.value, answer.text
    assert int(answer.headers["retry-after"]) >= 1


def test_a_database_outage_is_503_with_retry_after_on_every_path(tmp_path: Path, db_sessions: Any) -> None:
    """The key's look-up finds the database down: in a route's dependency (GET) and in the upload guard (POST)."""
    down = make_sessionmaker(make_engine("postgresql+psycopg://nobody:x@127.0.0.1:9/none"))
    _, acme = key(db_sessions, "acme")  # a well-formed key, looked up in a database that does not answer
    client = TestClient(make_app(tmp_path, down), headers=acme)
    for answer in (client.get("/v1/renders"), client.post("/v1/renders", json={})):
        assert answer.status_code == 503 and answer.json()["code"] == ProblemCode.SERVICE_UNAVAILABLE.value
        assert int(answer.headers["retry-after"]) >= 1


def test_every_refusal_answers_its_code_and_retry_after_where_it_may_pass(app: FastAPI) -> None:
    """Through the app's own handlers, each Refusal as a route would raise it (the node-side 503s need a stack
    without nodes: tests/api/test_validation.py sends a real one); a plain 503 gets a Retry-After too."""
    cases = [
        errors.TooManyStreams("full"),
        errors.ValidationUnavailable("no node"),
        errors.NoNodeForLive("no node", retry_after_s=2.5),
        errors.IdempotencyConflict("other request"),
    ]

    async def refuse(index: int) -> None:
        raise cases[index]

    async def plain() -> None:
        raise HTTPException(503, "a plain one")

    app.add_api_route("/refusal/{index}", refuse)
    app.add_api_route("/plain", plain)
    client = TestClient(app)
    assert int(client.get("/plain").headers["retry-after"]) == outages.RETRY_AFTER_S  # none given: the outage's
    for index, refusal in enumerate(cases):
        answer = client.get(f"/refusal/{index}")
        assert (answer.status_code, answer.json()["code"]) == (refusal.status, refusal.code.value)
        assert ("retry-after" in answer.headers) == (refusal.status in (429, 503))
    assert client.get("/refusal/2").headers["retry-after"] == "3"  # whole seconds, rounded up


def test_an_unready_api_says_when_to_ask_again(tmp_path: Path) -> None:
    empty = make_sessionmaker(make_engine(f"sqlite:///{tmp_path}/unmigrated.sqlite"))
    answer = TestClient(make_app(tmp_path, empty)).get("/readyz")
    assert answer.status_code == 503 and int(answer.headers["retry-after"]) >= 1
