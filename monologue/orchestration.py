"""How RenderWorkflow runs a session, from the settings: the one place an Orchestration is built.

The API calls it when a session starts and when one resumes; the workflow only carries the result from run to
run. Never imported by workflow code (settings bring pydantic)."""

from __future__ import annotations

from monologue import contracts as c
from monologue.settings import Settings


def orchestration_config(
    settings: Settings, tenant: str, kind: c.SessionKind = c.SessionKind.RENDER
) -> c.Orchestration:
    """The orchestration of `tenant`'s session of `kind` started (or resumed) now, under these settings."""
    return c.Orchestration(
        window=c.CHUNK_WINDOW,
        continue_as_new_every=settings.render.continue_as_new_every,
        lease_timeout_s=lease_timeout_s(settings, kind),
        heartbeat_timeout_s=settings.node.heartbeat_timeout_s,
        idle_timeout_s=settings.render.live_idle_timeout_s,
        max_live_s=settings.limits.max_live_seconds,
        search_attributes=settings.temporal.search_attributes,
        fairness_weight=settings.sched.weight(tenant),
        preempt_after_s=settings.sched.preempt_after_s,
    )


def lease_timeout_s(settings: Settings, kind: c.SessionKind) -> float:
    """How long a session's node may be silent before the session moves: a live session's is the shorter (a viewer
    watches the stall), never longer than a render's."""
    node = settings.node
    live = min(node.live_lease_timeout_s, node.lease_timeout_s)
    return live if kind is c.SessionKind.LIVE else node.lease_timeout_s
