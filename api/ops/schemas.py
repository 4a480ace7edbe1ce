"""What the ops UI's JSON endpoints (`/ops/api/…`) return. Read-only views: nothing here is accepted
as input, so there is no Create variant."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from monologue.contracts import ChunkKind, QueueClass, SessionKind, SessionStatus
from monologue.db import ChunkStatus, NodeStatus
from monologue.schemas import BY_ALIAS, queue_class_field


class OpsProgress(BaseModel):
    chunks_done: int
    chunks_total: int | None
    frames_done: int
    frames_total: int | None
    preemptions: int = Field(description="Times the session gave its slot up to a live session (docs/scheduling.md).")


class OpsSession(BaseModel):
    id: str
    status: SessionStatus = Field(description=SessionStatus.__doc__)
    kind: SessionKind = Field(description=SessionKind.__doc__)
    tenant: str
    node_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    age_s: float = Field(description="Seconds since the session was submitted.")
    progress: OpsProgress
    realtime_ratio: float | None = Field(
        description="Seconds of video made per second of wall time since the render started (>1: faster than real"
        " time); until it ended, for an ended session."
    )
    ttff_ms: float | None = Field(description="Submit to first chunk encoded, in milliseconds.")
    audio_seconds: float | None
    error: str | None


class OpsSessionPage(BaseModel):
    items: list[OpsSession]
    total: int = Field(description="Sessions matching the filters, over all pages.")
    limit: int
    offset: int


class OpsChunk(BaseModel):
    kind: ChunkKind = Field(description="N (the timeline) or I (the seam after N(index))")
    index: int
    first_frame: int
    frames: int
    status: ChunkStatus = Field(description=ChunkStatus.__doc__)
    attempt: int = Field(description="The activity attempt that made it (0: not made); above 1 means retries.")
    node_id: str | None
    moved: bool = Field(description="Made on another node than the chunk made before it (in generation order).")
    stage_ms: dict[str, float]
    updated_at: datetime | None


class OpsCheckpoint(BaseModel):
    index: int = Field(description="The N chunk it follows.")
    key: str
    sha256: str
    created_at: datetime


class OpsLinks(BaseModel):
    """Where the session page goes: Temporal's UI, and otherwise only `/ops/api` (the operator's access)."""

    temporal: str = Field(description="This session's workflow in Temporal's UI.")
    stream: str = Field(description="The live HLS playlist.")
    captioned_stream: str | None = Field(
        default=None, description="Sessions with captions: the multivariant playlist (the stream and its subtitles)."
    )
    events: str = Field(description="Server-sent progress events.")
    video: str = Field(description="The finished MP4.")
    cancel: str = Field(description="POST: cancel the session.")
    resume: str = Field(description="POST: resume a failed or cancelled session.")
    webhooks: str = Field(description="The session's webhook deliveries and their attempts.")
    player: str | None = Field(
        default=None, description="Live sessions with delivery=webrtc: the WebRTC player page (a signed link)."
    )


class OpsSessionDetail(BaseModel):
    session: OpsSession
    options: dict[str, Any]
    workflow_id: str | None
    width: int | None
    height: int | None
    chunks: list[OpsChunk] = Field(description="In timeline order: N0 I0 N1 I1 …")
    checkpoints: list[OpsCheckpoint]
    links: OpsLinks


class OpsNode(BaseModel):
    id: str
    capacity: int
    status: NodeStatus = Field(description=NodeStatus.__doc__)
    sessions: list[str] = Field(description="Sessions holding a slot of the node at its last heartbeat.")
    chunks_done: int = Field(description="Chunks made since the node started.")
    chunks_per_minute: float = Field(description="Since the node started.")
    memory_mb: float | None = Field(description="Resident memory of the node process.")
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float


class OpsNodeList(BaseModel):
    items: list[OpsNode]


class OpsQueueWaiting(BaseModel):
    model_config = BY_ALIAS

    queue_class: QueueClass = queue_class_field()
    tenant: str
    sessions: int = Field(description="Sessions of the tenant in this class waiting for a node.")


class OpsQueueRunning(BaseModel):
    model_config = BY_ALIAS

    queue_class: QueueClass = queue_class_field()
    sessions: int = Field(description="Sessions of this class holding a node's slot.")


class OpsQueue(BaseModel):
    """The lease queue now, as the database shows it (docs/scheduling.md, "Queue position and ETA")."""

    waiting: list[OpsQueueWaiting] = Field(description="By class (most urgent first), then tenant.")
    running: list[OpsQueueRunning] = Field(description="By class (most urgent first).")
    slots: int = Field(description="Places on the nodes that are up with a fresh heartbeat (at least 1).")
    seconds_per_chunk: float | None = Field(description="The recent chunk time ETAs are built on; null before one.")
