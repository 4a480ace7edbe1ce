"""A create's `metadata` and `callback_url`, in process on SQLite and local storage without Temporal: a refusal is a
422 naming the field and writes nothing; a session's callback endpoint is its own (not listed, counted or deleted
among the tenant's endpoints, gone with the session) and takes only that session's endings; the schema lists both.
The whole path (signed delivery, the events stream, idempotency) is on the real stack: tests/test_webhooks.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from monologue import repo, webhooks
from monologue.db import SessionRow, WebhookEndpointRow
from monologue.repo import lifecycle as repo_lifecycle, webhooks as repo_webhooks
from monologue.schemas import METADATA_BYTES, METADATA_KEYS, WebhookEvent
from monologue.settings import OutboundSettings, WebhookSettings
from monologue.webhooks import encryption as webhook_secrets
from tests.api.in_process import key, make_app, stored

URL = {"url": "https://example.com/input"}


def test_bad_metadata_or_callback_url_is_a_422_naming_it_and_writes_nothing(
    tmp_path: Path, db_sessions: sessionmaker[Any]
) -> None:
    app = make_app(tmp_path, db_sessions)  # the operator's defaults: https only, public addresses only
    client = TestClient(app, headers=key(db_sessions, "acme")[1])
    too_many = {f"k{i}": i for i in range(METADATA_KEYS + 1)}
    too_big = {f"k{i}": "x" * (METADATA_BYTES // 4) for i in range(4)}
    refused: list[tuple[dict[str, Any], str]] = [
        ({"metadata": too_many}, f"metadata: Dictionary should have at most {METADATA_KEYS} items"),
        ({"metadata": {"k" * 41: 1}}, "should have at most 40 characters"),
        ({"metadata": {"": 1}}, "should have at least 1 character"),
        ({"metadata": {"nested": {"a": 1}}}, "metadata.nested: a value is a string, a finite number"),
        ({"metadata": {"list": [1]}}, "metadata.list: a value is a string"),
        ({"metadata": too_big}, f"more than the limit of {METADATA_BYTES}"),
        ({"callback_url": "http://127.0.0.1:9/hook"}, "callback_url: 'http://127.0.0.1:9/hook' must be an https://"),
        ({"callback_url": "https://169.254.169.254/latest"}, "callback_url: 169.254.169.254 is not an allowed"),
        ({"callback_url": "https://10.1.2.3/hook"}, "MONOLOGUE_OUTBOUND__ALLOWED_RANGES"),
        ({"callback_url": "https://user:pw@example.com/"}, "callback_url: 'https://user:pw@example.com/' carries"),
    ]
    files = {"portrait": ("p.jpg", b"portrait"), "audio": ("a.wav", b"speech")}
    for given, problem in refused:
        form = {name: json.dumps(value) if name == "metadata" else value for name, value in given.items()}
        answers = {
            "multipart": client.post("/v1/renders", data=form, files=files),
            "json": client.post("/v1/renders", json={"portrait": URL, "audio": URL, **given}),
            "live json": client.post("/v1/sessions", json={"portrait": URL, **given}),
        }
        for how, answer in answers.items():
            assert answer.status_code == 422 and problem in answer.json()["detail"], (how, given, answer.text)
    for text, problem in [("{", "metadata: not valid JSON"), ("[1, 2]", "metadata: Input should be a valid dict")]:
        answer = client.post("/v1/renders", data={"metadata": text}, files=files)
        assert answer.status_code == 422 and answer.json()["detail"].startswith(problem), answer.text
    with db_sessions() as db:
        assert db.query(SessionRow).count() == 0 and db.query(WebhookEndpointRow).count() == 0
    assert not (tmp_path / "objects" / "sessions").exists()


def test_a_sessions_callback_endpoint_is_its_own_and_takes_only_its_endings(
    tmp_path: Path, db_sessions: sessionmaker[Any]
) -> None:
    settings = {
        "outbound": OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True),
        "webhooks": WebhookSettings(allowed_urls=["http://127.0.0.1:*"], max_endpoints=1),
    }
    app = make_app(tmp_path, db_sessions, **settings)
    client = TestClient(app, headers=key(db_sessions, "acme")[1])
    metadata = {"order": "A-17", "attempt": 2, "rush": True, "note": None}
    for session_id in ("with-callback", "without"):
        stored(db_sessions, session_id)
    keys = webhook_secrets.keyring(app.state.services.settings)
    with db_sessions() as db:
        db.execute(update(SessionRow).where(SessionRow.id == "with-callback").values(client_metadata=metadata))
        db.commit()
        own = repo_webhooks.create_session_endpoint(
            db, tenant="acme", session_id="with-callback", url="http://127.0.0.1:9/own", keys=keys
        )
        secret = repo_webhooks.session_secret(db, session_id="with-callback", keys=keys)
    assert secret is not None and secret.startswith("whsec_")

    shown = client.get("/v1/renders/with-callback").json()
    assert (shown["metadata"], shown["callback_url"], shown["callback_secret"]) == (
        metadata,
        "http://127.0.0.1:9/own",
        None,  # only in the create's answer
    )
    assert client.get("/v1/webhooks").json()["items"] == []
    assert client.delete(f"/v1/webhooks/{own.id}").status_code == 404
    tenants = client.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/tenant"})
    assert tenants.status_code == 201, tenants.text  # the session's endpoint takes none of the tenant's one place

    with db_sessions() as db:

        def sent_to(session_id: str, event: WebhookEvent) -> set[str]:
            found = repo_webhooks.subscribed(db, tenant="acme", session_id=session_id, event=event)
            return {endpoint.url for endpoint in found}

        assert sent_to("with-callback", WebhookEvent.COMPLETED) == {
            "http://127.0.0.1:9/own",
            "http://127.0.0.1:9/tenant",
        }
        assert sent_to("without", WebhookEvent.COMPLETED) == {"http://127.0.0.1:9/tenant"}
        assert sent_to("with-callback", WebhookEvent.STARTED) == set()  # the endings only
        row = repo.get_session(db, session_id="with-callback")
        assert row is not None
        message = webhooks.payload(row, WebhookEvent.COMPLETED, app.state.services.settings)
        assert message["data"]["metadata"] == metadata
        repo_lifecycle.keep_tombstone(db, session_id="with-callback")  # a DELETE: metadata and secret go
        db.expire_all()
        deleted = repo_webhooks.get_endpoint(db, endpoint_id=own.id)
        assert deleted is not None and deleted.disabled_at is not None
        assert (row.client_metadata, deleted.secret, sent_to("with-callback", WebhookEvent.COMPLETED)) == (
            None,
            None,
            {"http://127.0.0.1:9/tenant"},
        )
        repo.delete_session(db, session_id="with-callback")  # a start undone: its endpoint goes with it
    with db_sessions() as db:
        assert repo_webhooks.get_endpoint(db, endpoint_id=own.id) is None


def test_the_schema_lists_metadata_and_callback_url(tmp_path: Path, db_sessions: sessionmaker[Any]) -> None:
    schema = TestClient(make_app(tmp_path, db_sessions)).get("/openapi.json").json()
    components = schema["components"]["schemas"]
    for path in ("/v1/renders", "/v1/sessions"):
        content = schema["paths"][path]["post"]["requestBody"]["content"]
        form = components[content["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]]
        assert {"metadata", "callback_url"} <= form["properties"].keys()
        assert {"metadata", "callback_url"} <= content["application/json"]["schema"]["properties"].keys()
    assert {"metadata", "callback_url", "callback_secret"} <= components["RenderPublic"]["properties"].keys()
    assert "metadata" in components["WebhookSession"]["properties"]  # every webhook message's `data`
