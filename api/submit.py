"""Starting a session: stage the uploads, have a node check them, then record and start — or undo everything.

Bad input must never start a session or leave objects behind. The API has no media stack (no av, Pillow,
OpenCV or torch: it never imports `gpu_worker`), so it stores the raw uploads under a staging key and waits
for `validate_inputs` on a worker of the shared queue, which decodes and checks them and stores their
normalised forms; any failure, bad input included, removes everything written under the session's prefix."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.service import RPCError

from monologue import contracts as c, keys, options as options_, repo, sink_policy
from monologue.db import SessionRow
from monologue.errors import InputError
from monologue.live_audio import LiveAudioWriter, stored_live_audio
from monologue.orchestration import orchestration_config
from monologue.plan import AUDIO_RATE, chunk_sizes, live_frames, plan_chunks
from monologue.schemas import Integration
from monologue.settings import Settings

from .avatars import UsedAvatar, copy_to_session
from .deps import Services
from .errors import NoNodeForLive, TooManySessions
from .integration import record_callback
from .node_check import check_on_node

log = structlog.get_logger("api.submit")

NODE_POLL_S = 0.1  # how often a new live session's row is read while it waits for a node


@dataclass(frozen=True)
class Uploads:
    """A new session's files as received, not yet decoded (a node does that: `validate_inputs`), or the avatar whose
    portrait, checked already, it takes instead of an upload."""

    portrait: bytes | None = None
    audio: bytes | None = None  # None: a live session, whose audio comes later over the audio socket
    avatar: UsedAvatar | None = None


def check_tenant_limit(services: Services, tenant: str) -> None:
    """TooManySessions if the tenant is at its limit now: a quick refusal before any upload is decoded. Not the
    guard itself (another API process may take the last place meanwhile): `_start` records the session with
    `repo.create_session_within_limit`, which counts again under a lock."""
    limit = services.settings.limits.max_sessions_per_tenant
    with services.sessions() as db:
        active = repo.active_sessions(db, tenant=tenant)
    if active >= limit:
        raise _too_many(tenant, active)


def _too_many(tenant: str, active: int) -> TooManySessions:
    return TooManySessions(
        f"tenant {tenant} has {active} sessions queued or running, the limit"
        " (MONOLOGUE_LIMITS__MAX_SESSIONS_PER_TENANT); wait for one to end or cancel one",
        tenant=tenant,
    )


async def start_session(
    services: Services,
    *,
    session_id: str,
    uploads: Uploads,
    options: c.RenderOptions,
    tenant: str = "local",
    kind: c.SessionKind = c.SessionKind.RENDER,
    integration: Integration | None = None,
) -> None:
    """Check the inputs on a node, write the session row (with `integration`'s metadata and callback endpoint) and
    start the workflow; undo all of it on failure. InputError (→ 422) names bad input; ValidationUnavailable (→ 503)
    when no node checked it in time. A live session has a portrait only (the workflow waits for its audio)."""
    integration = integration or Integration()
    await _start(services, session_id, uploads, options, tenant=tenant, kind=kind, integration=integration)


async def _start(
    services: Services,
    session_id: str,
    uploads: Uploads,
    options: c.RenderOptions,
    *,
    tenant: str,
    kind: c.SessionKind,
    integration: Integration,
) -> None:
    """The steps a new session takes, in order, with everything written undone if one fails."""
    # Database and storage work runs on the thread pool, never on the event loop (every other request waits there).
    await asyncio.to_thread(check_tenant_limit, services, tenant)  # first: a tenant at its limit costs no node work
    workflow_id = c.render_workflow_id(session_id)
    started = False  # the workflow is started: undoing ends it first
    with structlog.contextvars.bound_contextvars(session_id=session_id, workflow_id=workflow_id):
        try:
            await asyncio.to_thread(_stage, services, session_id, uploads)
            checked = await _validate(services, session_id, kind, options, uploads.avatar)
            seconds = checked.audio_samples / AUDIO_RATE
            limit = services.settings.limits.max_sessions_per_tenant
            row: dict[str, Any] = {"session_id": session_id, "tenant": tenant, "kind": kind}
            row |= {"options": options_.stored(options), "workflow_id": workflow_id, "audio_seconds": seconds}
            row |= {"width": checked.width, "height": checked.height, "client_metadata": integration.metadata}
            row |= {"avatar_id": uploads.avatar.id if uploads.avatar is not None else None}
            if not await asyncio.to_thread(_record, services, limit, row):
                raise _too_many(tenant, limit)  # another request (perhaps in another API process) took the last place
            await asyncio.to_thread(
                record_callback, services, session_id=session_id, tenant=tenant, integration=integration
            )
            await _start_workflow(
                services.temporal,
                services.settings,
                session_id,
                options,
                kind=kind,
                tenant=tenant,
            )
            started = True
            if kind is c.SessionKind.LIVE:
                await _wait_for_node(services, session_id)
        except BaseException as err:
            if isinstance(err, InputError | TooManySessions | NoNodeForLive):
                log.info("submit refused; removing what was written", error=str(err))
            else:
                log.exception("submit failed; removing what was written")
            # Shielded: a cancelled request still removes everything (the thread finishes whatever happens here).
            await asyncio.shield(_undo_started(services, session_id, workflow_id, started))
            raise
        log.info(f"{kind} started", seconds=round(seconds, 3), width=checked.width, height=checked.height)


async def _wait_for_node(services: Services, session_id: str) -> None:
    """A live session is admitted once a node holds it (its row is `running`: the node's init_session marks it), so
    its first audio finds a node ready; NoNodeForLive if none did within MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S. The
    database is asked in short sessions on the thread pool."""
    timeout_s = services.settings.sched.live_start_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if await asyncio.to_thread(_has_node, services, session_id):
            return
        await asyncio.sleep(NODE_POLL_S)
    raise NoNodeForLive(
        f"no node could take the live session within {timeout_s:g} s (MONOLOGUE_SCHED__LIVE_START_TIMEOUT_S): every"
        " slot holds a live session or no node is up; try again shortly",
        retry_after_s=timeout_s,
    )


def _has_node(services: Services, session_id: str) -> bool:
    with services.sessions() as db:
        row = repo.get_session(db, session_id=session_id)
    return row is not None and row.status != c.SessionStatus.QUEUED


async def _undo_started(services: Services, session_id: str, workflow_id: str, started: bool) -> None:
    """Remove everything a failed start wrote; a workflow already started is terminated first (not cancelled: its
    cleanup would record the session that is being removed)."""
    if started:
        with contextlib.suppress(RPCError):  # it may have ended already
            await services.temporal.get_workflow_handle(workflow_id).terminate("its start was undone")
    await asyncio.to_thread(_undo, services, session_id)


def _record(services: Services, limit: int, row: dict[str, Any]) -> bool:
    """Write the session's row unless its tenant is at `limit` now (counted again, under the tenant's lock)."""
    with services.sessions() as db:
        return repo.create_session_within_limit(db, limit=limit, **row) is not None


def _undo(services: Services, session_id: str) -> None:
    """Remove everything a failed start wrote: its objects, then its row (its callback endpoint goes with it)."""
    services.store.delete_prefix(keys.session_prefix(session_id))
    with services.sessions() as db:
        repo.delete_session(db, session_id=session_id)


def _stage(services: Services, session_id: str, uploads: Uploads) -> None:
    """The raw uploads, where `validate_inputs` reads them (it deletes them once it has their normalised forms); an
    avatar's portrait, normalised already, where the session keeps its own (`avatars.copy_to_session`)."""
    if uploads.avatar is not None:
        copy_to_session(services.store, uploads.avatar, session_id)
    elif uploads.portrait is not None:
        services.store.put(keys.staged_upload(session_id, "portrait"), uploads.portrait)
    if uploads.audio is not None:
        services.store.put(keys.staged_upload(session_id, "audio"), uploads.audio)


async def _validate(
    services: Services, session_id: str, kind: c.SessionKind, options: c.RenderOptions, avatar: UsedAvatar | None
) -> c.ValidateInputsResult:
    """Run `validate_inputs` on a worker and wait for it: InputError with its message if the input is bad,
    ValidationUnavailable if no worker finished it within MONOLOGUE_API__VALIDATE_TIMEOUT_S. A live session from an
    avatar has nothing left to check: no node is asked (what an avatar saves of its time to first frame)."""
    if avatar is not None and kind is c.SessionKind.LIVE:
        return c.ValidateInputsResult(width=avatar.width, height=avatar.height)
    settings = services.settings
    request = c.ValidateInputsInput(
        session_id=session_id,
        kind=kind,
        family=options.family,
        max_portrait_side=settings.limits.max_portrait_side,
        max_audio_seconds=settings.limits.max_audio_seconds,
        text=options.text if kind == c.SessionKind.RENDER else "",  # a render spoken from text: synthesised there
        voice=options.voice,
        captions=options.captions if kind == c.SessionKind.RENDER else c.CaptionMode.NONE,
        transcript=options.transcript if options.captions is not c.CaptionMode.NONE else "",
        portrait_ready=avatar is not None,  # copied from the avatar (`_stage`), checked when the avatar was made
    )
    result = await check_on_node(
        services,
        c.VALIDATE_WORKFLOW,
        request,
        workflow_id=c.validate_workflow_id(session_id),
        result_type=c.ValidateInputsResult,
        what="the uploads",
    )
    if avatar is not None:
        result.width, result.height = avatar.width, avatar.height
    return result


async def _start_workflow(
    client: Client,
    settings: Settings,
    session_id: str,
    options: c.RenderOptions,
    *,
    kind: c.SessionKind,
    tenant: str = "local",
) -> None:
    await client.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=session_id,
            tenant=tenant,
            kind=kind,
            options=options,
            orchestration=orchestration_config(settings, tenant, kind),
        ),
        id=c.render_workflow_id(session_id),
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        task_timeout=TASK_TIMEOUT,
    )


TERMINAL = c.TERMINAL  # re-exported for the routes
TASK_TIMEOUT = timedelta(seconds=c.WORKFLOW_TASK_TIMEOUT_S)  # a session workflow's; its continued runs keep it


async def cancel_workflow(services: Services, row: SessionRow) -> None:
    """Ask the workflow to stop; it closes the stream and records `cancelled` itself (never terminated:
    termination would skip that cleanup)."""
    await services.temporal.get_workflow_handle(row.workflow_id or c.render_workflow_id(row.id)).cancel()
    log.info("render cancel requested", session_id=row.id)


async def _wait_until_closed(client: Client, workflow_id: str, timeout_s: float = 10.0) -> None:
    """A session is marked failed or cancelled by its workflow's last activity, a moment before the workflow
    itself closes: wait for that moment, so a resume right after it does not find the old run still open."""
    handle = client.get_workflow_handle(workflow_id)
    with contextlib.suppress(Exception):  # failed or cancelled runs raise here; that is the point
        await asyncio.wait_for(handle.result(follow_runs=False), timeout=timeout_s)


async def resume_workflow(services: Services, row: SessionRow) -> None:
    """A new run of the session's workflow from the first chunk (in generation order) not yet made.

    Chunks already generated are kept (their segments are in storage); the node restores the anchors
    from the checkpoints, or regenerates from an earlier N chunk if they are gone. SinkRefused, before anything
    is touched, if a sink is no longer one the operator allows the session's tenant."""
    options = c.render_options(row.options)
    for sink in options.sinks:  # the allow-lists may have shrunk since the session started
        sink_policy.check(sink, tenant=row.tenant, allowed=services.settings.sinks)
    resume = await asyncio.to_thread(_resume_point, services, row, options)
    settings = services.settings
    await _wait_until_closed(services.temporal, row.workflow_id or c.render_workflow_id(row.id))
    await services.temporal.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=row.id,
            tenant=row.tenant,
            kind=c.SessionKind(row.kind),
            options=options,
            # Today's settings (a resumed live session's lifetime is moot: its audio has ended).
            orchestration=orchestration_config(settings, row.tenant, c.SessionKind(row.kind)),
            resume=resume,
        ),
        id=row.workflow_id or c.render_workflow_id(row.id),
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
        task_timeout=TASK_TIMEOUT,
    )
    await asyncio.to_thread(_mark_resumed, services, row.id)
    log.info("render resumed", session_id=row.id, cursor=resume.cursor)


def _resume_point(services: Services, row: SessionRow, options: c.RenderOptions) -> c.ResumePoint:
    """Where the session continues: the first chunk not yet made, and (live) the audio it has. Blocking."""
    live = row.kind == c.SessionKind.LIVE
    samples, ended = stored_live_audio(services.store, row.id) if live else (0, True)
    if live and not ended:
        # Its audio socket is gone: the session resumes to make video of the audio it has, then ends.
        LiveAudioWriter.mark_ended(services.store, row.id, samples)
        ended = True
    frames = live_frames(samples, options, ended=True) if live else (row.frames or 0)
    cursor = 0
    if frames:
        with services.sessions() as db:
            done = repo.generated_chunks(db, session_id=row.id)
        for spec in plan_chunks(frames, **chunk_sizes(options)):
            if (spec.kind, spec.index) not in done:
                break
            cursor += 1
    return c.ResumePoint(
        cursor=cursor, frames=0 if live else frames, audio_samples=samples, audio_ended=ended, lease=row.lease
    )


def _mark_resumed(services: Services, session_id: str) -> None:
    with services.sessions() as db:
        repo.mark_resumed(db, session_id=session_id)
