"""The small dataclasses that cross Temporal: one input and one result per workflow and activity.

Fields are ids, keys and numbers; frames and tensors never cross Temporal (they live in object
storage). New fields get defaults so older histories still decode. This module imports only the
standard library: workflow code imports it inside the sandbox."""

# No `from __future__ import annotations` here: Temporal's converter resolves these field types at
# run time inside the workflow sandbox, where string annotations of nested dataclasses fail to resolve.
from dataclasses import dataclass, field

# Activity names, so workflow code can call activities without importing their heavy modules.
PREPARE = "prepare"
ACQUIRE_NODE = "acquire_node"
RECORD_FAILURE = "record_failure"
INIT_SESSION = "init_session"
GENERATE_CHUNK = "generate_chunk"
PUBLISH = "publish"
FINALIZE = "finalize"


def node_task_queue(node_id: str) -> str:
    """The queue only one node polls: pinned work for the sessions it holds."""
    return f"node-{node_id}"


def render_workflow_id(session_id: str) -> str:
    return f"render-{session_id}"


@dataclass
class RenderOptions:
    """Per-session options (validated by the API before the workflow starts)."""

    fps: int = 25
    chunk_frames: int = 40  # frames per N chunk
    i_frames: int = 4  # frames per I chunk (the seam between two N chunks); 0: no interpolation
    seed: int = 0
    resolution: str = "source"  # "source", "512", "720p" or "1080p"
    preview: bool = False  # half resolution, same motion
    family: str = "warp"


@dataclass
class RenderInput:
    session_id: str
    options: RenderOptions = field(default_factory=RenderOptions)


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
class AcquireNodeInput:
    session_id: str


@dataclass
class AcquireNodeResult:
    node_id: str
    task_queue: str


@dataclass
class InitSessionInput:
    session_id: str
    node_id: str
    options: RenderOptions


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


@dataclass
class GenerateChunkResult:
    segment_key: str
    frames: int
    frames_sha256: str = ""  # SHA-256 over the chunk's per-frame hashes (the per-frame list stays in storage)
    stage_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class PublishInput:
    """Publish every segment of the timeline up to `published_frames` (segments land in timeline order)."""

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


@dataclass
class FinalizeResult:
    video_key: str
    size_bytes: int


@dataclass
class RecordFailureInput:
    session_id: str
    error: str
