"""What the API returns. Options use Base / Create / Public, as the request form and the responses share them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class RenderOptionsBase(BaseModel):
    fps: int = Field(ge=1, le=60, description="Frames per second of the output video.")
    chunk_frames: int = Field(ge=2, le=250, description="Frames per N chunk (about 1-2 s).")
    i_frames: int = Field(ge=0, le=32, description="Frames per I chunk, the seam between two N chunks (0: none).")
    seed: int = Field(ge=0, le=2**63 - 1, description="Seed: the same inputs and seed give the same frames.")
    resolution: Literal["source", "512", "720p", "1080p"] = Field(
        description="Output size: the portrait's own, 512x512, 1280x720 or 1920x1080 (portrait-shaped inputs"
        " get the tall variant)."
    )
    preview: bool = Field(description="Render fast at half resolution; the same seed gives the same motion.")
    family: Literal["warp"] = Field(description="Model family.")


class RenderOptionsCreate(RenderOptionsBase):
    pass


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


class Latency(BaseModel):
    chunks: int = Field(description="Segments measured.")
    p50_ms: float = Field(description="Median time from a segment's audio stored to the segment published.")
    p95_ms: float
    max_ms: float


class RenderPublic(BaseModel):
    id: str
    kind: str = Field(default="render", description="render (all audio up front) or live (audio streamed in)")
    status: str = Field(description="queued, running, completed, failed or cancelled")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    options: RenderOptionsBase
    width: int | None
    height: int | None
    audio_seconds: float | None
    node_id: str | None
    ttff_ms: float | None = Field(
        description="Time to first frame in ms: renders, submit to first chunk encoded; live sessions, first audio"
        " stored to first segment published."
    )
    latency: Latency | None = Field(default=None, description="Live sessions: audio in to segment out.")
    error: str | None
    progress: Progress
    links: RenderLinks


class RenderList(BaseModel):
    items: list[RenderPublic]
    limit: int
    offset: int
