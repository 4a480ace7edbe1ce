"""`/v1/webhooks` on the real API (uvicorn on a thread, no Temporal: these routes need none), on SQLite and on a
real PostgreSQL: a create never waits for a database connection on the event loop, the tenant's endpoint limit
holds under concurrent creates, a URL no request could go to is a 422, and the secret shown once is stored only
encrypted and dropped when the endpoint is deleted."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, event, text
from standardwebhooks import Webhook

from monologue import apikeys
from monologue.client import auth
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.settings import OutboundSettings, Settings, WebhookSettings
from monologue.webhooks import encryption as webhook_secrets
from tests.helpers import postgres_database, serve_api

TENANT = "hooks"
LIMIT = 10
CREATES = 20  # at once, against a limit of LIMIT


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/db.sqlite"
        migrate(url)
        yield url
        return
    with postgres_database() as url:
        migrate(url)
        yield url


def _settings(home: Path, database_url: str) -> Settings:
    # Local receivers stand in for the internet: 127.0.0.1 over http is allowed, nothing else.
    return Settings(
        home=home,
        database_url=database_url,
        outbound=OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True),
        webhooks=WebhookSettings(allowed_urls=["http://127.0.0.1:*"], max_endpoints=LIMIT),
    )


def _key(database_url: str) -> dict[str, str]:
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as db:
            return auth(apikeys.create_key(db, tenant=TENANT)[1])
    finally:
        engine.dispose()


def _on_an_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _engine(app: Any) -> Engine:
    engine: Engine = app.state.services.sessions.kw["bind"]
    return engine


def test_a_create_never_waits_for_a_database_connection_on_the_event_loop(tmp_path: Path) -> None:
    """Waiting for a connection (the pool empty) on the event loop would stall every request of the process; the
    create's database work runs on the thread pool, where only it waits."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    key = _key(url)
    checkouts: list[bool] = []
    with serve_api(_settings(tmp_path, url)) as (api, app):
        event.listen(_engine(app), "checkout", lambda *_: checkouts.append(_on_an_event_loop()))
        created = httpx.post(f"{api}/v1/webhooks", json={"url": "http://127.0.0.1:9/hooks"}, headers=key, timeout=60)
    assert created.status_code == 201, created.text
    assert checkouts and not any(checkouts), f"checkouts on the event loop: {checkouts}"


def test_a_url_with_a_port_out_of_range_is_refused_with_422(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    key = _key(url)
    with serve_api(_settings(tmp_path, url)) as (api, _):
        refused = httpx.post(
            f"{api}/v1/webhooks", json={"url": "http://127.0.0.1:99999/hooks"}, headers=key, timeout=60
        )
        assert refused.status_code == 422, refused.text
        assert "99999" in refused.json()["detail"]
        assert httpx.get(f"{api}/v1/webhooks", headers=key, timeout=60).json()["items"] == []


def test_concurrent_creates_make_exactly_the_tenants_limit_of_endpoints(tmp_path: Path, database_url: str) -> None:
    key = _key(database_url)
    with serve_api(_settings(tmp_path, database_url)) as (api, _):
        barrier = Barrier(CREATES)

        def create(number: int) -> httpx.Response:
            barrier.wait()
            hook = {"url": f"http://127.0.0.1:9/hooks/{number}"}
            return httpx.post(f"{api}/v1/webhooks", json=hook, headers=key, timeout=120)

        with ThreadPoolExecutor(CREATES) as pool:
            answers = list(pool.map(create, range(CREATES)))
        listed = httpx.get(f"{api}/v1/webhooks", headers=key, timeout=60).json()["items"]
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [201] * LIMIT + [422] * (CREATES - LIMIT), [answer.text for answer in answers]
    assert len(listed) == LIMIT
    refusal = f"tenant {TENANT} has {LIMIT} webhook endpoints, the limit (MONOLOGUE_WEBHOOKS__MAX_ENDPOINTS)"
    assert {answer.json()["detail"] for answer in answers if answer.status_code == 422} == {refusal}


def test_the_secret_shown_once_is_stored_only_encrypted_and_dropped_on_delete(
    tmp_path: Path, database_url: str
) -> None:
    key = _key(database_url)
    settings = _settings(tmp_path, database_url)
    with serve_api(settings) as (api, _):
        created = httpx.post(f"{api}/v1/webhooks", json={"url": "http://127.0.0.1:9/a"}, headers=key, timeout=60)
        endpoint = created.json()
        secret = endpoint["secret"]
        Webhook(secret)  # a secret any Standard Webhooks library takes
        stored = _stored(database_url, endpoint["id"])
        assert stored is not None and secret not in stored and secret.removeprefix("whsec_") not in stored
        assert webhook_secrets.unseal(webhook_secrets.keyring(settings), stored) == secret
        assert (tmp_path / "webhook-key").stat().st_mode & 0o777 == 0o600  # no key set: the file's
        deleted = httpx.delete(f"{api}/v1/webhooks/{endpoint['id']}", headers=key, timeout=60)
        assert deleted.status_code == 204
    assert _stored(database_url, endpoint["id"]) is None  # the row is kept (its deliveries list it), not the secret


def _stored(database_url: str, endpoint_id: str) -> str | None:
    """The secret column as the database holds it, read without the app's models."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            query = text("SELECT secret FROM webhook_endpoints WHERE id = :id")
            found: str | None = connection.execute(query, {"id": endpoint_id}).scalar_one()
            return found
    finally:
        engine.dispose()
