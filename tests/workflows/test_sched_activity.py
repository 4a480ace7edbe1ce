"""The `ask_to_yield` activity against the real dev server: a render whose workflow has ended when its signal goes
out (a node's report still listed it) is unmarked and the next render asked, in the same ask."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.sched import SchedActivities
from monologue import contracts as c
from monologue.db import NodeStatus, SessionRow, make_engine, make_sessionmaker, migrate
from monologue.repo import nodes as repo_nodes
from monologue.settings import SchedSettings

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_render_whose_workflow_has_ended_is_passed_over(env: WorkflowEnvironment, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    ended, running = f"ended-{uuid.uuid4().hex[:8]}", f"running-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC)
    with sessions() as db:
        for session_id, started in ((ended, now), (running, now.replace(year=now.year - 1))):
            kind, status = c.SessionKind.RENDER, c.SessionStatus.RUNNING
            db.add(
                SessionRow(
                    id=session_id, tenant="t", kind=kind, status=status, node_id="n", options={}, started_at=started
                )
            )
        db.commit()
        held = [ended, running]
        repo_nodes.report_node(
            db,
            node_id="n",
            capacity=2,
            status=NodeStatus.UP,
            sessions=held,
            chunks_done=0,
            memory_mb=None,
            started_at=now,
        )
    # Only `running` has a workflow (started on a queue nobody polls: it takes signals); `ended` has none.
    handle = await env.client.start_workflow(
        "RenderWorkflow", id=c.render_workflow_id(running), task_queue=f"nobody-{uuid.uuid4().hex[:8]}"
    )
    activities = SchedActivities(client=env.client, sessions=sessions, settings=SchedSettings(), lost_after_s=10.0)
    request = c.AskToYieldInput(session_id="live", tenant="t", queue_class=c.QueueClass.LIVE, why=c.AskReason.LIVE)
    try:
        result = await ActivityEnvironment().run(activities.ask_to_yield, request)
        assert result.asked == running  # `ended` was started last, so asked first, and passed over
        with sessions() as db:
            assert db.get(SessionRow, ended).yield_for is None
            assert db.get(SessionRow, running).yield_for == "live"
        history = await handle.fetch_history()
        signals = [e for e in history.events if e.HasField("workflow_execution_signaled_event_attributes")]
        assert [e.workflow_execution_signaled_event_attributes.signal_name for e in signals] == [c.YIELD_SLOT]
    finally:
        await handle.terminate()
        engine.dispose()
