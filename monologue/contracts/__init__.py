"""The small dataclasses that cross Temporal: one input and one result per workflow and activity.

Fields are ids, keys and numbers; frames and tensors never cross Temporal (they live in object
storage). New fields get defaults so older histories still decode. This module imports only the
standard library: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from dataclasses import dataclass, field
from enum import StrEnum

# The session model lives in contracts/session.py; re-exported, as everything that crosses Temporal is named here.
from monologue.contracts.session import (
    RESUMABLE as RESUMABLE,
    TERMINAL as TERMINAL,
    Bounds as Bounds,
    Chunk as Chunk,
    ChunkKind as ChunkKind,
    Family as Family,
    KvsSink as KvsSink,
    LipSync as LipSync,
    QueueClass as QueueClass,
    RenderOptions as RenderOptions,
    RenderPriority as RenderPriority,
    Residency as Residency,
    Resolution as Resolution,
    S3Sink as S3Sink,
    SamplingPreset as SamplingPreset,
    SessionKind as SessionKind,
    SessionStatus as SessionStatus,
    Sink as Sink,
    SinkType as SinkType,
    render_options as render_options,
)

# Activity names, so workflow code can call activities without importing their heavy modules.
PREPARE = "prepare"
HOLD_NODE = "hold_node"
RECORD_STATUS = "record_status"
INIT_SESSION = "init_session"
GENERATE_CHUNK = "generate_chunk"
PUBLISH = "publish"
FINALIZE = "finalize"
RUN_SINK = "run_sink"
ASK_TO_YIELD = "ask_to_yield"  # a waiting live session asks a render to give its slot up
RECORD_YIELD = "record_yield"  # a render gave its slot up: the session's record, the metric
SINK_ATTEMPTS = 8  # a sink pump's tries (backing off to 30 s) before the sink is marked failed


def node_task_queue(node_id: str) -> str:
    """The queue only one node polls: pinned work for the sessions it holds."""
    return f"node-{node_id}"


def lease_task_queue(shared_queue: str) -> str:
    """The queue of node leases: every node polls it with one slot per session it can hold."""
    return f"{shared_queue}-nodes"


def sink_task_queue(shared_queue: str) -> str:
    """The queue of sink pumps (long-running: kept off the shared queue so they never starve it)."""
    return f"{shared_queue}-sinks"


def render_workflow_id(session_id: str) -> str:
    return f"render-{session_id}"


# Chunk activities a session keeps scheduled on its node at once (the one running and the next ones,
# waiting their turn in-process), so the node never waits for Temporal between chunks. Nodes size their
# slots by it.
CHUNK_WINDOW = 3

# A session workflow's task (one step of its code on a node) is given to a node again this long after it began when
# no node answered for it: a node's answer lost to a Temporal restart is never retried sooner than the SDK's own
# backoff allows (seconds), so the server's timeout (default 10 s) is what frees the session. 5 s: long enough for a
# cold node's first task on a loaded machine; an outage of 2 s or more has outlasted it by the server's return.
WORKFLOW_TASK_TIMEOUT_S = 5

# Search attributes that make sessions findable in Temporal's UI (registered by `monologue up`; on
# another Temporal cluster register them first, or set MONOLOGUE_TEMPORAL__SEARCH_ATTRIBUTES=false).
SEARCH_ATTRIBUTES = {"MonologueStatus": "Keyword", "MonologueNode": "Keyword", "MonologueTenant": "Keyword"}

# Signal a node's lease activity sends the workflow once it holds the session.
NODE_ACQUIRED = "node_acquired"
# Signal `ask_to_yield` sends a render: give the slot up at the next chunk boundary (a live session waits).
YIELD_SLOT = "yield_slot"
# Signal the API sends a live session's workflow when stored audio unlocks new chunks, or ends.
AUDIO_AVAILABLE = "audio_available"
# ApplicationError types the workflow reacts to.
NODE_DRAINING = "NodeDraining"  # the node is shutting down: move the session now
CHECKPOINT_LOST = "CheckpointLost"  # details[0]: the N chunk whose checkpoint is missing or corrupt
NODE_DISK_FULL = "NodeDiskFull"  # a node's disk had no room for a write: move the session (activities/disks.py)
# A node's write refused because a newer lease holds the session (the node was cut off and came back: its lease
# had timed out and the session had moved). Non-retryable; the workflow has abandoned that activity already.
LEASE_FENCED = "LeaseFenced"  # details[0]: the session's newest lease


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


@dataclass
class AudioAvailable:
    """A live session's stored audio: `samples` (16 kHz mono) exist in storage; `ended` when no more will
    come. `marks` are (samples stored, API wall-clock ms) pairs since the last signal, for latency figures."""

    samples: int
    ended: bool = False
    marks: list[list[float]] = field(default_factory=list)


@dataclass
class RenderResult:
    session_id: str
    video_key: str
    frames: int
    chunks: int


@dataclass
class Progress:
    """What the workflow reports through its `progress` query."""

    status: SessionStatus = SessionStatus.QUEUED
    chunks_done: int = 0
    chunks_total: int = 0
    node_id: str | None = None
    node_changes: int = 0  # times the session moved to another node (node lost or drained)
    preemptions: int = 0  # times it gave its slot up to a live session
    queue_class: QueueClass = QueueClass.NORMAL  # the class of its latest lease


@dataclass
class PrepareInput:
    session_id: str
    options: RenderOptions


@dataclass
class PrepareResult:
    frames: int
    audio_samples: int
    width: int
    height: int


@dataclass
class HoldNodeInput:
    """Hold one of a node's session slots until cancelled; heartbeats prove the node is alive."""

    session_id: str
    workflow_id: str
    lease: int  # the workflow's lease number, so a stale lease's signal is ignored
    heartbeat_s: float


@dataclass
class NodeAcquired:
    lease: int
    node_id: str


class AskReason(StrEnum):
    """Why a session waiting for a node asks a render to yield (monologue/repo/sched.py says which renders may)."""

    LIVE = "live"  # a live session
    NODE_LOST = "node_lost"  # a session whose node was lost (it waits as moving)
    FAIR_SHARE = "fair_share"  # a render of a tenant below its share of the slots


@dataclass
class YieldSlot:
    """Give the node's slot up at the next chunk boundary, for `for_session`; then queue again as `yielded`, ahead of
    every render (`as_moving`, named before that class existed: it yields to a live session or one whose node was
    lost), or in its own class (it yields to a fairer share)."""

    for_session: str
    as_moving: bool = True


@dataclass
class AskToYieldInput:
    """A session has waited for a node: ask the render that should give way (policy: monologue/repo/sched.py)."""

    session_id: str  # the session waiting
    tenant: str = ""
    queue_class: QueueClass = QueueClass.LIVE
    why: AskReason = AskReason.LIVE


@dataclass
class AskToYieldResult:
    asked: str | None  # the session asked to yield; None: none asked (one is already yielding, or none can)


@dataclass
class RecordYieldInput:
    session_id: str
    for_session: str
    node_id: str  # the node given up ("": none was held, so it could not yield)
    chunks_done: int
    yielded: bool = True


@dataclass
class OfSessionKind:
    """An activity input's session kind, taken from `RenderInput.kind` (the one place it is decided).

    Named `session_kind` on the wire, as since issue 12: inputs scheduled by that code also carry `live`, the flag
    it replaced, which decoding now ignores (unknown fields are), so they still decode to the right kind. Only an
    input scheduled before issue 12 had `live` alone; none can still be waiting for a worker."""

    session_kind: SessionKind = field(default=SessionKind.RENDER, kw_only=True)


@dataclass
class InitSessionInput(OfSessionKind):
    session_id: str
    node_id: str
    options: RenderOptions
    lease: int = 0  # see FENCING


# FENCING: the pinned activities carry the number of the node lease they run under; the session's row keeps the
# newest lease a node claimed, and every write a node makes checks it (monologue/repo/fence.py), so a node that was
# cut off and comes back cannot publish over the node that took its session. 0: unfenced (histories from before).


@dataclass
class InitSessionResult:
    width: int
    height: int


@dataclass
class GenerateChunkInput(OfSessionKind):
    session_id: str
    node_id: str
    options: RenderOptions
    chunk: Chunk
    position: int = 0  # in the generation order
    wait_for: int | None = None  # a position scheduled on the same node just before: run after it finishes
    epoch: int = 0  # bumped whenever the workflow abandons scheduled chunks; older ones must not run
    # Live sessions: the audio stored when the chunk was planned (the chunk never reads past it unless
    # `audio_ended`), and when its audio arrived at the API (epoch ms), for latency figures.
    audio_samples: int = 0
    audio_ended: bool = False
    audio_ready_ms: float | None = None
    lease: int = 0  # see FENCING


@dataclass
class GenerateChunkResult:
    segment_key: str
    frames: int
    frames_sha256: str = ""  # SHA-256 over the chunk's per-frame hashes (the per-frame list stays in storage)
    stage_ms: dict[str, float] = field(default_factory=dict)
    checkpoint_key: str | None = None  # N chunks: the checkpoint written after them


@dataclass
class PublishInput(OfSessionKind):
    """Publish every segment of the timeline up to `published_frames` (segments land in timeline order). A live
    session's total_frames is unknown until its audio ends: a sliding-window playlist."""

    session_id: str
    options: RenderOptions
    total_frames: int
    published_frames: int
    ended: bool = False


@dataclass
class PublishResult:
    segments: int


@dataclass
class FinalizeInput:
    session_id: str
    node_id: str
    options: RenderOptions
    frames: int
    lease: int = 0  # see FENCING


@dataclass
class FinalizeResult:
    video_key: str
    size_bytes: int


@dataclass
class RecordStatusInput(OfSessionKind):
    """The session ended (failed or cancelled): record it, and close the stream so what is published plays."""

    session_id: str
    status: SessionStatus
    options: RenderOptions
    total_frames: int = 0
    published_frames: int = 0
    error: str | None = None


@dataclass
class RunSinkInput:
    """Feed one sink every segment of the session, in timeline order, until the stream ends."""

    session_id: str
    options: RenderOptions
    sink: Sink


@dataclass
class RunSinkResult:
    acknowledged: int  # segments the sink holds


# Checking a new session's uploads: the API has no media stack (no av, Pillow, OpenCV or torch), so it stages
# the raw uploads and a worker on the shared queue decodes, checks and normalises them while the API waits.
VALIDATE_INPUTS = "validate_inputs"
VALIDATE_WORKFLOW = "ValidateInputsWorkflow"


def validate_workflow_id(session_id: str) -> str:
    return f"validate-{session_id}"


@dataclass
class ValidateInputsInput:
    """Decode the staged uploads of a new session (`keys.staged_upload`), check them for `family` and store the
    normalised forms (`keys.portrait`, `keys.audio`) in their place. A live session has a portrait only; a render
    spoken from text has no audio upload: `text` is synthesised in `voice` (`gpu_worker.tts`) and stored as its audio,
    with the phones' timings (`keys.speech_phones`)."""

    session_id: str
    kind: SessionKind
    family: Family  # histories recorded when this was a str decode to the enum (a StrEnum travels as its value)
    max_portrait_side: int
    max_audio_seconds: float
    text: str = ""
    voice: str = ""


@dataclass
class ValidateInputsResult:
    width: int  # the normalised portrait
    height: int
    audio_samples: int = 0  # 16 kHz; 0 without audio


# A live session whose audio the workflow ends itself (idle timeout or lifetime, no `ended` signal: the API may
# have crashed) asks storage how much there is: the API acknowledges audio to its client once stored, but
# signals the workflow only about once a chunk, so the last signal may be short of what the client was promised.
STORED_AUDIO = "stored_audio"


@dataclass
class StoredAudioInput:
    """End a live session's stored audio where it stands (so a late API cannot add more) and report it."""

    session_id: str


@dataclass
class StoredAudioResult:
    samples: int  # 16 kHz, in storage and now marked ended there


# Webhooks (issue 18): when a session ends, RenderWorkflow asks the shared queue to queue its messages (one per
# endpoint of the tenant that takes the event); each is then delivered by its own WebhookDeliveryWorkflow on the
# webhook queue, retried with exponential back-off until it gets through or gives up.
NOTIFY_ENDED = "notify_session_ended"
WEBHOOK_WORKFLOW = "WebhookDeliveryWorkflow"
DELIVER_WEBHOOK = "deliver_webhook"
WEBHOOK_GIVEN_UP = "webhook_given_up"
WEBHOOK_REFUSED = "WebhookRefused"  # ApplicationError type: the endpoint may no longer be sent to; no retry


def webhook_task_queue(shared_queue: str) -> str:
    """The queue of webhook deliveries (a slow receiver never holds the shared queue's slots)."""
    return f"{shared_queue}-webhooks"


def webhook_workflow_id(delivery_id: str) -> str:
    return f"webhook-{delivery_id}"


@dataclass
class NotifyEndedInput:
    """The session ended with `status` (completed, failed or cancelled), or a node started it (running): queue
    its webhook messages. (The activity's name says "ended" from before `session.started`; histories keep it.)"""

    session_id: str
    tenant: str
    status: SessionStatus


@dataclass
class NotifyEndedResult:
    deliveries: int  # messages queued (one per endpoint that takes the event)


@dataclass
class WebhookInput:
    """Deliver one queued message; the back-off comes from the node's settings when it was queued."""

    delivery_id: str
    initial_backoff_s: float
    max_backoff_s: float
    give_up_after_s: float
    timeout_s: float  # one attempt


@dataclass
class WebhookGivenUpInput:
    delivery_id: str
    error: str
