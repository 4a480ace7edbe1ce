"""The settings of what Monologue talks to, keeps beside sessions and allows: sinks, playback links, webhooks, requests
to caller-chosen URLs, URL inputs, data retention, speech synthesis, WebRTC's STUN/TURN servers and SFU, a caller's
limits and the scheduler's weights. Sections of
`monologue.settings.Settings` (which re-exports them); nothing here reads the environment."""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, Field, SecretStr, model_validator


class SinkSettings(BaseModel):
    """Where sessions may publish besides their own stream. Sinks write with the nodes' credentials, so
    nothing is allowed until the operator lists it (JSON lists in the environment). Every pattern may name
    `{tenant}`, replaced by the session's tenant, and may end in `*` (any rest); the lists are checked when a
    session starts, when it resumes and by each sink pump before it writes."""

    s3_buckets: list[str] = Field(
        default_factory=list,
        description="where S3 sinks may write: 'bucket' (any prefix) or 'bucket/prefix' (that prefix and below),"
        " e.g. 'videos/{tenant}'",
    )
    kvs_streams: list[str] = Field(
        default_factory=list, description="Kinesis Video stream names sinks may use, e.g. 'avatar-{tenant}-*'"
    )
    s3_endpoints: list[str] = Field(
        default_factory=list, description="endpoint_url values S3 sinks may use besides AWS's own"
    )
    kvs_endpoints: list[str] = Field(
        default_factory=list,
        description="Kinesis Video endpoints sinks may use besides AWS's own: control planes given as"
        " endpoint_url and the data endpoints they return ('https://*.example.com' matches subdomains)",
    )


# Issue 18: what integrators' viewers, services and inputs use (links, webhooks, outbound requests, URL inputs).


class LinkSettings(BaseModel):
    """Signed playback links and live audio tickets: what players and browsers use instead of an API key."""

    secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of playback links (unset: <home>/link-secret, made at first use; every API process"
        " must share it)",
    )
    ttl_s: float = Field(default=3600.0, gt=0, le=7 * 86400, description="a playback link works this long")
    ticket_ttl_s: float = Field(default=60.0, gt=0, le=3600, description="a live audio ticket works this long, once")
    cors_origins: list[str] = Field(
        default_factory=list,
        description="origins whose pages may read playback links (CORS, GET only; '*' any), e.g. https://app.example",
    )
    max_streams_per_session: int = Field(default=32, ge=1, description="open event streams per session's links")


class WebhookSettings(BaseModel):
    """Signed notifications of a session's end, sent to endpoints each tenant registers. A delivery is retried
    with exponential back-off until it succeeds or `give_up_after_s` has passed."""

    allowed_urls: list[str] = Field(
        default_factory=lambda: ["https://*"],
        description="where endpoints may point: URL patterns, '{tenant}' filled in, a trailing '*' any rest",
    )
    initial_backoff_s: float = Field(default=5.0, gt=0, description="the wait after the first failed attempt")
    max_backoff_s: float = Field(default=3600.0, gt=0, description="the longest wait between two attempts")
    give_up_after_s: float = Field(default=27 * 3600.0, gt=0, description="a delivery is retried this long")
    timeout_s: float = Field(default=10.0, gt=0, description="one attempt's time limit")
    max_endpoints: int = Field(default=10, ge=1, description="endpoints per tenant")
    # Held outside the database so that a copy of it (a backup, a read replica, a leaked dump) signs nothing.
    # A list so keys rotate: `monologue webhooks rotate-key` re-encrypts under the first
    # (monologue/webhooks/encryption.py).
    secret_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Fernet keys that encrypt endpoints' signing secrets in the database, newest first: the first"
        " encrypts, every one decrypts (unset: <home>/webhook-key, made at first use; the API and every node must"
        " share them)",
    )


class OutboundSettings(BaseModel):
    """Requests to addresses a caller chooses (URL inputs, webhooks): public addresses only, checked on the
    address actually connected to, unless the operator allows a range."""

    allowed_ranges: list[str] = Field(
        default_factory=list,
        description="CIDR ranges reachable besides public addresses (loopback, private, link-local), e.g. 10.1.0.0/16",
    )
    allow_http: bool = Field(default=False, description="plain http:// besides https:// (tests, internal networks)")


class InputSettings(BaseModel):
    """Inputs given by URL (`portrait_url`, `audio_url`): https, or s3:// from the buckets listed here."""

    s3_buckets: list[str] = Field(
        default_factory=list,
        description="where s3:// inputs may come from: 'bucket' or 'bucket/prefix' ('{tenant}' filled in)",
    )
    s3_endpoint_url: str | None = Field(default=None, description="the S3 server of s3:// inputs (unset: AWS)")
    fetch_timeout_s: float = Field(default=30.0, gt=0, description="one input's whole download")
    max_redirects: int = Field(default=5, ge=0, le=20)


class RetentionSettings(BaseModel):
    """How long a session's data is kept after it ended (portraits and voices are personal data). The scheduled
    RetentionWorkflow applies these; `monologue temporal setup` (and the embedded stack at start) writes them into
    its Temporal Schedule, so run it again after changing them. Unset: kept until the session is deleted."""

    inputs_days: float | None = Field(
        default=None,
        ge=0,
        description="remove the portrait, the speech and what is derived from them (the reference, the checkpoints:"
        " a session can no longer resume) this many days after the session ended; unset: keep",
    )
    outputs_days: float | None = Field(
        default=None,
        ge=0,
        description="remove the stream and the video this many days after the session ended; unset: keep",
    )
    every_s: float = Field(default=3600.0, ge=60, description="how often the retention workflow runs")
    batch: int = Field(default=100, ge=1, le=1000, description="sessions one activity call clears (heartbeating)")


class TtsSettings(BaseModel):
    """Speech from text on the nodes (`text` instead of audio; `gpu_worker/tts/`). espeak-ng needs nothing here."""

    piper_voice: Path | None = Field(
        default=None,
        description="a Piper voice's .onnx file (its .onnx.json beside it) for voice=piper; needs the piper extra",
    )


class IceTransportPolicy(StrEnum):
    """Which of its addresses a node offers WebRTC peers (RTCConfiguration.iceTransportPolicy)."""

    ALL = "all"  # its own addresses and, with TURN, relayed ones
    RELAY = "relay"  # only addresses relayed by the TURN server: where viewers cannot reach the node (a pod network)


class IceSettings(BaseModel):
    """STUN and TURN servers of the WebRTC connections (WHEP viewers, WHIP senders): the nodes' peer connections use
    them, and the player page gets them (`GET /v1/live/{id}/ice-servers`) with TURN credentials minted per connection
    the TURN REST API's way (coturn's `use-auth-secret`): the API and the nodes share `turn_secret` with the TURN
    server (monologue/ice.py)."""

    stun_urls: list[str] = Field(
        default_factory=list, description="STUN servers, e.g. 'stun:stun.example.net:3478' (JSON list)"
    )
    turn_urls: list[str] = Field(
        default_factory=list,
        description="TURN servers, e.g. 'turn:turn.example.net:3478?transport=udp' (JSON list; needs turn_secret)",
    )
    turn_secret: SecretStr | None = Field(
        default=None, description="the TURN server's static-auth-secret (coturn: use-auth-secret)"
    )
    credential_ttl_s: float = Field(
        default=3600.0, gt=0, le=7 * 86400, description="a minted TURN credential works this long"
    )
    transport_policy: IceTransportPolicy = Field(
        default=IceTransportPolicy.ALL,
        description="relay: the nodes offer only TURN-relayed addresses (viewers cannot reach a node itself)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> IceSettings:
        for url in self.stun_urls:
            if not url.startswith("stun:"):
                raise ValueError(f"a STUN URL starts with stun:, got {url!r}")
        for url in self.turn_urls:
            if not url.startswith(("turn:", "turns:")):
                raise ValueError(f"a TURN URL starts with turn: or turns:, got {url!r}")
        if self.turn_urls and self.turn_secret is None:
            raise ValueError("turn_urls need turn_secret (the TURN server's static-auth-secret)")
        if self.transport_policy is IceTransportPolicy.RELAY and not self.turn_urls:
            raise ValueError("transport_policy relay needs turn_urls (a TURN server to relay through)")
        return self


class SfuSettings(BaseModel):
    """The SFU a WebRTC live session's viewers watch through (Janus's Streaming plug-in, monologue/janus.py): the
    node publishes the session once, as RTP to a mountpoint, and Janus fans it out. Unset: viewers connect to the
    node itself. The API and the nodes read the same values; Janus's HTTP API stays on a private network."""

    janus_url: str | None = Field(
        default=None,
        description="Janus's HTTP API, e.g. http://janus:8088/janus; several, comma-separated: each live session is "
        "on one of them, chosen by its id (`janus_for`)",
    )
    api_secret: SecretStr | None = Field(default=None, description="Janus's API secret (its `-a`; the same on each)")
    rtp_host: str | None = Field(
        default=None,
        description="where the nodes send RTP (default: the session's Janus URL's host; a mountpoint listens on all); "
        "with one Janus only",
    )
    keyframe_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="a keyframe this often: a viewer joining the SFU shows its first frame at the next one",
    )
    max_viewers_per_session: int = Field(
        default=100,
        ge=1,
        description="viewers one live session may have on the SFU at once (more: 429); a seat is taken with the offer",
    )
    answer_timeout_s: float = Field(
        default=15.0,
        gt=0,
        le=60,
        description="a viewer that has not answered the SFU's offer this long after it is ended at its next `/alive` "
        "(a page answers within ~2 s; one that never does would otherwise hold a seat while it says it is there)",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SfuSettings:
        if self.janus_url is not None and not self.servers():
            raise ValueError("janus_url names no server: give Janus's HTTP API URL (several: comma-separated)")
        for url in self.servers():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"janus_url holds http(s) URLs of Janus's HTTP API, got {url!r}")
        if self.rtp_host is not None and len(self.servers()) > 1:
            raise ValueError("rtp_host names one Janus: with several, the nodes send to each session's own")
        return self

    def servers(self) -> list[str]:
        """The Janus servers' HTTP API URLs (none: no SFU)."""
        return [url.strip() for url in (self.janus_url or "").split(",") if url.strip()]

    def janus_for(self, session_id: str) -> str:
        """The Janus server of a session: the API and every node choose the same one (rendezvous hashing: each
        server scores the session, the highest wins), so a session that moves between nodes keeps its mountpoint,
        and a server added to the list takes only the sessions it now wins (change the list between sessions)."""
        servers = self.servers()
        if not servers:
            raise ValueError("no SFU: MONOLOGUE_SFU__JANUS_URL is not set")
        return max(servers, key=lambda url: hashlib.sha256(f"{url}\n{session_id}".encode()).digest())

    def rtp_address(self, session_id: str) -> str:
        """The host the nodes send the session's RTP to."""
        from urllib.parse import urlsplit

        return self.rtp_host or urlsplit(self.janus_for(session_id)).hostname or "127.0.0.1"

    def mountpoint_secret(self, session_id: str) -> str:
        """The session's mountpoint secret, the same on every node and API replica (from the shared API secret)."""
        key = (self.api_secret.get_secret_value() if self.api_secret else "monologue").encode()
        return hmac.new(key, session_id.encode(), hashlib.sha256).hexdigest()[:32]


class LimitSettings(BaseModel):
    """What one caller may cost the service. Every limit has a default: an unlimited one is a way to run the
    API out of memory, disk or node slots."""

    max_upload_bytes: int = Field(default=50 * 1024 * 1024, ge=1, description="one uploaded file")
    max_portrait_side: int = Field(default=4096, ge=64)
    max_audio_seconds: float = Field(default=1200.0, gt=0, description="a render's audio (decoding stops past it)")
    max_sessions_per_tenant: int = Field(default=10, ge=1, description="queued or running sessions per tenant")
    max_live_seconds: float = Field(
        default=4 * 3600.0, gt=0, description="a live session's lifetime from its creation, and its audio"
    )
    max_streams_per_key: int = Field(default=8, ge=1, description="open event streams and audio sockets per API key")

    @property
    def max_body_bytes(self) -> int:
        """A whole request: two uploads (portrait and audio) and the form's other fields."""
        return 2 * self.max_upload_bytes + 64 * 1024


class SchedSettings(BaseModel):
    """Who runs first when nodes are busy (docs/scheduling.md): Temporal orders the lease queue by class and, within a
    class, shares it between tenants by weight; a live session that waits asks a render to yield its slot."""

    tenant_weights: dict[str, float] = Field(
        default_factory=dict,
        description='fairness weights by tenant, JSON (e.g. {"acme": 3}): a tenant of weight 3 gets 3 slots to '
        "another's 1 when both wait; unlisted tenants weigh default_weight",
    )
    default_weight: float = Field(default=1.0, gt=0, description="the weight of a tenant not in tenant_weights")
    live_start_timeout_s: float = Field(
        default=5.0, gt=0, description="a live session that has no node this long after its creation is refused (503)"
    )
    preempt_after_s: float = Field(
        default=1.0,
        ge=0,
        description="a session waiting for a node asks a render to yield as it queues, and again after this long "
        "(0: never)",
    )
    max_preemptions: int = Field(
        default=2, ge=1, description="a render that has yielded this often is asked to yield only when no other can"
    )
    yield_grace_s: float = Field(
        default=30.0, gt=0, description="a render asked to yield that has not within this long is asked no more"
    )

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, self.default_weight)
