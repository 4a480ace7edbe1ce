"""A webhook receiver down for longer than the retry period (issue 28, item 6), on a real stack of its own.

The stack's schedule is the production one scaled down (0.2 s doubling to 1 s, given up after 8 s, where the
defaults are 5 s doubling to 1 h for 27 h): the same settings, the same workflow and the same Temporal retry
policy. The session whose end is the message completes with the frames of a clean render; the delivery is
tried with growing waits, then given up, and the delivery log (the tenant's and the operator's) says so and why;
once the receiver is back it gets later messages and never the given-up one. No assertion on how long anything
takes, only on bounds the retry policy guarantees (no attempt earlier than its back-off, no give-up before the
period less one back-off), which load can only widen."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
from temporalio.api.enums.v1 import RetryState
from temporalio.client import WorkflowExecutionStatus

from api.submit import TERMINAL
from cli.stack import Stack, free_port
from monologue import apikeys, contracts as c, temporal_client
from monologue.client import auth
from monologue.db import make_engine, make_sessionmaker
from monologue.settings import ApiSettings, OutboundSettings, Settings, TemporalSettings, WebhookSettings
from tests.helpers import poll, register_api, wav_bytes
from tests.local_server import Answer, LocalServer

pytestmark = pytest.mark.slow
TENANT = "outage"
INITIAL_BACKOFF_S, MAX_BACKOFF_S, GIVE_UP_AFTER_S = 0.2, 1.0, 8.0
T = TypeVar("T")


@pytest.fixture(scope="module")
def outage_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = Settings(
        home=tmp_path_factory.mktemp("outage"),
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        outbound=OutboundSettings(allowed_ranges=["127.0.0.1/32"], allow_http=True),
        webhooks=WebhookSettings(
            allowed_urls=["http://127.0.0.1:*"],
            initial_backoff_s=INITIAL_BACKOFF_S,
            max_backoff_s=MAX_BACKOFF_S,
            give_up_after_s=GIVE_UP_AFTER_S,
            timeout_s=2.0,
        ),
    )
    stack = Stack(settings)
    stack.start()
    register_api(stack)
    yield stack
    stack.stop()


def _api(stack: Stack, key: str) -> httpx.Client:
    return httpx.Client(base_url=str(stack.settings.api.public_url), headers=auth(key), timeout=30)


def _tenant_key(stack: Stack) -> str:
    engine = make_engine(stack.settings.db_url)
    with make_sessionmaker(engine)() as db:
        key = apikeys.create_key(db, tenant=TENANT)[1]
    engine.dispose()
    return key


def _until(check: Callable[[], T | None], what: str, timeout_s: float = 120) -> T:
    deadline = time.monotonic() + timeout_s
    while (value := check()) is None:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def _deliveries(api: httpx.Client, session_id: str) -> list[dict[str, Any]]:
    """The session's deliveries as the tenant sees them; the API answers normally all along (no 500, no hang)."""
    answer = api.get("/v1/webhooks/deliveries")
    assert answer.status_code == 200, answer.text
    return [delivery for delivery in answer.json()["items"] if delivery["session_id"] == session_id]


def _ended(api: httpx.Client, session_id: str) -> dict[str, Any] | None:
    found = _deliveries(api, session_id)
    return found[0] if len(found) == 1 and found[0]["status"] != "pending" else None


def _render(api: httpx.Client, portrait: bytes) -> str:
    files = {"portrait": ("p.jpg", portrait), "audio": ("a.wav", wav_bytes(np.zeros(16_000)))}
    created = api.post("/v1/renders", files=files)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def _frames(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


@dataclass(frozen=True)
class Recorded:
    """What Temporal recorded of a delivery's workflow: the retry policy it ran its attempts under, the last
    attempt's number, why the retries ended, and whether the workflow is closed."""

    initial: timedelta
    coefficient: float
    maximum: timedelta
    maximum_attempts: int
    schedule_to_close: timedelta
    last_attempt: int
    retry_state: int
    status: WorkflowExecutionStatus | None


async def _recorded(stack: Stack, delivery_id: str) -> Recorded:
    client = await temporal_client.connect(stack.settings.temporal)
    handle = client.get_workflow_handle(c.webhook_workflow_id(delivery_id))
    # The delivery reads as ended once `webhook_given_up` has recorded it; the workflow closes just after.
    await asyncio.wait_for(handle.result(), timeout=60)
    status = (await handle.describe()).status
    events = (await handle.fetch_history()).events
    # The first activity is the delivery (the second, `webhook_given_up`, records the end).
    scheduled = next(e for e in events if e.HasField("activity_task_scheduled_event_attributes"))
    assert scheduled.activity_task_scheduled_event_attributes.activity_type.name == c.DELIVER_WEBHOOK
    started = next(e for e in events if e.HasField("activity_task_started_event_attributes"))
    ended = next(
        e.activity_task_failed_event_attributes
        if e.HasField("activity_task_failed_event_attributes")
        else e.activity_task_timed_out_event_attributes
        for e in events
        if e.HasField("activity_task_failed_event_attributes") or e.HasField("activity_task_timed_out_event_attributes")
    )
    attributes = scheduled.activity_task_scheduled_event_attributes
    policy = attributes.retry_policy
    return Recorded(
        initial=policy.initial_interval.ToTimedelta(),
        coefficient=policy.backoff_coefficient,
        maximum=policy.maximum_interval.ToTimedelta(),
        maximum_attempts=policy.maximum_attempts,
        schedule_to_close=attributes.schedule_to_close_timeout.ToTimedelta(),
        last_attempt=started.activity_task_started_event_attributes.attempt,
        retry_state=ended.retry_state,
        status=status,
    )


def test_a_receiver_down_past_the_retry_period_gets_nothing_and_the_session_is_untouched(
    outage_stack: Stack, sample_portrait: bytes
) -> None:
    stack, port, key = outage_stack, free_port(), _tenant_key(outage_stack)
    with _api(stack, key) as api, _api(stack, stack.api_key) as clean_api:
        created = api.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/hooks"})  # nothing listens there
        assert created.status_code == 201, created.text
        session_id = _render(api, sample_portrait)
        clean_id = _render(clean_api, sample_portrait)  # the stack's own tenant has no endpoint: a clean render
        url = str(api.base_url)
        session = poll(url, session_id, lambda s: s["status"] in TERMINAL, timeout_s=240, api_key=key)
        assert session["status"] == "completed" and session["error"] is None, session
        delivery = _until(lambda: _ended(api, session_id), "the delivery to end", timeout_s=GIVE_UP_AFTER_S * 10)
        clean = poll(url, clean_id, lambda s: s["status"] in TERMINAL, timeout_s=240, api_key=stack.api_key)
        assert clean["status"] == "completed", clean
        frames = _frames(stack, session_id)
        assert frames and frames == _frames(stack, clean_id)
        assert delivery["endpoint_id"] == created.json()["id"] and delivery["event"] == "session.completed"
        _check_given_up(delivery)
        _check_recorded(asyncio.run(_recorded(stack, delivery["id"])), delivery)
        shown = clean_api.get(f"/ops/api/sessions/{session_id}/webhooks")  # the operator's view of the session
        assert shown.status_code == 200 and shown.json()["items"] == [delivery], shown.text
        _nothing_comes_after_the_give_up(api, sample_portrait, port, delivery)


def _check_given_up(delivery: dict[str, Any]) -> None:
    """Failed, every attempt in the log with why it failed, the end saying it was given up and why, and the
    attempts as far apart as the back-off says (at least: load only delays them)."""
    attempts = delivery["attempts"]
    assert delivery["status"] == "failed" and delivery["finished_at"] is not None, delivery
    assert len(attempts) >= 3 and [a["attempt"] for a in attempts] == list(range(1, len(attempts) + 1)), attempts
    assert all(a["status_code"] is None for a in attempts), attempts  # no answer: nothing listens
    errors = [a["error"] or "" for a in attempts]
    assert all("ConnectionRefusedError" in error for error in errors), errors  # and the log says why
    error = delivery["error"] or ""
    assert f"given up after {GIVE_UP_AFTER_S:g} s" in error and "ConnectionRefusedError" in error, error
    starts = [datetime.fromisoformat(a["started_at"]) for a in attempts]
    waits = [min(INITIAL_BACKOFF_S * 2**i, MAX_BACKOFF_S) for i in range(len(attempts) - 1)]  # growing, capped
    assert (starts[-1] - starts[0]).total_seconds() >= 0.9 * sum(waits), (starts, waits)
    # Temporal stops when the next wait would end past the period: never before the period less the longest wait.
    lasted = datetime.fromisoformat(delivery["finished_at"]) - datetime.fromisoformat(delivery["created_at"])
    assert lasted.total_seconds() >= GIVE_UP_AFTER_S - MAX_BACKOFF_S, delivery


def _check_recorded(recorded: Recorded, delivery: dict[str, Any]) -> None:
    """Temporal ran the attempts under the settings' policy, ended them because the period was over, logged every
    one it made, and closed the workflow: nothing more will be tried."""
    policy = (recorded.initial, recorded.coefficient, recorded.maximum, recorded.maximum_attempts)
    assert policy == (timedelta(seconds=INITIAL_BACKOFF_S), 2.0, timedelta(seconds=MAX_BACKOFF_S), 0), recorded
    assert recorded.schedule_to_close == timedelta(seconds=GIVE_UP_AFTER_S), recorded
    assert recorded.retry_state == RetryState.RETRY_STATE_TIMEOUT, recorded
    assert recorded.last_attempt == len(delivery["attempts"]), recorded
    assert recorded.status == WorkflowExecutionStatus.COMPLETED, recorded


def _nothing_comes_after_the_give_up(api: httpx.Client, portrait: bytes, port: int, given_up: dict[str, Any]) -> None:
    """The receiver comes back: the next message (a live session cancelled at once) reaches it, and by then the
    given-up one has not, nor will it (its workflow is closed)."""
    with LocalServer("127.0.0.1", port) as receiver:
        receiver.routes["/hooks"] = Answer(204)
        live = api.post("/v1/sessions", files={"portrait": ("p.jpg", portrait)})
        assert live.status_code == 201, live.text
        session_id = live.json()["id"]
        assert api.post(f"/v1/renders/{session_id}/cancel").status_code == 202
        fresh = _until(lambda: _ended(api, session_id), "the next message to be delivered")
        got = [request.headers["webhook-id"] for request in receiver.received]
    assert fresh["status"] == "delivered" and fresh["event"] == "session.cancelled", fresh
    assert got == [fresh["id"]] and given_up["id"] not in got
