"""What the API returns, shared by the API (its responses and OpenAPI schema) and `monologue.client` (which parses
them): one definition each. A session's options are not defined here: they are `contracts.RenderOptions`, and the
request form and the responses use models derived from it (`monologue/options.py`).

Pydantic only (no FastAPI): the client installs without the `api` extra."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StringConstraints,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
    model_validator,
)

from monologue import options as options_
from monologue.contracts import QueueClass, SessionKind, SessionStatus, SinkType

# A session's options: derived from `contracts.RenderOptions`, the one definition (`monologue/options.py`).
RenderOptionsPublic = options_.request_model()

# A session's `metadata`: the caller's own small JSON object, stored as given and returned in the session, its events
# and every webhook about it; never read by Monologue (it changes no frame). Flat and bounded, so every message about
# a session stays small whatever a caller sends.
METADATA_KEYS = 16
METADATA_KEY_CHARS = 40
METADATA_BYTES = 2048  # the object as compact UTF-8 JSON
MetadataValue = str | int | FiniteFloat | bool | None
MetadataKey = Annotated[str, StringConstraints(min_length=1, max_length=METADATA_KEY_CHARS)]


def _flat(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One error for a value of no allowed type (not one per member of the union)."""
    try:
        return handler(value)
    except ValidationError:
        raise ValueError("a value is a string, a finite number, a boolean or null (no objects or lists)") from None


def _metadata_size(value: dict[str, Any]) -> dict[str, Any]:
    size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
    if size > METADATA_BYTES:
        raise ValueError(f"{size} bytes as JSON, more than the limit of {METADATA_BYTES}")
    return value


SessionMetadata = Annotated[
    dict[MetadataKey, Annotated[MetadataValue, WrapValidator(_flat)]],
    Field(max_length=METADATA_KEYS),
    AfterValidator(_metadata_size),
]
METADATA_DOC = (
    f"Your own JSON object, returned as given in the session, its events and every webhook about it: at most"
    f" {METADATA_KEYS} keys of 1 to {METADATA_KEY_CHARS} characters, values strings, numbers, booleans or null,"
    f" {METADATA_BYTES} bytes in all as JSON."
)
CALLBACK_DOC = (
    "Where this session's endings (session.completed, .failed, .cancelled) are POSTed too, signed per Standard"
    " Webhooks with `callback_secret` (in the create's answer) and retried like an endpoint's: a URL the operator"
    " allows (MONOLOGUE_WEBHOOKS__ALLOWED_URLS) at a public address."
)


class Integration(BaseModel):
    """What a create may attach to its session besides the options: neither changes what is rendered."""

    model_config = ConfigDict(extra="forbid")

    metadata: SessionMetadata | None = Field(default=None, description=METADATA_DOC)
    callback_url: str | None = Field(default=None, min_length=1, max_length=2000, description=CALLBACK_DOC)


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


class CaptionLinks(BaseModel):
    """A session's captions (option `captions`): the words spoken, timed, as files; they exist once the session is
    created (made before its first chunk)."""

    vtt: str = Field(description="WebVTT (`text/vtt`): for <track>, hls.js and players.")
    srt: str = Field(description="SubRip (`.srt`): for video editors and players.")


class PlaybackLinks(BaseModel):
    """Signed links for viewers: no API key, read-only, this session only, until `expires_at`. Ask for the session
    again for fresh ones."""

    stream: str = Field(description="HLS playlist; its segments are relative links under the same signed path.")
    captioned_stream: str | None = Field(
        default=None,
        description="Sessions with captions: the HLS multivariant playlist, the stream with its subtitle rendition.",
    )
    video: str = Field(description="The finished MP4 (fragmented, as stored).")
    progressive: str = Field(description="The finished MP4 with its index (moov) first, for editors and players.")
    events: str = Field(description="Server-sent progress events (EventSource).")
    captions: CaptionLinks | None = Field(default=None, description="Sessions with captions: their files.")
    player: str | None = Field(
        default=None,
        description="Live sessions with delivery=webrtc: a page that plays the session in a browser (WebRTC, WHEP).",
    )
    whep: str | None = Field(
        default=None,
        description="Live sessions with delivery=webrtc: the WHEP endpoint; POST an SDP offer with"
        " 'Authorization: Bearer <token>', the token of this link (the path segment after /play/).",
    )
    expires_at: datetime


class RenderLinks(BaseModel):
    self: str
    video: str
    stream: str = Field(description="HLS playlist (fMP4 segments); plays while the render runs.")
    captioned_stream: str | None = Field(
        default=None,
        description="Sessions with captions (`captions` files or burn): the HLS multivariant playlist, `stream` with"
        " a WebVTT subtitle rendition beside it (shown by default). Null otherwise.",
    )
    workflow: str = Field(description="This session's workflow in Temporal's UI.")
    audio: str | None = Field(
        default=None,
        description="Live sessions: the WebSocket to stream the speech to (needs the key's Authorization header,"
        " or `?ticket=` from `audio_ticket`).",
    )
    captions: CaptionLinks | None = Field(
        default=None, description="Sessions with captions (`captions` files or burn): the WebVTT and SRT files."
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
    avatar_id: str | None = Field(default=None, description="The avatar the session's portrait came from, if any.")
    metadata: dict[str, MetadataValue] | None = Field(default=None, description="The create's `metadata`, as given.")
    callback_url: str | None = Field(default=None, description="The create's `callback_url`.")
    callback_secret: str | None = Field(
        default=None,
        description="whsec_…: verifies the `webhook-signature` of the messages to `callback_url`. Only in the answer"
        " that creates the session (and a retry of it with the same Idempotency-Key).",
    )


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


class WebhookLinks(BaseModel):
    self: str
    video: str


class WebhookSession(BaseModel):
    """The session a webhook message is about, as of its event."""

    id: str
    kind: SessionKind
    status: SessionStatus = Field(description="As of the event (a started message may go out once it has ended).")
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    frames: int | None
    audio_seconds: float | None
    metadata: dict[str, MetadataValue] | None = Field(default=None, description="The create's `metadata`, as given.")
    links: WebhookLinks


class WebhookMessage(BaseModel):
    """A webhook's body: Standard Webhooks' envelope (`type`, `timestamp`, `data`) around the session's summary."""

    type: WebhookEvent
    timestamp: datetime
    data: WebhookSession


class AssetKind(StrEnum):
    """What an uploaded asset is for: a portrait image or speech (named like the create's input fields)."""

    PORTRAIT = "portrait"
    AUDIO = "audio"


class AssetPublic(BaseModel):
    """A file uploaded for later creates (`{"asset_id": …}` in a JSON create body); checked when a create uses it."""

    id: str
    kind: AssetKind
    bytes: int
    sha256: str


class AvatarPublic(BaseModel):
    """A portrait checked once (`POST /v1/avatars`), named by `avatar_id` in creates instead of a portrait."""

    id: str
    created_at: datetime
    width: int = Field(description="The normalised portrait's width (upright, RGB, even sides), as sessions get it.")
    height: int
    portrait_sha256: str = Field(description="SHA-256 of the normalised portrait (PNG).")


class AvatarList(BaseModel):
    items: list[AvatarPublic]
    limit: int
    offset: int


AVATAR_ID_FIELD = Field(
    default=None,
    min_length=1,
    max_length=64,
    description="An avatar's id (`POST /v1/avatars`) instead of a portrait: its portrait, checked once, is reused.",
)


class InputRef(BaseModel):
    """One input of a JSON create: by URL (the API fetches it: https://… or s3://bucket/key) or by the id of an asset
    uploaded earlier (`POST /v1/assets`), exactly one of them."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, min_length=1, max_length=2000, description="https://… or s3://bucket/key")
    asset_id: str | None = Field(default=None, min_length=1, max_length=64, description="From `POST /v1/assets`.")

    @model_validator(mode="after")
    def _exactly_one(self) -> InputRef:
        if self.url is not None and self.asset_id is not None:
            raise ValueError("give its url or its asset_id, not both")
        if self.url is None and self.asset_id is None:
            raise ValueError('give its url or its asset_id, e.g. {"url": "https://…"}')
        return self


# JSON create bodies: the inputs as InputRefs beside the same option fields as the multipart form (derived from
# `contracts.RenderOptions`: every one optional, left out or null for the server's default).
RenderCreate = create_model(
    "RenderCreate",
    __base__=(options_.partial_model(), Integration),
    __doc__="A render from inputs by URL or uploaded assets (or an avatar), and its options.",
    portrait=(InputRef | None, Field(default=None, description="The portrait image; or give `avatar_id`.")),
    avatar_id=(str | None, AVATAR_ID_FIELD),
    audio=(InputRef | None, Field(default=None, description="The speech; or leave it out and give `text`.")),
)
LiveSessionCreate = create_model(
    "LiveSessionCreate",
    __base__=(options_.partial_model(), Integration),
    __doc__="A live session from a portrait by URL or an uploaded asset (or an avatar), and its options.",
    portrait=(InputRef | None, Field(default=None, description="The portrait image; or give `avatar_id`.")),
    avatar_id=(str | None, AVATAR_ID_FIELD),
)
