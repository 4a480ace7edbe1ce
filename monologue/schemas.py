"""What the API returns, shared by the API (its responses and OpenAPI schema) and `monologue.client` (which parses
them): one definition each. A session's options are not defined here: they are `contracts.RenderOptions`, and the
request form and the responses use models derived from it (`monologue/options.py`).

Pydantic only (no FastAPI): the client installs without the `api` extra."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from monologue import options as options_
from monologue.contracts import QueueClass, SessionKind, SessionStatus, SinkType

# A session's options: derived from `contracts.RenderOptions`, the one definition (`monologue/options.py`).
RenderOptionsPublic = options_.request_model()


class SinkState(StrEnum):
    """Where a sink's pump is: starting, streaming, done, retrying (after an error) or failed (for good)."""

    STARTING = "starting"
    STREAMING = "streaming"
    DONE = "done"
    RETRYING = "retrying"
    FAILED = "failed"


class VideoLayout(StrEnum):
    """fragmented: the MP4 as stored (init segment + one fragment per chunk); progressive: the same samples with
    the index (moov) at the front, for editors and players that want it there."""

    FRAGMENTED = "fragmented"
    PROGRESSIVE = "progressive"


class Progress(BaseModel):
    chunks_done: int
    chunks_total: int | None
    frames_total: int | None
    retries: int = Field(description="Chunk attempts beyond the first (retries and regenerations after a node loss).")
    preemptions: int = Field(
        default=0,
        description="Times the render gave its node slot up to a live session (it resumes with the same frames).",
    )


class PlaybackLinks(BaseModel):
    """Signed links for viewers: no API key, read-only, this session only, until `expires_at`. Ask for the session
    again for fresh ones."""

    stream: str = Field(description="HLS playlist; its segments are relative links under the same signed path.")
    video: str = Field(description="The finished MP4 (fragmented, as stored).")
    progressive: str = Field(description="The finished MP4 with its index (moov) first, for editors and players.")
    events: str = Field(description="Server-sent progress events (EventSource).")
    expires_at: datetime


class RenderLinks(BaseModel):
    self: str
    video: str
    stream: str = Field(description="HLS playlist (fMP4 segments); plays while the render runs.")
    workflow: str = Field(description="This session's workflow in Temporal's UI.")
    audio: str | None = Field(
        default=None,
        description="Live sessions: the WebSocket to stream the speech to (needs the key's Authorization header,"
        " or `?ticket=` from `audio_ticket`).",
    )
    playback: PlaybackLinks | None = Field(default=None, description="Signed links to hand to viewers.")


class AudioTicket(BaseModel):
    """A single-use, short-lived ticket that opens a live session's audio socket without an Authorization header
    (what a browser's WebSocket can use)."""

    ticket: str
    url: str = Field(description="The audio WebSocket with the ticket in its query.")
    expires_at: datetime


class SinkStatus(BaseModel):
    name: str
    type: SinkType
    status: SinkState = Field(description=SinkState.__doc__)
    acknowledged: int = Field(description="Segments the sink holds, from the start of the timeline.")
    error: str | None
    playback: str | None = Field(description="s3: an HLS playlist of presigned URLs, served by this API.")


class Latency(BaseModel):
    chunks: int = Field(description="Segments measured.")
    p50_ms: float = Field(description="Median time from a segment's audio stored to the segment published.")
    p95_ms: float
    max_ms: float


# `class` is a Python keyword: a queue class is `queue_class` in Python and `class` in JSON, both ways (a model with
# such a field takes BY_ALIAS, so every dump, the event stream's too, says `class`).
BY_ALIAS = ConfigDict(serialize_by_alias=True)


def queue_class_field(description: str = QueueClass.__doc__ or "") -> Any:
    """A `QueueClass` field read and written as `class` (and readable as `queue_class`)."""
    return Field(
        validation_alias=AliasChoices("class", "queue_class"), serialization_alias="class", description=description
    )


class QueuePlace(BaseModel):
    """Where a session waiting for a node stands: an estimate from the sessions waiting and running now, their
    priorities and tenants' weights (docs/scheduling.md, "Queue position and ETA"). Sessions arriving later in a
    more urgent class may still go first."""

    model_config = BY_ALIAS

    position: int = Field(ge=0, description="Sessions likely to get a node before this one (0: it is next).")
    eta_s: float | None = Field(
        description="Seconds until a node is likely free for it; null while that is unknown (no chunk time measured"
        " yet, or it waits behind live sessions, whose length nobody knows)."
    )
    queue_class: QueueClass = queue_class_field()


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
    queue: QueuePlace | None = Field(
        default=None, description="While the session waits for a node: its place and ETA; null once a node holds it."
    )
    links: RenderLinks
    audio_ticket: AudioTicket | None = Field(
        default=None, description="Live sessions, in the answer that creates one: a ticket for its audio socket."
    )


class Problem(BaseModel):
    """An error, as RFC 9457 problem details (`application/problem+json`). `detail` says what went wrong and what
    to do; a request FastAPI itself rejects (a missing field, a wrong type) lists each problem in `errors`."""

    type: str = Field(default="about:blank", description="about:blank: the status code says it all")
    title: str = Field(description="The HTTP status phrase.")
    status: int
    detail: str
    instance: str | None = Field(default=None, description="The request's path.")
    errors: list[dict[str, Any]] | None = Field(default=None, description="Validation errors: loc, msg, type.")


class RenderList(BaseModel):
    items: list[RenderPublic]
    limit: int
    offset: int


class WebhookEvent(StrEnum):
    """What a webhook reports: a node has started the session (sent only to endpoints that list it), or the
    session's end, one event per way it ends (an endpoint's default)."""

    STARTED = "session.started"
    COMPLETED = "session.completed"
    FAILED = "session.failed"
    CANCELLED = "session.cancelled"


SESSION_ENDINGS = (WebhookEvent.COMPLETED, WebhookEvent.FAILED, WebhookEvent.CANCELLED)  # a new endpoint's events


class DeliveryStatus(StrEnum):
    """pending: being tried (with back-off); delivered: a 2xx came back; failed: given up or refused."""

    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class WebhookEndpointCreate(BaseModel):
    url: str = Field(max_length=2000, description="https URL the operator allows (MONOLOGUE_WEBHOOKS__ALLOWED_URLS)")
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(SESSION_ENDINGS),
        description="Events to send (default: the three endings; session.started only when listed).",
    )


class WebhookEndpointPublic(BaseModel):
    id: str
    url: str
    events: list[WebhookEvent]
    created_at: datetime


class WebhookEndpointCreated(WebhookEndpointPublic):
    secret: str = Field(description="whsec_…: verifies `webhook-signature`. Shown only in this answer.")


class WebhookEndpointList(BaseModel):
    items: list[WebhookEndpointPublic]


class WebhookAttempt(BaseModel):
    attempt: int
    started_at: datetime
    duration_ms: float
    status_code: int | None = Field(description="The receiver's answer; None when none came (no connection).")
    error: str | None


class WebhookDelivery(BaseModel):
    id: str = Field(description="The webhook-id header: the same on every attempt of this delivery.")
    endpoint_id: str
    session_id: str
    event: WebhookEvent
    status: DeliveryStatus = Field(description=DeliveryStatus.__doc__)
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    attempts: list[WebhookAttempt]


class WebhookDeliveryList(BaseModel):
    items: list[WebhookDelivery]
