"""The small dataclasses that cross Temporal: one input and one result per workflow and activity.

Fields are ids, keys and numbers; frames and tensors never cross Temporal (they live in object
storage). New fields get defaults so older histories still decode. This module imports only the
standard library: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from dataclasses import dataclass, field
from enum import StrEnum


class SessionKind(StrEnum):
    """A render has all its audio up front; a live session's audio streams in while it runs."""

    RENDER = "render"
    LIVE = "live"


class SessionStatus(StrEnum):
    """Where a session is; the workflow decides, the database follows (StrEnum: equal to the stored strings)."""

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL = frozenset({SessionStatus.COMPLETED, SessionStatus.FAILED, SessionStatus.CANCELLED})


class ChunkKind(StrEnum):
    """N chunks carry the timeline; an I chunk interpolates the seam after N(index)."""

    N = "N"
    I = "I"  # noqa: E741 (the name the whole design uses)


# Activity names, so workflow code can call activities without importing their heavy modules.
PREPARE = "prepare"
HOLD_NODE = "hold_node"
RECORD_STATUS = "record_status"
INIT_SESSION = "init_session"
GENERATE_CHUNK = "generate_chunk"
PUBLISH = "publish"
FINALIZE = "finalize"
RUN_SINK = "run_sink"
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

# Search attributes that make sessions findable in Temporal's UI (registered by `monologue up`; on
# another Temporal cluster register them first, or set MONOLOGUE_TEMPORAL__SEARCH_ATTRIBUTES=false).
SEARCH_ATTRIBUTES = {"MonologueStatus": "Keyword", "MonologueNode": "Keyword", "MonologueTenant": "Keyword"}

# Signal a node's lease activity sends the workflow once it holds the session.
NODE_ACQUIRED = "node_acquired"
# Signal the API sends a live session's workflow when stored audio unlocks new chunks, or ends.
AUDIO_AVAILABLE = "audio_available"
# ApplicationError types the workflow reacts to.
NODE_DRAINING = "NodeDraining"  # the node is shutting down: move the session now
CHECKPOINT_LOST = "CheckpointLost"  # details[0]: the N chunk whose checkpoint is missing or corrupt


@dataclass
class SinkSpec:
    """A publisher besides the session's own HLS stream. Credentials come from the node's boto3 chain."""

    type: str  # "s3" or "kvs"
    name: str = ""  # unique within the session; defaults to the type
    bucket: str = ""  # s3
    prefix: str = ""  # s3: keys go under <prefix>/<session id>/
    endpoint_url: str | None = None  # s3 or kvs control plane: any compatible endpoint
    region: str | None = None
    stream_name: str = ""  # kvs

    @property
    def label(self) -> str:
        return self.name or self.type


@dataclass
class RenderOptions:
    """Per-session options (validated by the API before the workflow starts)."""

    fps: int = 25
    chunk_frames: int = 40  # frames per N chunk
    first_chunk_frames: int = 0  # frames in N0 (0: chunk_frames); shorter gives a faster first frame
    i_frames: int = 4  # frames per I chunk (the seam between two N chunks); 0: no interpolation
    seed: int = 0
    resolution: str = "source"  # "source", "512", "720p" or "1080p"
    preview: bool = False  # half resolution, same motion
    family: str = "warp"
    sinks: list[SinkSpec] = field(default_factory=list)
    prompt: str = ""  # optional text/scene conditioning (the dit family reads it)


def render_options(values: dict[str, object]) -> RenderOptions:
    """RenderOptions from validated plain values (the API's model_dump, a stored session's options)."""
    sinks = [spec if isinstance(spec, SinkSpec) else SinkSpec(**spec) for spec in values.get("sinks") or []]  # type: ignore[attr-defined]
    return RenderOptions(**{**values, "sinks": sinks})  # type: ignore[arg-type]


@dataclass
class RenderInput:
    session_id: str
    options: RenderOptions = field(default_factory=RenderOptions)
    # Where to start: chunks of the generation order already generated, and the timeline length once
    # known (carried across continue-as-new, and set by a resume of a failed session).
    cursor: int = 0
    frames: int = 0
    # Orchestration settings, fixed by the API when the session starts.
    lease_timeout_s: float = 10.0
    continue_as_new_every: int = 500
    tenant: str = "local"
    search_attributes: bool = True  # upsert SEARCH_ATTRIBUTES (they must be registered on the cluster)
    window: int = CHUNK_WINDOW  # chunk activities scheduled on the node at once (1: none ahead); see CHUNK_WINDOW
    # Live sessions: audio arrives while the session runs (AUDIO_AVAILABLE signals); carried across
    # continue-as-new like the cursor.
    live: bool = False
    audio_samples: int = 0  # stored so far (16 kHz)
    audio_ended: bool = False
    idle_timeout_s: float = 30.0  # no new audio for this long ends a live session
    # A live session's lifetime: past it the session ends with the audio it has, even with audio still coming
    # (0: none, as for sessions started before it existed). Measured from `live_since_ms` (Temporal's clock,
    # epoch ms), which the first run sets to its own start and every later run carries.
    max_live_s: float = 0.0
    live_since_ms: float = 0.0


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

    status: str = "queued"
    chunks_done: int = 0
    chunks_total: int = 0
    node_id: str | None = None
    node_changes: int = 0  # times the session moved to another node (node lost or drained)


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


@dataclass
class InitSessionInput:
    session_id: str
    node_id: str
    options: RenderOptions
    live: bool = False


@dataclass
class InitSessionResult:
    width: int
    height: int


@dataclass
class GenerateChunkInput:
    session_id: str
    node_id: str
    options: RenderOptions
    kind: str
    index: int
    first_frame: int
    n_frames: int
    position: int = 0  # in the generation order
    wait_for: int | None = None  # a position scheduled on the same node just before: run after it finishes
    epoch: int = 0  # bumped whenever the workflow abandons scheduled chunks; older ones must not run
    # Live sessions: the audio stored when the chunk was planned (the chunk never reads past it unless
    # `audio_ended`), and when its audio arrived at the API (epoch ms), for latency figures.
    live: bool = False
    audio_samples: int = 0
    audio_ended: bool = False
    audio_ready_ms: float | None = None


@dataclass
class GenerateChunkResult:
    segment_key: str
    frames: int
    frames_sha256: str = ""  # SHA-256 over the chunk's per-frame hashes (the per-frame list stays in storage)
    stage_ms: dict[str, float] = field(default_factory=dict)
    checkpoint_key: str | None = None  # N chunks: the checkpoint written after them


@dataclass
class PublishInput:
    """Publish every segment of the timeline up to `published_frames` (segments land in timeline order)."""

    session_id: str
    options: RenderOptions
    total_frames: int
    published_frames: int
    ended: bool = False
    live: bool = False  # total_frames unknown until the audio ends: a sliding-window playlist


@dataclass
class PublishResult:
    segments: int


@dataclass
class FinalizeInput:
    session_id: str
    node_id: str
    options: RenderOptions
    frames: int


@dataclass
class FinalizeResult:
    video_key: str
    size_bytes: int


@dataclass
class RecordStatusInput:
    """The session ended (failed or cancelled): record it, and close the stream so what is published plays."""

    session_id: str
    status: str
    options: RenderOptions
    total_frames: int = 0
    published_frames: int = 0
    error: str | None = None
    live: bool = False


@dataclass
class RunSinkInput:
    """Feed one sink every segment of the session, in timeline order, until the stream ends."""

    session_id: str
    options: RenderOptions
    sink: SinkSpec


@dataclass
class RunSinkResult:
    acknowledged: int  # segments the sink holds
