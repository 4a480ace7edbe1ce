"""RenderWorkflow's input: the session, how it is orchestrated (`Orchestration`), where a run starts
(`ResumePoint`), and the flat input of older histories (`FlatRenderInput`, `upgraded`)."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time (see
# monologue/contracts/__init__.py, which re-exports every name here).
from dataclasses import dataclass, field

from monologue.contracts.session import RenderOptions, SessionKind, check_delivery

# Chunk activities a session keeps scheduled on its node at once (the one running and the next ones,
# waiting their turn in-process), so the node never waits for Temporal between chunks. Nodes size their
# slots by it.
CHUNK_WINDOW = 3


@dataclass(frozen=True)
class Orchestration:
    """How the workflow runs a session: fixed when the session starts, carried unchanged by every later run.
    No defaults: `monologue.orchestration.orchestration_config(settings)` is where the values come from."""

    window: int  # chunk activities scheduled on the node at once (1: none ahead); see CHUNK_WINDOW
    continue_as_new_every: int  # chunks per workflow run, so the history stays bounded
    lease_timeout_s: float  # a node lease silent this long: the node is lost
    # A pinned activity (init_session, generate_chunk, finalize) silent this long: the node is lost. Seconds,
    # because nodes heartbeat during a chunk.
    heartbeat_timeout_s: float
    idle_timeout_s: float  # a live session with no new audio for this long ends
    # A live session's lifetime: past it the session ends with the audio it has, even with audio still coming
    # (0: none, as for sessions started before lifetimes existed). Counted from ResumePoint.live_since_ms.
    max_live_s: float
    search_attributes: bool  # upsert SEARCH_ATTRIBUTES (they must be registered on the cluster)
    # The lease's fairness weight (its tenant's, MONOLOGUE_SCHED__TENANT_WEIGHTS); older sessions: Temporal's default.
    fairness_weight: float = 1.0
    # A live session waiting this long for a node asks a render to yield its slot (0: never, as before issue 27).
    preempt_after_s: float = 0.0


@dataclass(frozen=True)
class ResumePoint:
    """Where a run starts: what earlier runs of the session did (continue-as-new carries it; a resume of a
    failed session sets it). The zero value is a session's start."""

    cursor: int = 0  # chunks of the generation order already generated
    frames: int = 0  # the timeline's length once known (0: a render's first run asks `prepare`)
    # Live sessions: the audio stored so far (16 kHz samples) and whether it has ended.
    audio_samples: int = 0
    audio_ended: bool = False
    live_since_ms: float = 0.0  # the first run's start (Temporal's clock, epoch ms); 0: this run is the first
    lease: int = 0  # the last node lease's number (its fencing token): the next run's leases count on from it


@dataclass(frozen=True, kw_only=True)
class RenderInput:
    """RenderWorkflow's input: who the session is, its options, how it is orchestrated, where this run starts.
    Continue-as-new replaces only `resume` (`dataclasses.replace`), so no field is ever dropped on the way."""

    session_id: str
    tenant: str = "local"
    kind: SessionKind = SessionKind.RENDER
    options: RenderOptions = field(default_factory=RenderOptions)
    # Required: Temporal's converter tries RenderInput before FlatRenderInput (see RenderInputs), and an old
    # flat input, having no `orchestration`, fails here and falls through to FlatRenderInput.
    orchestration: Orchestration
    resume: ResumePoint = field(default_factory=ResumePoint)

    def __post_init__(self) -> None:
        check_delivery(self.kind, self.options)


# The pinned activities' heartbeat timeout of sessions started before it was part of their input: their nodes
# may not heartbeat during a chunk.
LEGACY_HEARTBEAT_TIMEOUT_S = 120.0


@dataclass
class FlatRenderInput:
    """RenderWorkflow's input before it came in three parts: only decoded, from the histories of sessions
    started by older code (and replayed), and turned into a RenderInput by `upgraded` at once."""

    session_id: str
    options: RenderOptions = field(default_factory=RenderOptions)
    cursor: int = 0
    frames: int = 0
    lease_timeout_s: float = 10.0
    continue_as_new_every: int = 500
    tenant: str = "local"
    search_attributes: bool = True
    window: int = CHUNK_WINDOW
    live: bool = False
    audio_samples: int = 0
    audio_ended: bool = False
    idle_timeout_s: float = 30.0
    max_live_s: float = 0.0
    live_since_ms: float = 0.0


# What RenderWorkflow.run accepts, in the order Temporal's converter tries: today's input first.
RenderInputs = RenderInput | FlatRenderInput


def upgraded(request: RenderInputs) -> RenderInput:
    """The three-part input of any session, whichever code started it."""
    if isinstance(request, RenderInput):
        return request
    return RenderInput(
        session_id=request.session_id,
        tenant=request.tenant,
        kind=SessionKind.LIVE if request.live else SessionKind.RENDER,
        options=request.options,
        orchestration=Orchestration(
            window=request.window,
            continue_as_new_every=request.continue_as_new_every,
            lease_timeout_s=request.lease_timeout_s,
            heartbeat_timeout_s=LEGACY_HEARTBEAT_TIMEOUT_S,
            idle_timeout_s=request.idle_timeout_s,
            max_live_s=request.max_live_s,
            search_attributes=request.search_attributes,
        ),
        resume=ResumePoint(
            cursor=request.cursor,
            frames=request.frames,
            audio_samples=request.audio_samples,
            audio_ended=request.audio_ended,
            live_since_ms=request.live_since_ms,
        ),
    )
