"""`deliver_webhook` in Temporal's ActivityEnvironment, on a real SQLite database, sending to real HTTP servers on
127.0.0.1: an attempt is signed with the endpoint's secret (stored encrypted, or in clear from before
encryption), of a receiver's answer only its first bytes are read however large it is, and a secret that none
of the node's keys opens is recorded as the attempt's error and retried; each attempt and each give-up is counted
once in the node's metrics."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from pydantic import SecretStr
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker
from standardwebhooks import Webhook, WebhookVerificationError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.webhooks import WebhookActivities
from monologue import contracts as c, metrics
from monologue.db import WebhookEndpointRow, make_engine, make_sessionmaker, migrate
from monologue.repo import webhooks as repo_webhooks
from monologue.repo.webhooks import DeliveryFilter
from monologue.schemas import DeliveryStatus, WebhookEvent
from monologue.settings import OutboundSettings, Settings, WebhookSettings
from monologue.webhooks import encryption as webhook_secrets
from tests.local_server import Answer, LocalServer, Received

HUGE = 200 * 1024 * 1024  # a receiver's error page: what the node must not hold
TENANT = "hooks"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path,
        outbound=OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True),
        webhooks=WebhookSettings(allowed_urls=["http://127.0.0.1:*"]),
    )


@pytest.fixture
def db(settings: Settings) -> Iterator[sessionmaker[Any]]:
    migrate(settings.db_url)
    engine = make_engine(settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _queued(db: sessionmaker[Any], settings: Settings, url: str) -> tuple[str, str]:
    """An endpoint at `url` and one pending delivery to it: (delivery id, the endpoint's secret)."""
    with db() as session:
        endpoint, secret = repo_webhooks.create_endpoint_within_limit(
            session,
            tenant=TENANT,
            url=url,
            events=[WebhookEvent.COMPLETED],
            limit=10,
            keys=webhook_secrets.keyring(settings),
        )
        repo_webhooks.create_delivery(
            session,
            delivery_id=f"msg_{endpoint.id}",
            endpoint_id=endpoint.id,
            tenant=TENANT,
            session_id="s1",
            event=WebhookEvent.COMPLETED,
            payload={"type": "session.completed", "data": {"id": "s1"}},
        )
        return f"msg_{endpoint.id}", secret


async def _deliver(db: sessionmaker[Any], settings: Settings, delivery_id: str) -> None:
    activities = WebhookActivities(sessions=db, settings=settings)
    request = c.WebhookInput(
        delivery_id=delivery_id, initial_backoff_s=1, max_backoff_s=1, give_up_after_s=60, timeout_s=30
    )
    await ActivityEnvironment().run(activities.deliver_webhook, request)


def _attempts(db: sessionmaker[Any], delivery_id: str) -> tuple[str, list[tuple[int | None, str | None]]]:
    with db() as session:
        [(delivery, attempts)] = repo_webhooks.list_deliveries(session, where=DeliveryFilter(tenant=TENANT))
    assert delivery.id == delivery_id
    return delivery.status, [(attempt.status_code, attempt.error) for attempt in attempts]


@pytest.mark.parametrize("stored", ["encrypted", "in clear, from before encryption"])
async def test_an_attempt_is_signed_with_the_endpoints_secret(
    db: sessionmaker[Any], settings: Settings, stored: str
) -> None:
    with LocalServer("127.0.0.1") as receiver:
        delivery_id, secret = _queued(db, settings, receiver.url("/hooks"))
        if stored != "encrypted":
            with db() as session:
                session.execute(update(WebhookEndpointRow).values(secret=secret))
                session.commit()
        verified: list[Received] = []

        def receive(request: Received) -> Answer:
            try:
                Webhook(secret).verify(request.body, request.headers)
            except WebhookVerificationError:
                return Answer(400, b"bad signature")
            verified.append(request)
            return Answer(204)

        receiver.routes["/hooks"] = receive
        await _deliver(db, settings, delivery_id)
    assert [request.headers["webhook-id"] for request in verified] == [delivery_id]
    assert _attempts(db, delivery_id) == (DeliveryStatus.DELIVERED, [(204, None)])


class HugeErrorPage:
    """A receiver that answers 500 with a HUGE-byte body, made as it is sent (it never holds it), until the client
    hangs up."""

    def __init__(self) -> None:
        chunk = b"x" * 65536

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self.send_response(500)
                self.send_header("Content-Length", str(HUGE))
                self.end_headers()
                try:
                    for _ in range(HUGE // len(chunk)):
                        self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the node stopped reading: what this test wants

            def log_message(self, *_: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/hooks"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HugeErrorPage:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


async def test_a_huge_error_answer_is_read_only_as_far_as_the_attempt_keeps(
    db: sessionmaker[Any], settings: Settings
) -> None:
    with HugeErrorPage() as receiver:
        delivery_id, _ = _queued(db, settings, receiver.url)
        tracemalloc.start()
        try:
            with pytest.raises(ApplicationError) as failed:
                await _deliver(db, settings, delivery_id)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert not failed.value.non_retryable  # a 500: tried again later
    status, [(code, error)] = _attempts(db, delivery_id)
    assert status == DeliveryStatus.PENDING and code == 500
    assert error is not None and error.startswith("500 Internal Server Error: xxx") and len(error) < 600
    assert peak < HUGE // 20, f"peak {peak / 2**20:.0f} MiB of Python memory for a {HUGE / 2**20:.0f} MiB answer"


async def test_a_secret_no_key_of_the_node_opens_is_the_attempts_error_and_is_retried(
    db: sessionmaker[Any], settings: Settings
) -> None:
    """The node lists other keys than the API encrypted with: nothing is sent, the attempt says which setting to
    fix, and the delivery is retried (the fix needs no new delivery)."""
    with LocalServer("127.0.0.1") as receiver:
        receiver.routes["/hooks"] = Answer(204)
        delivery_id, _ = _queued(db, settings, receiver.url("/hooks"))
        other_keys = settings.webhooks.model_copy(update={"secret_keys": [SecretStr(Fernet.generate_key().decode())]})
        with pytest.raises(ApplicationError) as failed:
            await _deliver(db, settings.model_copy(update={"webhooks": other_keys}), delivery_id)
        assert receiver.received == []
    assert not failed.value.non_retryable and webhook_secrets.KEYS_SETTING in str(failed.value)
    status, [(code, error)] = _attempts(db, delivery_id)
    assert status == DeliveryStatus.PENDING and code is None and error is not None
    assert webhook_secrets.KEYS_SETTING in error


def _deliveries(outcome: metrics.WebhookOutcome) -> float:
    labels = {"event": WebhookEvent.COMPLETED.value, "outcome": outcome.value}
    return metrics.NODE.get_sample_value("monologue_webhook_deliveries_total", labels) or 0.0


async def test_attempts_and_give_ups_are_counted_once_each(db: sessionmaker[Any], settings: Settings) -> None:
    """A failed attempt, then a delivered one; a give-up after the delivery counts nothing, and a give-up retried
    (the activity run twice) counts once."""
    before = {outcome: _deliveries(outcome) for outcome in metrics.WebhookOutcome}
    timed = {"event": WebhookEvent.COMPLETED.value}
    timed_before = metrics.NODE.get_sample_value("monologue_webhook_delivery_seconds_count", timed) or 0.0
    activities = WebhookActivities(sessions=db, settings=settings)
    with LocalServer("127.0.0.1") as receiver:
        answers = iter([Answer(503), Answer(204)])
        receiver.routes["/hooks"] = lambda _request: next(answers)
        delivered, _ = _queued(db, settings, receiver.url("/hooks"))
        with pytest.raises(ApplicationError):
            await _deliver(db, settings, delivered)
        await _deliver(db, settings, delivered)
        abandoned, _ = _queued(db, settings, receiver.url("/other"))
    for delivery_id in (delivered, abandoned, abandoned):
        given_up = c.WebhookGivenUpInput(delivery_id=delivery_id, error="the period ended")
        await ActivityEnvironment().run(activities.webhook_given_up, given_up)
    counted = {outcome: _deliveries(outcome) - before[outcome] for outcome in metrics.WebhookOutcome}
    assert counted == {
        metrics.WebhookOutcome.FAILED: 1,
        metrics.WebhookOutcome.DELIVERED: 1,
        metrics.WebhookOutcome.GAVE_UP: 1,
    }
    assert metrics.NODE.get_sample_value("monologue_webhook_delivery_seconds_count", timed) == timed_before + 2
