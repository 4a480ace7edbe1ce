"""What the API returns. Options use Base / Create / Public, as the request form and the responses share them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SinkOptions(BaseModel):
    """A publisher besides the session's own HLS stream. Credentials are the server's (boto3's usual chain)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["s3", "kvs"] = Field(description="s3: any S3-compatible bucket; kvs: Kinesis Video Streams.")
    name: str = Field(default="", pattern=r"^[a-z0-9-]{0,32}$", description="Unique per session; default: type.")
    bucket: str = Field(default="", pattern=r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$", description="s3 bucket")
    prefix: str = Field(default="", pattern=r"^[A-Za-z0-9/_.-]{0,200}$", description="s3: keys go under <prefix>/<id>/")
    endpoint_url: str | None = Field(
        default=None, pattern=r"^https?://[^\s/]+(/\S*)?$", description="S3 or Kinesis Video endpoint (default AWS)"
    )
    region: str | None = Field(default=None, pattern=r"^[a-z0-9-]{1,32}$")
    stream_name: str = Field(default="", pattern=r"^[a-zA-Z0-9_.-]{0,256}$", description="kvs stream name")

    @model_validator(mode="after")
    def _complete(self) -> SinkOptions:
        if self.type == "s3" and not self.bucket:
            raise ValueError("an s3 sink needs a bucket")
        if ".." in self.prefix.split("/"):
            raise ValueError("an s3 prefix may not contain '..'")
        if self.type == "kvs" and not self.stream_name:
            raise ValueError("a kvs sink needs a stream_name")
        return self

    @property
    def label(self) -> str:
        return self.name or self.type


class RenderOptionsBase(BaseModel):
    fps: int = Field(ge=1, le=60, description="Frames per second of the output video.")
    chunk_frames: int = Field(ge=2, le=250, description="Frames per N chunk (about 1-2 s).")
    i_frames: int = Field(ge=0, le=32, description="Frames per I chunk, the seam between two N chunks (0: none).")
    first_chunk_frames: int = Field(
        default=0, ge=0, le=250, description="Frames in the first chunk (0: chunk_frames); fewer: faster first frame."
    )
    seed: int = Field(ge=0, le=2**63 - 1, description="Seed: the same inputs and seed give the same frames.")
    resolution: Literal["source", "512", "720p", "1080p"] = Field(
        description="Output size: the portrait's own, 512x512, 1280x720 or 1920x1080 (portrait-shaped inputs"
        " get the tall variant)."
    )
    preview: bool = Field(description="Render fast at half resolution; the same seed gives the same motion.")
    family: Literal["warp", "dit"] = Field(
        description="Model family: warp (CPU, real time) or dit (the diffusion-transformer family; GPU, or a tiny"
        " smoke-test model on CPU unless MONOLOGUE_DIT_WEIGHTS points at a checkpoint)."
    )
    prompt: str = Field(default="", max_length=500, description="Optional scene/text conditioning (dit family).")
    sinks: list[SinkOptions] = Field(
        default_factory=list, max_length=4, description="Publishers besides the HLS stream (S3, Kinesis Video)."
    )

    @model_validator(mode="after")
    def _unique_sinks(self) -> RenderOptionsBase:
        labels = [sink.label for sink in self.sinks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"sink names must be unique within a session (got {labels}); set 'name'")
        return self


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
