"""Starting a render: validate at the edge, then store, record and start — or undo everything.

Bad input must never start a workflow or leave objects behind, so all decoding and checks run
before the first write, and a failure after a write removes what was written."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy

from gpu_worker.models import build_family
from gpu_worker.pipeline import Family
from monologue import contracts as c
from monologue import keys, repo, sink_policy
from monologue.db import SessionRow
from monologue.live_audio import LiveAudioWriter, stored_live_audio
from monologue.media import Portrait, Speech, decode_png, normalise_audio, normalise_portrait
from monologue.plan import AUDIO_RATE, chunk_sizes, live_frames, plan_chunks
from monologue.settings import Settings

from .deps import Services
from .schemas import RenderOptionsCreate

log = structlog.get_logger("api.submit")


@dataclass(frozen=True)
class ValidInputs:
    portrait: Portrait
    speech: Speech


def validate_portrait(*, portrait: bytes, family: str, settings: Settings) -> Portrait:
    """Decode and check a live session's portrait (its audio comes later, over the audio socket)."""
    image = normalise_portrait(portrait, max_side=settings.limits.max_portrait_side)
    _family(family).reference.check(decode_png(image.png))
    return image


def validate_inputs(*, portrait: bytes, audio: bytes, family: str, settings: Settings) -> ValidInputs:
    """Decode and check both uploads; raises InputError (→ 4xx) naming the problem. CPU-bound."""
    limits = settings.limits
    image = normalise_portrait(portrait, max_side=limits.max_portrait_side)
    speech = normalise_audio(audio, max_seconds=limits.max_audio_seconds)
    _family(family).reference.check(decode_png(image.png))  # e.g. no face: NoFaceFound, an InputError
    return ValidInputs(portrait=image, speech=speech)


@functools.cache
def _family(name: str) -> Family:
    return build_family(name)


class TooManySessions(Exception):
    """The tenant is at its limit of concurrent sessions (→ 429)."""


def check_tenant_limit(services: Services, tenant: str) -> None:
    limit = services.settings.limits.max_sessions_per_tenant
    with services.sessions() as db:
        active = repo.active_sessions(db, tenant=tenant)
    if active >= limit:
        raise TooManySessions(
            f"tenant {tenant} has {active} sessions queued or running, the limit"
            " (MONOLOGUE_LIMITS__MAX_SESSIONS_PER_TENANT); wait for one to end or cancel one"
        )


async def start_render(
    services: Services, *, inputs: ValidInputs, options: RenderOptionsCreate, tenant: str = "local"
) -> str:
    """Store the inputs, write the session row and start the workflow; undo all of it on failure."""
    speech, portrait = inputs.speech, inputs.portrait

    def store(session_id: str) -> None:
        services.store.put(keys.portrait(session_id), portrait.png, content_type="image/png")
        services.store.put(keys.audio(session_id), speech.wav, content_type="audio/wav")

    return await _start(services, store, portrait, options, tenant=tenant, kind="render", seconds=speech.seconds)


async def start_live(
    services: Services, *, portrait: Portrait, options: RenderOptionsCreate, tenant: str = "local"
) -> str:
    """A live session: store the portrait, write the row, start the workflow (which waits for audio)."""

    def store(session_id: str) -> None:
        services.store.put(keys.portrait(session_id), portrait.png, content_type="image/png")

    return await _start(services, store, portrait, options, tenant=tenant, kind="live", seconds=0.0)


async def _start(
    services: Services,
    store: Callable[[str], None],
    portrait: Portrait,
    options: RenderOptionsCreate,
    *,
    tenant: str,
    kind: str,
    seconds: float,
) -> str:
    """The steps a new session takes, in order, with everything written undone if one fails."""
    check_tenant_limit(services, tenant)
    session_id = uuid.uuid4().hex
    workflow_id = c.render_workflow_id(session_id)
    with structlog.contextvars.bound_contextvars(session_id=session_id, workflow_id=workflow_id):
        try:
            store(session_id)
            with services.sessions() as db:
                repo.create_session(
                    db,
                    session_id=session_id,
                    tenant=tenant,
                    kind=kind,
                    options=options.model_dump(),
                    workflow_id=workflow_id,
                    audio_seconds=seconds,
                    width=portrait.width,
                    height=portrait.height,
                )
            await _start_workflow(
                services.temporal, services.settings, session_id, options, live=kind == "live", tenant=tenant
            )
        except BaseException:
            log.exception("submit failed; removing what was written")
            services.store.delete_prefix(keys.session_prefix(session_id))
            with services.sessions() as db:
                repo.delete_session(db, session_id=session_id)
            raise
        log.info(f"{kind} started", seconds=round(seconds, 3), width=portrait.width, height=portrait.height)
    return session_id


async def _start_workflow(
    client: Client,
    settings: Settings,
    session_id: str,
    options: RenderOptionsCreate,
    *,
    live: bool = False,
    tenant: str = "local",
) -> None:
    await client.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=session_id,
            options=c.render_options(options.model_dump()),
            lease_timeout_s=settings.node.lease_timeout_s,
            continue_as_new_every=settings.render.continue_as_new_every,
            search_attributes=settings.temporal.search_attributes,
            tenant=tenant,
            live=live,
            idle_timeout_s=settings.render.live_idle_timeout_s,
            max_live_s=settings.limits.max_live_seconds,
        ),
        id=c.render_workflow_id(session_id),
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
    )


TERMINAL = ("completed", "failed", "cancelled")


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
    options = c.render_options(RenderOptionsCreate.model_validate(row.options).model_dump())
    for sink in options.sinks:  # the allow-lists may have shrunk since the session started
        sink_policy.check(sink, tenant=row.tenant, allowed=services.settings.sinks)
    live = row.kind == "live"
    samples, ended = stored_live_audio(services.store, row.id) if live else (0, True)
    if live and not ended:
        # Its audio socket is gone: the session resumes to make video of the audio it has, then ends.
        LiveAudioWriter.mark_ended(services.store, row.id, samples)
        ended = True
    frames = live_frames(samples, rate=AUDIO_RATE, fps=options.fps, ended=True) if live else (row.frames or 0)
    cursor = 0
    if frames:
        with services.sessions() as db:
            done = repo.generated_chunks(db, session_id=row.id)
        for spec in plan_chunks(frames, **chunk_sizes(options)):
            if (spec.kind, spec.index) not in done:
                break
            cursor += 1
    settings = services.settings
    await _wait_until_closed(services.temporal, row.workflow_id or c.render_workflow_id(row.id))
    await services.temporal.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=row.id,
            options=options,
            cursor=cursor,
            frames=0 if live else frames,
            lease_timeout_s=settings.node.lease_timeout_s,
            continue_as_new_every=settings.render.continue_as_new_every,
            search_attributes=settings.temporal.search_attributes,
            tenant=row.tenant,
            live=live,
            audio_samples=samples,
            audio_ended=ended,
            idle_timeout_s=settings.render.live_idle_timeout_s,
            max_live_s=settings.limits.max_live_seconds,  # moot here (a resumed session's audio has ended)
        ),
        id=row.workflow_id or c.render_workflow_id(row.id),
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
    )
    with services.sessions() as db:
        repo.mark_resumed(db, session_id=row.id)
    log.info("render resumed", session_id=row.id, cursor=cursor)
