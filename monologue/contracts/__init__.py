"""The small dataclasses that cross Temporal: one input and one result per workflow and activity.

Fields are ids, keys and numbers; frames and tensors never cross Temporal (they live in object
storage). New fields get defaults so older histories still decode. This module imports only the
standard library: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from dataclasses import dataclass, field

from monologue.contracts.checks import (
    PREPARE_AVATAR as PREPARE_AVATAR,
    PREPARE_AVATAR_WORKFLOW as PREPARE_AVATAR_WORKFLOW,
    VALIDATE_INPUTS as VALIDATE_INPUTS,
    VALIDATE_WORKFLOW as VALIDATE_WORKFLOW,
    PrepareAvatarInput as PrepareAvatarInput,
    PrepareAvatarResult as PrepareAvatarResult,
    ValidateInputsInput as ValidateInputsInput,
    ValidateInputsResult as ValidateInputsResult,
    prepare_avatar_workflow_id as prepare_avatar_workflow_id,
    validate_workflow_id as validate_workflow_id,
)
from monologue.contracts.render_input import (
    CHUNK_WINDOW as CHUNK_WINDOW,
    LEGACY_HEARTBEAT_TIMEOUT_S as LEGACY_HEARTBEAT_TIMEOUT_S,
    FlatRenderInput as FlatRenderInput,
    Orchestration as Orchestration,
    RenderInput as RenderInput,
    RenderInputs as RenderInputs,
    ResumePoint as ResumePoint,
    upgraded as upgraded,
)
from monologue.contracts.sched import (
    AskReason as AskReason,
    AskToYieldInput as AskToYieldInput,
    AskToYieldResult as AskToYieldResult,
    RecordYieldInput as RecordYieldInput,
    YieldSlot as YieldSlot,
)

# The session model lives in contracts/session.py; re-exported, as everything that crosses Temporal is named here.
from monologue.contracts.session import (
    RESUMABLE as RESUMABLE,
    TERMINAL as TERMINAL,
    Bounds as Bounds,
    CaptionMode as CaptionMode,
    Chunk as Chunk,
    ChunkKind as ChunkKind,
    Delivery as Delivery,
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
    check_delivery as check_delivery,
    render_options as render_options,
)
from monologue.contracts.webhooks import (
    DELIVER_WEBHOOK as DELIVER_WEBHOOK,
    NOTIFY_ENDED as NOTIFY_ENDED,
    WEBHOOK_GIVEN_UP as WEBHOOK_GIVEN_UP,
    WEBHOOK_REFUSED as WEBHOOK_REFUSED,
    WEBHOOK_WORKFLOW as WEBHOOK_WORKFLOW,
    NotifyEndedInput as NotifyEndedInput,
    NotifyEndedResult as NotifyEndedResult,
    WebhookGivenUpInput as WebhookGivenUpInput,
    WebhookInput as WebhookInput,
    webhook_task_queue as webhook_task_queue,
    webhook_workflow_id as webhook_workflow_id,
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


def handed_lease_task_queue(node_id: str) -> str:
    """The queue of leases handed to one node: a session that a render of this node yields its slot to takes that
    slot here, ahead of the shared lease queue (node/lease_gate.py)."""
    return f"node-{node_id}-leases"


def sink_task_queue(shared_queue: str) -> str:
    """The queue of sink pumps (long-running: kept off the shared queue so they never starve it)."""
    return f"{shared_queue}-sinks"


def render_workflow_id(session_id: str) -> str:
    return f"render-{session_id}"


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
# A handed lease (HoldNodeInput.handed_wait_s) found no slot freed on its node in time: queue on the shared queue.
NO_SLOT_HANDED = "NoSlotHanded"
NODE_DISK_FULL = "NodeDiskFull"  # a node's disk had no room for a write: move the session (activities/disks.py)
# A node's write refused because a newer lease holds the session (the node was cut off and came back: its lease
# had timed out and the session had moved). Non-retryable; the workflow has abandoned that activity already.
LEASE_FENCED = "LeaseFenced"  # details[0]: the session's newest lease


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
    # A handed lease (on `handed_lease_task_queue`): wait this long for a slot of the node to be freed, then give up
    # (NO_SLOT_HANDED). 0: a lease of the shared queue, which a node takes only with a free slot.
    handed_wait_s: float = 0.0


@dataclass
class NodeAcquired:
    lease: int
    node_id: str
    handed: bool = False  # a handed lease (HoldNodeInput.handed_wait_s), not the shared queue's, was taken


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
