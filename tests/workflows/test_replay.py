"""Recorded RenderWorkflow histories replay against today's workflow code without nondeterminism.

A running session's history is replayed by whichever worker picks it up next, possibly one with newer
code: a change that alters the commands an old history made (or stops its input decoding) would break
every session in flight at deploy time. The histories in `histories/` were recorded from earlier code;
`record_histories.py` records more."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.converter import DataConverter
from temporalio.worker import Replayer

from monologue import contracts as c
from workflows.render import RenderWorkflow

FOLDER = Path(__file__).parent / "histories"
HISTORIES = sorted(FOLDER.glob("*.json"))
# A live session's first run, started by code that took the flat input (live: true, lease and idle timeouts 3 s).
OLD_LIVE_START = FOLDER / "render-933a8f50e88448f2813b7f5a5eb4fe12-01a23313-8b12-71b6-ab52-f7a3c97e07cf.json"


def workflow_id_of(path: Path) -> str:
    """`<workflow id>-<run id>.json` → the workflow id (a run id is a UUID: five dash-separated groups)."""
    return path.stem.rsplit("-", 5)[0]


def test_histories_are_committed() -> None:
    """Guards the parametrised test below from passing vacuously when the folder moves or empties."""
    assert len(HISTORIES) >= 10


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_recorded_history_replays_without_nondeterminism(path: Path) -> None:
    history = WorkflowHistory.from_json(workflow_id_of(path), path.read_text())
    result = await Replayer(workflows=[RenderWorkflow]).replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


async def test_an_old_flat_input_decodes_and_upgrades_to_the_same_session() -> None:
    """The input of a session started by older code decodes as FlatRenderInput (not as a RenderInput full of
    defaults) and upgrades to the session it was: live, with its own timeouts."""
    started = WorkflowHistory.from_json("old", OLD_LIVE_START.read_text()).events[0]
    payloads = started.workflow_execution_started_event_attributes.input.payloads
    [request] = await DataConverter.default.decode(payloads, [c.RenderInputs])  # type: ignore[list-item]
    assert isinstance(request, c.FlatRenderInput)
    upgraded = c.upgraded(request)
    assert (upgraded.session_id, upgraded.tenant, upgraded.kind) == (request.session_id, "local", c.SessionKind.LIVE)
    assert upgraded.options.first_chunk_frames == 16
    assert upgraded.orchestration == c.Orchestration(
        window=3,
        continue_as_new_every=2,
        lease_timeout_s=3.0,
        heartbeat_timeout_s=c.LEGACY_HEARTBEAT_TIMEOUT_S,
        idle_timeout_s=3.0,
        max_live_s=0.0,
        search_attributes=True,
    )
    assert upgraded.resume == c.ResumePoint()


async def test_a_new_input_decodes_as_itself() -> None:
    request = c.RenderInput(
        session_id="s",
        kind=c.SessionKind.LIVE,
        orchestration=c.upgraded(c.FlatRenderInput(session_id="s")).orchestration,
        resume=c.ResumePoint(cursor=4, frames=90, audio_samples=57_600, audio_ended=True, live_since_ms=1.5),
    )
    payloads = await DataConverter.default.encode([request])
    assert await DataConverter.default.decode(payloads, [c.RenderInputs]) == [request]  # type: ignore[list-item]


# The activity inputs that carried `live` beside `session_kind` (issue 12 to issue 26).
OF_SESSION_KIND: dict[str, type[c.OfSessionKind]] = {
    c.INIT_SESSION: c.InitSessionInput,
    c.GENERATE_CHUNK: c.GenerateChunkInput,
    c.PUBLISH: c.PublishInput,
    c.RECORD_STATUS: c.RecordStatusInput,
}


async def test_recorded_activity_inputs_decode_to_the_session_kind_their_live_flag_said() -> None:
    """An activity task scheduled by older code may still be waiting when new workers start: its input (with
    `live` beside `session_kind`) decodes to the kind `live` said, and re-encoded it carries no `live`."""
    kinds = set()
    for path in HISTORIES:
        for event in WorkflowHistory.from_json(workflow_id_of(path), path.read_text()).events:
            scheduled = event.activity_task_scheduled_event_attributes
            input_type = OF_SESSION_KIND.get(scheduled.activity_type.name)
            payloads = scheduled.input.payloads
            fields = json.loads(payloads[0].data) if input_type is not None else {}
            if not {"session_kind", "live"} <= set(fields):
                continue  # not one of them, or scheduled before issue 12 (long done), or by code that sends no `live`
            [request] = await DataConverter.default.decode(payloads, [input_type])
            live = fields["live"]
            assert request.session_kind == (c.SessionKind.LIVE if live else c.SessionKind.RENDER), path.name
            encoded = json.loads((await DataConverter.default.encode([request]))[0].data)
            assert "live" not in encoded and encoded["session_kind"] == request.session_kind
            kinds.add(request.session_kind)
    assert kinds == set(c.SessionKind)


async def test_recorded_histories_replay_with_the_tracing_interceptor() -> None:
    """Nodes run workflows with Temporal's TracingInterceptor when tracing is on (monologue/tracing.py): it must
    not change the commands any recorded history made."""
    from opentelemetry.sdk.trace import TracerProvider
    from temporalio.contrib.opentelemetry import TracingInterceptor

    interceptor = TracingInterceptor(TracerProvider().get_tracer("replay"))
    replayer = Replayer(workflows=[RenderWorkflow], interceptors=[interceptor])
    failures = {}
    for path in HISTORIES:
        history = WorkflowHistory.from_json(workflow_id_of(path), path.read_text())
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures[path.name] = repr(result.replay_failure)
    assert failures == {} and len(HISTORIES) >= 10
