"""Scheduling through the real stack (tests/conftest.py: one node with two slots): a live session that finds every
slot held by renders takes one at a render's next chunk boundary (the most recently started yields), and that
render, resumed from its anchors on its next lease, makes the very frames of a render nobody interrupted; a live
session that cannot get a node in time is refused with 503 + Retry-After and leaves nothing behind. The
workflow-level order (classes, tenants, weights) is tested on the dev server's matcher in
tests/workflows/test_lease_order.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select
from temporalio.client import Client as TemporalClient

from cli.stack import Stack
from monologue import contracts as c, repo
from monologue.client import ApiError, Client
from monologue.db import SessionRow, make_engine, make_sessionmaker
from monologue.media import normalise_audio
from monologue.settings import SchedSettings
from tests.conftest import SAMPLES
from tests.helpers import api_key, get, poll, post, serve_api, submit, wait_done, wav_bytes

PORTRAIT = SAMPLES / "portrait.jpg"


def _frame_hashes(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


def _long_speech() -> bytes:
    """The sample speech three times over (about 21 s): a render long enough to be under way when a live session
    comes, whatever this machine's speed."""
    pcm = np.frombuffer(normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav[44:], dtype="<i2")
    return wav_bytes(np.tile(pcm, 3))


def _row(stack: Stack, session_id: str) -> SessionRow | None:
    engine = make_engine(stack.settings.db_url)
    try:
        with make_sessionmaker(engine)() as db:
            return repo.get_session(db, session_id=session_id)
    finally:
        engine.dispose()


def test_a_preempted_render_makes_the_frames_of_an_uninterrupted_one(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    speech = _long_speech()
    clean = wait_done(api_url, submit(api_url, sample_portrait, speech).json()["id"])
    assert clean["status"] == "completed", clean["error"]

    renders = [submit(api_url, sample_portrait, speech).json()["id"] for _ in range(stack.settings.node.capacity)]
    for render_id in renders:  # every slot holds one of them
        poll(api_url, render_id, lambda s: s["progress"]["chunks_done"] >= 1, api_key=api_key(api_url), timeout_s=240)
    # A live session now: its create waits while it asks a render to yield (after preempt_after_s: an API of its
    # own asks at once), and returns once it has the node.
    quick = SchedSettings(preempt_after_s=0.01, live_start_timeout_s=120)
    with serve_api(stack.settings, sched=quick) as (url, _), Client(url, api_key=api_key(api_url)) as client:
        live = client.create_live(portrait=PORTRAIT)
        assert live.status == "running"
        # One render gave its slot up and waits (as moving) while the live session holds the node.
        rows = {render_id: _row(stack, render_id) for render_id in renders}
        assert sorted(row.preemptions for row in rows.values() if row is not None) == [0] * (len(renders) - 1) + [1]
        assert all(row is not None and row.yield_asked_at is None for row in rows.values())
        # The slot it gave up was handed to the live session on the node's own lease queue (ahead of the renders
        # waiting on the shared one), after its first lease, on the shared queue, asked.
        shared, node_id = c.lease_task_queue(stack.settings.temporal.task_queue), stack.settings.node.id
        assert asyncio.run(_lease_queues(stack, live.id)) == [shared, c.handed_lease_task_queue(node_id)]
        client.stream_audio(live, np.zeros(16_000, dtype="<i2").tobytes(), speed=20.0)
        ended = client.poll(live.id, lambda s: s.status in ("completed", "failed"), timeout_s=240)
        assert ended.status == "completed", ended.error

    preemptions = 0
    for render_id in renders:  # the preempted one and the others: the frames of the uninterrupted render
        render = wait_done(api_url, render_id)
        assert render["status"] == "completed", render["error"]
        preemptions += render["progress"]["preemptions"]
        assert _frame_hashes(stack, render_id) == _frame_hashes(stack, clean["id"])
        playlist = get(render["links"]["stream"], timeout=10).text
        segments = [line for line in playlist.splitlines() if line and not line.startswith("#")]
        assert len(segments) == len(set(segments)) and playlist.rstrip().endswith("#EXT-X-ENDLIST")  # each once
    assert preemptions == 1  # what the API (and the ops UI) shows


def test_a_live_session_with_no_node_in_time_is_refused_and_leaves_nothing(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        # Every slot held by a live session: live sessions never yield to live ones.
        holders = [client.create_live(portrait=PORTRAIT) for _ in range(stack.settings.node.capacity)]
        try:
            before = _session_ids(stack)
            objects_before = _stored_sessions(stack)
            quick = SchedSettings(preempt_after_s=0.01, live_start_timeout_s=2.0)
            key = {"Authorization": f"Bearer {api_key(api_url)}"}
            # create_attempts=1: the refusal itself (the client would otherwise wait Retry-After and try again).
            with (
                serve_api(stack.settings, sched=quick) as (url, _),
                Client(url, api_key=api_key(api_url), create_attempts=1) as other,
            ):
                portrait = {"portrait": ("p.jpg", sample_portrait)}
                refused = post(f"{url}/v1/sessions", files=portrait, headers=key, timeout=60)
                with pytest.raises(ApiError) as refusal:  # the client says how long to wait
                    other.create_live(portrait=PORTRAIT)
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"] == "2"
            assert "MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S" in refused.json()["detail"]
            assert (refusal.value.status, refusal.value.retry_after_s) == (503, 2.0)
            assert _session_ids(stack) == before  # no row
            assert _stored_sessions(stack) == objects_before  # no objects
        finally:
            for holder in holders:
                client.cancel(holder.id)
        for holder in holders:
            client.poll(holder.id, lambda s: s.status == "cancelled", timeout_s=120)


async def _lease_queues(stack: Stack, session_id: str) -> list[str]:
    """The task queues of the session's leases, in the order its workflow scheduled them."""
    settings = stack.settings.temporal
    temporal = await TemporalClient.connect(settings.address, namespace=settings.namespace)
    history = await temporal.get_workflow_handle(c.render_workflow_id(session_id)).fetch_history()
    scheduled = [event.activity_task_scheduled_event_attributes for event in history.events]
    return [event.task_queue.name for event in scheduled if event.activity_type.name == c.HOLD_NODE]


def _session_ids(stack: Stack) -> set[str]:
    engine = make_engine(stack.settings.db_url)
    try:
        with make_sessionmaker(engine)() as db:
            return set(db.scalars(select(SessionRow.id)))
    finally:
        engine.dispose()


def _stored_sessions(stack: Stack) -> set[str]:
    root = stack.settings.storage.root
    assert root is not None
    folder = Path(root) / "sessions"
    return {path.name for path in folder.iterdir()} if folder.exists() else set()
