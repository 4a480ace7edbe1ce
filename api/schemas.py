"""What the API returns. A session's options are not defined here: they are `contracts.RenderOptions`, and the
request form and the responses use models derived from it (`monologue/options.py`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from monologue import options as options_
from monologue.contracts import SessionKind, SessionStatus

# A session's options: derived from `contracts.RenderOptions`, the one definition (`monologue/options.py`).
RenderOptionsPublic = options_.request_model()


class Progress(BaseModel):
    chunks_done: int
    chunks_total: int | None
    frames_total: int | None
    retries: int = Field(description="Chunk attempts beyond the first (retries and regenerations after a node loss).")


class RenderLinks(BaseModel):
    self: str
    video: str
    stream: str = Field(description="HLS playlist (fMP4 segments); plays while the render runs.")
    workflow: str = Field(description="This session's workflow in Temporal's UI.")
    audio: str | None = Field(default=None, description="Live sessions: the WebSocket to stream the speech to.")


class SinkStatus(BaseModel):
    name: str
    type: str
    status: str = Field(description="starting, streaming, done, retrying or failed")
    acknowledged: int = Field(description="Segments the sink holds, from the start of the timeline.")
    error: str | None
    playback: str | None = Field(description="s3: an HLS playlist of presigned URLs, served by this API.")


class Latency(BaseModel):
    chunks: int = Field(description="Segments measured.")
    p50_ms: float = Field(description="Median time from a segment's audio stored to the segment published.")
    p95_ms: float
    max_ms: float


class RenderPublic(BaseModel):
    id: str
    kind: SessionKind = Field(default=SessionKind.RENDER, description=SessionKind.__doc__)
    status: SessionStatus = Field(description=SessionStatus.__doc__)
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    options: RenderOptionsPublic  # type: ignore[valid-type]
    width: int | None
    height: int | None
    audio_seconds: float | None
    node_id: str | None
    ttff_ms: float | None = Field(
        description="Time to first frame in ms: renders, submit to first chunk encoded; live sessions, first audio"
        " stored to first segment published."
    )
    latency: Latency | None = Field(default=None, description="Live sessions: audio in to segment out.")
    sinks: list[SinkStatus] = Field(default_factory=list)
    error: str | None
    progress: Progress
    links: RenderLinks


class Problem(BaseModel):
    """An error. `detail` is a message naming the problem; for a request FastAPI itself rejects (a missing
    field, a wrong type), its list of problems."""

    detail: str | list[dict[str, Any]]


class RenderList(BaseModel):
    items: list[RenderPublic]
    limit: int
    offset: int
