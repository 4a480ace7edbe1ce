"""The small dataclasses that cross Temporal: one input and one result per workflow and activity.

Fields are ids, keys and numbers; frames and tensors never cross Temporal (they live in object
storage). New fields get defaults so older histories still decode. This module imports only the
standard library: workflow code imports it inside the sandbox."""

from __future__ import annotations

from dataclasses import dataclass, field

# Activity names, so workflow code can call activities without importing their heavy modules.
PREPARE = "prepare"
ACQUIRE_NODE = "acquire_node"
RECORD_FAILURE = "record_failure"
INIT_SESSION = "init_session"
GENERATE_CHUNK = "generate_chunk"
FINALIZE = "finalize"


def node_task_queue(node_id: str) -> str:
    """The queue only one node polls: pinned work for the sessions it holds."""
    return f"node-{node_id}"


def render_workflow_id(session_id: str) -> str:
    return f"render-{session_id}"


@dataclass
class RenderInput:
    session_id: str
    fps: int = 25
    chunk_frames: int = 40
    seed: int = 0


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
    fps: int
    chunk_frames: int


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


@dataclass
class InitSessionResult:
    face_box: list[int] = field(default_factory=list)  # x, y, width, height


@dataclass
class GenerateChunkInput:
    session_id: str
    node_id: str
    kind: str
    index: int
    first_frame: int
    n_frames: int
    fps: int
    seed: int


@dataclass
class GenerateChunkResult:
    segment_key: str
    frames: int
    frames_sha256: list[str] = field(default_factory=list)  # one per frame, of the raw RGB bytes
    generate_ms: float = 0.0
    encode_ms: float = 0.0


@dataclass
class FinalizeInput:
    session_id: str
    node_id: str
    fps: int
    frames: int
    chunk_frames: int


@dataclass
class FinalizeResult:
    video_key: str
    size_bytes: int


@dataclass
class RecordFailureInput:
    session_id: str
    error: str
