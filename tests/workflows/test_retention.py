"""Retention end to end on a real Temporal dev server: the schedule `monologue temporal setup` makes (created, then
updated in place), triggered rather than waited for, starts RetentionWorkflow, whose real activities clear a session
that ended long ago and an asset uploaded long ago, and leave recent ones; the run's history replays (the workflow
is deterministic)."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker
from temporalio.client import ScheduleActionExecutionStartWorkflow, ScheduleActionStartWorkflow, ScheduleHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.retention import RetentionActivities
from cli.schedules import ensure_schedules
from monologue import keys, repo
from monologue.contracts import SessionStatus, retention as r
from monologue.db import SessionRow, make_engine, make_sessionmaker, migrate, utcnow
from monologue.settings import RetentionSettings, Settings, TemporalSettings
from monologue.storage import LocalStore
from workflows.retention import RetentionWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="module")
SIZES = {"audio_seconds": 2.0, "width": 64, "height": 64}


def _ended_session(sessions: sessionmaker[Any], store: LocalStore, session_id: str, days_ago: float) -> None:
    with sessions() as db:
        repo.create_session(db, session_id=session_id, tenant="t", options={}, workflow_id="w", **SIZES)
        repo.mark_ended(db, session_id=session_id, status=SessionStatus.FAILED, error="x")
        ended = utcnow() - timedelta(days=days_ago)
        db.execute(update(SessionRow).where(SessionRow.id == session_id).values(finished_at=ended))
        db.commit()
    store.put(keys.portrait(session_id), b"a face")
    store.put(keys.segment(session_id, "N", 0), b"a segment")


async def test_the_schedule_starts_a_retention_run_that_clears_what_is_due(
    env: WorkflowEnvironment, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    sessions, store = make_sessionmaker(engine), LocalStore(tmp_path / "objects")
    _ended_session(sessions, store, "old", days_ago=40)
    _ended_session(sessions, store, "recent", days_ago=10)
    day = 86_400.0
    old_asset, new_asset = keys.new_asset_id(time.time() - 8 * day), keys.new_asset_id(time.time() - 6 * day)
    store.put(keys.asset("t", old_asset, "portrait"), b"a face uploaded 8 days ago")
    store.put(keys.asset("t", new_asset, "audio"), b"a voice uploaded 6 days ago")
    queue = f"retention-{uuid.uuid4().hex[:8]}"
    settings = Settings(home=tmp_path, temporal=TemporalSettings(task_queue=queue))
    assert await ensure_schedules(env.client, settings) == [f"{r.RETENTION_SCHEDULE}: created"]
    settings.retention = RetentionSettings(inputs_days=7, outputs_days=30, every_s=86_400)
    assert await ensure_schedules(env.client, settings) == [f"{r.RETENTION_SCHEDULE}: updated"]
    schedule = env.client.get_schedule_handle(r.RETENTION_SCHEDULE)
    action = (await schedule.describe()).schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow) and action.task_queue == queue

    activities = RetentionActivities(store=store, sessions=sessions)
    with ThreadPoolExecutor(2) as executor:
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[RetentionWorkflow],
            activities=[activities.apply_retention, activities.expire_assets],
            activity_executor=executor,
        ):
            await schedule.trigger()
            run = await _started_run(schedule)
            result = await env.client.get_workflow_handle(run, result_type=r.RetentionResult).result()
    await schedule.delete()

    assert result == r.RetentionResult(inputs=2, outputs=1, assets=1, more=False)  # the policy as updated
    assert store.list(keys.ASSETS) == [keys.asset("t", new_asset, "audio")]  # assets age on the inputs' 7 days
    assert store.list("sessions/old/") == []
    assert store.list("sessions/recent/") == [keys.segment("recent", "N", 0)]  # 10 days: its inputs only (7 days)
    with sessions() as db:
        recent = repo.get_session(db, session_id="recent")
        assert recent is not None and recent.inputs_removed_at is not None and recent.outputs_removed_at is None
    engine.dispose()
    history = await env.client.get_workflow_handle(run).fetch_history()
    await Replayer(workflows=[RetentionWorkflow]).replay_workflow(history)


async def _started_run(schedule: ScheduleHandle) -> str:
    """The workflow id of the schedule's first run, once it has started one (a trigger is asynchronous)."""
    for _ in range(200):
        recent = (await schedule.describe()).info.recent_actions
        if recent and isinstance(started := recent[-1].action, ScheduleActionExecutionStartWorkflow):
            return started.workflow_id
        await asyncio.sleep(0.05)
    raise AssertionError("the triggered schedule started no run within 10 s")
