"""Webhooks on the real stack: a tenant's endpoint gets `session.completed`, `session.failed` and
`session.cancelled` (and `session.started` when it asks), signed per Standard Webhooks. The receiver is a real
local server, down for the first attempts (nothing listens on its port); once it is up it gets each message
exactly once, and its signature verifies. Every attempt is recorded and shown by the API and the ops UI. A session's
own `callback_url` gets its end the same way, with its `metadata`. (The stack's back-off is short: 0.5 s, doubling,
at most 1 s.)"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from standardwebhooks import Webhook, WebhookVerificationError
from websockets.exceptions import ConnectionClosed

from api.submit import TERMINAL
from cli.stack import Stack, free_port
from monologue import apikeys
from monologue.client import Client, auth
from monologue.db import make_engine, make_sessionmaker
from monologue.errors import ApiError
from tests.browser import CHROMIUM_ARGS, chromium_path
from tests.conftest import SAMPLES
from tests.helpers import poll, wav_bytes
from tests.local_server import Answer, LocalServer, Received

pytestmark = pytest.mark.slow
TENANT = "hooks"


@pytest.fixture(scope="module")
def tenant_key(stack: Stack) -> str:
    engine = make_engine(stack.settings.db_url)
    with make_sessionmaker(engine)() as db:
        key = apikeys.create_key(db, tenant=TENANT)[1]
    engine.dispose()
    return key


def _api(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=str(stack.settings.api.public_url), headers=auth(key), timeout=60)


def _deliveries(api: httpx.Client, session_ids: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = api.get("/v1/webhooks/deliveries").json()["items"]
    return [delivery for delivery in found if delivery["session_id"] in session_ids]


def _until(check: Any, timeout_s: float = 90) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return value


def _three_endings(api: httpx.Client, portrait: bytes) -> list[str]:
    """A completed render (a second of silence), a live session cancelled, and one failed (bad audio)."""
    files = {"portrait": ("p.jpg", portrait), "audio": ("a.wav", wav_bytes(np.zeros(16_000)))}
    completed = api.post("/v1/renders", files=files).json()["id"]
    cancelled = api.post("/v1/sessions", files={"portrait": ("p.jpg", portrait)}).json()
    failed = api.post("/v1/sessions", files={"portrait": ("p.jpg", portrait)}).json()
    assert api.post(f"/v1/renders/{cancelled['id']}/cancel").status_code == 202
    from websockets.sync.client import connect

    with connect(failed["audio_ticket"]["url"]) as socket:  # a ticket: no key on the socket
        socket.send(b"\x01\x02\x03")  # not whole samples: refused, and the session ends with no audio
        with contextlib.suppress(ConnectionClosed):
            for _ in socket:
                pass
    return [completed, cancelled["id"], failed["id"]]


def test_each_event_reaches_a_receiver_that_was_down_exactly_once_signed(
    stack: Stack, tenant_key: str, sample_portrait: bytes
) -> None:
    port = free_port()
    with _api(stack, tenant_key) as api:
        created = api.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/hooks"})
        assert created.status_code == 201, created.text
        endpoint = created.json()
        assert endpoint["secret"].startswith("whsec_") and set(endpoint["events"]) == {
            "session.completed",
            "session.failed",
            "session.cancelled",
        }
        assert "secret" not in api.get("/v1/webhooks").json()["items"][0]  # shown once
        sessions = _three_endings(api, sample_portrait)
        for session_id in sessions:
            poll(str(api.base_url), session_id, lambda s: s["status"] in TERMINAL, api_key=tenant_key)

        # Down: every delivery is tried, and fails, at least twice.
        def tried_twice() -> bool:
            found = _deliveries(api, sessions)
            return len(found) == 3 and all(len(delivery["attempts"]) >= 2 for delivery in found)

        def all_delivered() -> list[dict[str, Any]] | None:
            found = _deliveries(api, sessions)
            return found if all(delivery["status"] == "delivered" for delivery in found) else None

        _until(tried_twice)
        verifier = Webhook(endpoint["secret"])
        bad_signatures: list[str] = []

        def receive(request: Received) -> Answer:
            try:
                verifier.verify(request.body, request.headers)
            except WebhookVerificationError as err:
                bad_signatures.append(str(err))
                return Answer(400, b"bad signature")
            return Answer(204)

        with LocalServer("127.0.0.1", port) as receiver:
            receiver.routes["/hooks"] = receive
            deliveries = _until(all_delivered, 60)
            time.sleep(1.5)  # longer than the back-off: a second copy of any message would have come by now
            got = list(receiver.received)
    assert bad_signatures == []
    by_id = {request.headers["webhook-id"]: json.loads(request.body) for request in got}
    assert len(got) == len(by_id) == 3  # each message once: nothing to deduplicate
    assert by_id.keys() == {delivery["id"] for delivery in deliveries}
    events = {message["data"]["id"]: message["type"] for message in by_id.values()}
    assert events == dict(zip(sessions, ["session.completed", "session.cancelled", "session.failed"], strict=True))
    for delivery in deliveries:  # every attempt recorded: the refused connections, then the 204
        *down, up = delivery["attempts"]
        assert len(down) >= 2 and all(a["status_code"] is None and a["error"] for a in down), delivery
        assert up["status_code"] == 204 and up["error"] is None
        assert [a["attempt"] for a in delivery["attempts"]] == list(range(1, len(delivery["attempts"]) + 1))
    _ops_page_shows_the_attempts(stack, next(d for d in deliveries if d["session_id"] == sessions[0]))


def _ops_page_shows_the_attempts(stack: Stack, delivery: dict[str, Any]) -> None:
    """The operator sees the session's message (the same one, every attempt) in /ops, on the session's page."""
    url, session_id = str(stack.settings.api.public_url), delivery["session_id"]
    shown = httpx.get(f"{url}/ops/api/sessions/{session_id}/webhooks", headers=auth(stack.api_key), timeout=10)
    assert shown.json()["items"] == [delivery]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.add_init_script(f"sessionStorage.setItem('monologue-ops-key', {stack.api_key!r})")
            page.goto(f"{url}/ops/sessions/{session_id}")
            row = page.locator("#webhooks tbody tr")
            row.first.wait_for(timeout=20_000)
            assert row.count() == 1
            assert row.first.get_attribute("data-status") == "delivered"
            assert int(row.first.locator(".attempts").inner_text()) == len(delivery["attempts"])
        finally:
            browser.close()


def test_endpoints_only_go_where_the_operator_allows(stack: Stack, tenant_key: str) -> None:
    with _api(stack, tenant_key) as api:
        for url, setting in [
            ("http://127.0.0.2:9/hooks", "MONOLOGUE_WEBHOOKS__ALLOWED_URLS"),  # not an allowed URL
            ("http://169.254.169.254/latest", "MONOLOGUE_WEBHOOKS__ALLOWED_URLS"),
            ("ftp://127.0.0.1/hooks", "https://"),
        ]:
            refused = api.post("/v1/webhooks", json={"url": url})
            assert refused.status_code == 422 and setting in refused.json()["detail"], (url, refused.text)
        unknown_event = api.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/x", "events": ["session.paused"]})
        assert unknown_event.status_code == 422 and unknown_event.json()["errors"]


def test_session_started_goes_only_to_endpoints_that_list_it_and_is_queued_before_the_end(
    stack: Stack, tenant_key: str
) -> None:
    port = free_port()
    with _api(stack, tenant_key) as api, LocalServer("127.0.0.1", port) as receiver:
        receiver.routes["/both"] = receiver.routes["/ends"] = Answer(204)
        both = api.post(
            "/v1/webhooks",
            json={"url": f"http://127.0.0.1:{port}/both", "events": ["session.started", "session.completed"]},
        ).json()
        ends = api.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/ends"}).json()  # the default
        assert ends["events"] == ["session.completed", "session.failed", "session.cancelled"]
        portrait = (SAMPLES / "portrait.jpg").read_bytes()
        files = {"portrait": ("p.jpg", portrait), "audio": ("a.wav", wav_bytes(np.zeros(16_000)))}
        session_id = api.post("/v1/renders", files=files).json()["id"]
        poll(str(api.base_url), session_id, lambda s: s["status"] in TERMINAL, api_key=tenant_key)

        def delivered() -> list[dict[str, Any]] | None:
            found = [d for d in _deliveries(api, [session_id]) if d["endpoint_id"] in (both["id"], ends["id"])]
            return found if len(found) == 3 and all(d["status"] == "delivered" for d in found) else None

        deliveries = _until(delivered, 60)
        time.sleep(1.5)  # longer than the back-off: a second copy of any message would have come by now
        got = [(request.path, json.loads(request.body)) for request in receiver.received]
    by_endpoint = {
        endpoint["id"]: sorted((d["created_at"], d["event"]) for d in deliveries if d["endpoint_id"] == endpoint["id"])
        for endpoint in (both, ends)
    }
    assert [event for _, event in by_endpoint[both["id"]]] == ["session.started", "session.completed"]  # queue order
    assert [event for _, event in by_endpoint[ends["id"]]] == ["session.completed"]
    mine = sorted((path, message["type"], message["data"]["status"]) for path, message in got)
    assert mine == [
        ("/both", "session.completed", "completed"),
        ("/both", "session.started", "running"),
        ("/ends", "session.completed", "completed"),
    ]


def test_a_callback_url_gets_the_sessions_end_signed_with_its_metadata(stack: Stack, sample_portrait: bytes) -> None:
    """A render made through the typed client with `metadata` and a `callback_url` (the tenant has no endpoint):
    the callback gets session.completed signed with the create's `callback_secret` and carrying the metadata, which
    the session and every event of its stream show too; a retry with the same Idempotency-Key gets the same secret,
    and with other metadata a 422; the delivery is in the tenant's log, its endpoint not among the tenant's."""
    engine = make_engine(stack.settings.db_url)
    with make_sessionmaker(engine)() as db:
        key = apikeys.create_key(db, tenant="callbacks")[1]
    engine.dispose()
    metadata = {"order": "A-17", "attempt": 2, "rush": True, "note": None}
    secret: dict[str, str] = {}
    verified: list[dict[str, Any]] = []

    def receive(request: Received) -> Answer:
        try:
            Webhook(secret["whsec"]).verify(request.body, request.headers)
        except (KeyError, WebhookVerificationError):
            return Answer(400, b"bad signature")
        verified.append(json.loads(request.body))
        return Answer(204)

    with LocalServer("127.0.0.1") as receiver, Client(str(stack.settings.api.public_url), api_key=key) as client:
        receiver.routes["/done"] = receive
        create = {
            "portrait": sample_portrait,
            "audio": wav_bytes(np.zeros(16_000)),
            "metadata": metadata,
            "callback_url": receiver.url("/done"),
            "idempotency_key": uuid.uuid4().hex,
        }
        created = client.create_render(**create)
        assert created.callback_secret is not None and created.callback_secret.startswith("whsec_")
        secret["whsec"] = created.callback_secret
        again = client.create_render(**create)
        assert (again.id, again.callback_secret) == (created.id, created.callback_secret)
        with pytest.raises(ApiError) as reused:
            client.create_render(**create | {"metadata": {"order": "B-2"}})
        assert reused.value.status == 422 and reused.value.problem["code"] == "idempotency-key-reused"

        events = list(client.events(created.id))
        assert events[-1].status == "completed" and all(event.metadata == metadata for event in events)
        shown = client.get(created.id)
        assert (shown.metadata, shown.callback_url, shown.callback_secret) == (metadata, receiver.url("/done"), None)

        def delivered() -> list[Any] | None:
            found = client.webhook_deliveries(session_id=created.id).items
            return found if found and all(d.status == "delivered" for d in found) else None

        [delivery] = _until(delivered, 60)
        assert client.list_webhooks().items == []
        got = list(receiver.received)
    assert [(a.attempt, a.status_code) for a in delivery.attempts] == [(1, 204)]  # the receiver was up: once
    assert [request.headers["webhook-id"] for request in got] == [delivery.id]
    [message] = verified
    assert (message["type"], message["data"]["id"], message["data"]["status"]) == (
        "session.completed",
        created.id,
        "completed",
    )
    assert message["data"]["metadata"] == metadata
