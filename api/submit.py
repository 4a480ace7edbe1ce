"""Starting a render: validate at the edge, then store, record and start — or undo everything.

Bad input must never start a workflow or leave objects behind, so all decoding and checks run
before the first write, and a failure after a write removes what was written."""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass

import structlog
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy

from gpu_worker.models import build_family
from gpu_worker.pipeline import Family
from monologue import contracts as c
from monologue import keys, repo
from monologue.db import SessionRow
from monologue.media import Portrait, Speech, decode_png, normalise_audio, normalise_portrait
from monologue.plan import plan_chunks
from monologue.settings import Settings
from monologue.storage import ObjectStore

from .deps import Services
from .schemas import RenderOptionsCreate

log = structlog.get_logger("api.submit")


@dataclass(frozen=True)
class ValidInputs:
    portrait: Portrait
    speech: Speech


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


async def start_render(
    services: Services, *, inputs: ValidInputs, options: RenderOptionsCreate, tenant: str = "local"
) -> str:
    """Store the inputs, write the session row and start the workflow; undo all of it on failure."""
    session_id = uuid.uuid4().hex
    workflow_id = c.render_workflow_id(session_id)
    with structlog.contextvars.bound_contextvars(session_id=session_id, workflow_id=workflow_id):
        try:
            _store_inputs(services.store, session_id, inputs)
            with services.sessions() as db:
                repo.create_session(
                    db,
                    session_id=session_id,
                    tenant=tenant,
                    options=options.model_dump(),
                    workflow_id=workflow_id,
                    audio_seconds=inputs.speech.seconds,
                    width=inputs.portrait.width,
                    height=inputs.portrait.height,
                )
            await _start_workflow(services.temporal, services.settings, session_id, options)
        except BaseException:
            log.exception("submit failed; removing what was written")
            services.store.delete_prefix(keys.session_prefix(session_id))
            with services.sessions() as db:
                repo.delete_session(db, session_id=session_id)
            raise
        log.info(
            "render started",
            seconds=round(inputs.speech.seconds, 3),
            width=inputs.portrait.width,
            height=inputs.portrait.height,
        )
    return session_id


def _store_inputs(store: ObjectStore, session_id: str, inputs: ValidInputs) -> None:
    store.put(keys.portrait(session_id), inputs.portrait.png, content_type="image/png")
    store.put(keys.audio(session_id), inputs.speech.wav, content_type="audio/wav")


async def _start_workflow(client: Client, settings: Settings, session_id: str, options: RenderOptionsCreate) -> None:
    await client.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=session_id,
            options=c.RenderOptions(**options.model_dump()),
            lease_timeout_s=settings.node.lease_timeout_s,
            continue_as_new_every=settings.render.continue_as_new_every,
            search_attributes=settings.temporal.search_attributes,
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


async def resume_workflow(services: Services, row: SessionRow) -> None:
    """A new run of the session's workflow from the first chunk (in generation order) not yet made.

    Chunks already generated are kept (their segments are in storage); the node restores the anchors
    from the checkpoints, or regenerates from an earlier N chunk if they are gone."""
    options = c.RenderOptions(**RenderOptionsCreate.model_validate(row.options).model_dump())
    cursor = 0
    if row.frames:
        with services.sessions() as db:
            done = repo.generated_chunks(db, session_id=row.id)
        for spec in plan_chunks(row.frames, n_frames=options.chunk_frames, i_frames=options.i_frames):
            if (spec.kind, spec.index) not in done:
                break
            cursor += 1
    settings = services.settings
    await services.temporal.start_workflow(
        "RenderWorkflow",
        c.RenderInput(
            session_id=row.id,
            options=options,
            cursor=cursor,
            frames=row.frames or 0,
            lease_timeout_s=settings.node.lease_timeout_s,
            continue_as_new_every=settings.render.continue_as_new_every,
            search_attributes=settings.temporal.search_attributes,
        ),
        id=row.workflow_id or c.render_workflow_id(row.id),
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
    )
    with services.sessions() as db:
        repo.mark_resumed(db, session_id=row.id)
    log.info("render resumed", session_id=row.id, cursor=cursor)
