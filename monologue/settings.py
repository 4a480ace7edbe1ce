"""One validated `Settings` per process, read from `MONOLOGUE_*` environment variables (nested groups
with `__`, e.g. `MONOLOGUE_STORAGE__BACKEND=s3`). Nothing else in the project reads the environment."""

from __future__ import annotations

import json
import socket
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from monologue.contracts.session import Family, Residency
from monologue.options import defaults_model
from monologue.settings_services import (
    IceSettings as IceSettings,
    InputSettings as InputSettings,
    LimitSettings as LimitSettings,
    LinkSettings as LinkSettings,
    OutboundSettings as OutboundSettings,
    RetentionSettings as RetentionSettings,
    SchedSettings as SchedSettings,
    SfuSettings as SfuSettings,
    SinkSettings as SinkSettings,
    TtsSettings as TtsSettings,
    WebhookSettings as WebhookSettings,
)


class StorageSettings(BaseModel):
    """Where inputs, intermediate segments and videos live."""

    backend: Literal["local", "s3"] = "local"
    root: Path | None = Field(default=None, description="local folder; default <home>/objects")
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = Field(default=None, description="any S3-compatible server; unset: AWS")
    region: str | None = None
    retry_for_s: float = Field(
        default=45.0,
        ge=0,
        description="S3: how long one storage call retries while the store is down or throttling (nodes, live audio);"
        " then the activity fails and Temporal retries it",
    )
    request_retry_for_s: float = Field(
        default=2.0, ge=0, description="S3: the same for an API request's storage calls, before it answers 503"
    )

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> StorageSettings:
        if self.backend == "s3" and not self.bucket:
            raise ValueError("storage.backend is 's3' but storage.bucket is empty; set MONOLOGUE_STORAGE__BUCKET")
        return self


class TemporalTlsSettings(BaseModel):
    """TLS to the Temporal frontend: a self-hosted cluster's CA, and a client certificate for mTLS."""

    enabled: bool | None = Field(
        default=None, description="unset: on when a CA, a client certificate or an API key is set"
    )
    server_ca_cert: Path | None = Field(default=None, description="PEM CA that signed the frontend's certificate")
    client_cert: Path | None = Field(default=None, description="PEM client certificate (mTLS)")
    client_key: Path | None = Field(default=None, description="PEM private key of the client certificate")
    server_name: str | None = Field(default=None, description="the name to verify on the frontend's certificate")

    @model_validator(mode="after")
    def _cert_needs_key(self) -> TemporalTlsSettings:
        if (self.client_cert is None) != (self.client_key is None):
            raise ValueError(
                "temporal.tls: client_cert and client_key go together (mTLS); set both"
                " MONOLOGUE_TEMPORAL__TLS__CLIENT_CERT and MONOLOGUE_TEMPORAL__TLS__CLIENT_KEY, or neither"
            )
        return self


class TemporalSettings(BaseModel):
    """Where Temporal is and how to reach it; `monologue/temporal_client.py` turns this into the connection."""

    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    # Shared queue: session starts (prepare) and node acquisition. Each node also polls `node-<id>`.
    task_queue: str = "monologue"
    ui_port: int = 8233
    ui_url: str | None = None  # link shown to users; defaults to http://127.0.0.1:<ui_port>
    search_attributes: bool = Field(
        default=True, description="tag workflows with status, node and tenant (register them on your cluster)"
    )
    api_key: SecretStr | None = Field(default=None, description="Temporal Cloud API key (turns TLS on)")
    tls: TemporalTlsSettings = TemporalTlsSettings()
    profile: str | None = Field(
        default=None,
        description="a temporalio.envconfig profile (TOML file and TEMPORAL_* variables) to start from;"
        " MONOLOGUE_TEMPORAL__* values that are set override it",
    )
    config_file: Path | None = Field(default=None, description="that profile's TOML file (unset: Temporal's own)")


class TracingSettings(BaseModel):
    """OpenTelemetry traces: one trace from an HTTP request through its workflow to every chunk."""

    exporter: Literal["none", "otlp"] = Field(default="none", description="none: no spans are made")
    otlp_endpoint: str = Field(
        default="http://127.0.0.1:4318/v1/traces", description="OTLP over HTTP (protobuf) collector URL"
    )
    service_name: str | None = Field(default=None, description="default monologue-api / monologue-node")


class ApiSettings(BaseModel):
    host: str = "127.0.0.1"
    port: int = 8000
    # The base of every URL the API hands out (never the request's Host header); default http://<host>:<port>.
    public_url: str | None = None
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host header values the API answers besides public_url's host and loopback names"
        " (a leading '*.' matches subdomains; '*' any host, not recommended)",
    )
    # /ops without a key for browsers on this machine: decided from the socket's peer address, never from
    # forwarded headers, and only for loopback Host names. For a single-user machine with no reverse proxy.
    ops_open_on_loopback: bool = False
    key_recheck_s: float = Field(
        default=5.0, gt=0, description="long-lived streams (events, audio sockets) re-check their key this often"
    )
    events_poll_s: float = Field(default=1.0, gt=0, description="an event stream looks for progress this often")
    validate_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a new session's uploads are checked by a node within this long, or the request is a 503",
    )
    temporal_metrics_port: int | None = Field(
        default=None, description="the API's Temporal SDK metrics (Prometheus) on this port; unset: off"
    )
    idempotency_ttl_s: float = Field(
        default=24 * 3600.0, gt=0, description="an Idempotency-Key names its first session for this long"
    )
    events_keepalive_s: float = Field(
        default=15.0, gt=0, description="an idle event stream sends a keep-alive comment this often"
    )
    backlog_interval_s: float = Field(
        default=5.0, gt=0, description="the lease queue's backlog (/metrics, for autoscaling) is polled this often"
    )


class NodeSettings(BaseModel):
    id: str = Field(default_factory=lambda: socket.gethostname().split(".")[0].lower() or "local")
    capacity: int = Field(default=1, ge=1)
    # A chunk can take seconds; a node told to stop finishes it instead of abandoning it.
    graceful_shutdown_s: float = Field(default=30.0, ge=0)
    lease_timeout_s: float = Field(
        default=10.0, gt=0, description="a node silent this long is declared lost and its sessions move"
    )
    live_lease_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="a live session's lease (at most lease_timeout_s): its viewers stall for this long and a new "
        "node's first chunk when its node dies; shorter costs more heartbeats, and spurious moves on a starved node",
    )
    heartbeat_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a session's pinned activity (a chunk) silent this long is declared lost and moves to another node",
    )
    warm_families: list[Family] = Field(
        default_factory=lambda: [Family.WARP],
        description="families the node builds and runs once (a throwaway session on the bundled samples) before it "
        "takes a session; /readyz waits for it. Others load on their first session",
    )
    warm_up_timeout_s: float = Field(
        default=600.0, gt=0, description="a node whose warm-up takes longer stops: its accelerator or disk is broken"
    )
    chunk_delay_s: float = Field(default=0.0, ge=0, description="testing only: stretch every chunk by this long")
    finalize_delay_s: float = Field(
        default=0.0, ge=0, description="testing only: finalize pauses this long once the final MP4 is stored"
    )
    session_load_delay_s: float = Field(
        default=0.0,
        ge=0,
        description="testing only: loading a session from storage takes this much longer, without a heartbeat",
    )
    hang_chunk: str = Field(
        default="",
        pattern=r"^([NI][0-9]+)?$",
        description="testing only: this chunk (e.g. N1) hangs on this node without heartbeating, as on a stuck GPU",
    )
    http_port: int | None = Field(
        default=None, description="the node's /metrics, /healthz and /readyz on this port; unset: off"
    )
    http_host: str = Field(default="127.0.0.1", description="where that port listens (0.0.0.0 in a pod)")
    temporal_metrics_port: int | None = Field(
        default=None, description="the node's Temporal SDK metrics (Prometheus) on this port; unset: off"
    )
    media_port: int = Field(
        default=0,
        ge=0,
        description="the node's WebRTC signalling port (WHEP/WHIP, forwarded by the API; node/webrtc/); 0: any free "
        "port. Its address is recorded in the node's row, where the API finds it",
    )
    media_url: str | None = Field(
        default=None,
        description="the address the API reaches that port at (http://<pod-ip>:<port> in a pod); unset: "
        "http://<http_host>:<media_port>",
    )
    max_viewers_per_session: int = Field(
        default=16, ge=1, description="WebRTC viewers one live session may have at once on its node (more: 429)"
    )
    ice_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="a WebRTC viewer whose connection is not up this long after its offer is dropped",
    )
    require_gpu: bool = Field(default=False, description="/readyz fails until a CUDA device is visible")
    # Finalize assembles the whole final MP4 here and a sink pump copies it here: give it room for the longest video.
    scratch_dir: Path | None = Field(
        default=None,
        description="where the node writes its temporary files (the final MP4 being assembled, a sink's copy); "
        "created at start. Unset: the system's temporary folder",
    )
    min_free_scratch_mb: float = Field(
        default=64.0,
        ge=0,
        description="the node takes no new session while its scratch_dir has less than this free (MiB), and "
        "/readyz says so; set it above the largest final video the node makes",
    )
    residency: Residency = Field(
        default=Residency.RESIDENT,
        description="resident: every model of a family stays on the GPU; switch: only the running stage's models "
        "do, the others wait in pinned host memory (for models that do not fit together)",
    )


class DatabasePoolSettings(BaseModel):
    """Each process's connections to the database (SQLAlchemy's pool). The API holds one only for the length of a
    query or a short transaction, never while a stream is open or across an await, so a small pool serves many
    open streams; a request that finds the pool empty waits at most timeout_s, then fails (503 on /readyz)."""

    size: int = Field(default=5, ge=1, description="connections kept open")
    max_overflow: int = Field(default=10, ge=0, description="further connections opened under load, then closed")
    timeout_s: float = Field(default=30.0, gt=0, description="how long a request waits for a free connection")


class RenderDefaults(defaults_model()):  # type: ignore[misc]
    """Per-session defaults (`MONOLOGUE_RENDER__<OPTION>`): every field of `contracts.RenderOptions`, derived, so a
    new option has a setting too; and how sessions are orchestrated."""

    continue_as_new_every: int = Field(default=500, ge=1, description="chunks per workflow run (bounded history)")
    live_first_chunk_frames: int = Field(
        default=16, ge=0, le=250, description="live sessions: frames in the first chunk (time to first frame)"
    )
    live_idle_timeout_s: float = Field(
        default=30.0, gt=0, description="live sessions: no audio (non-empty audio messages) for this long ends it"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MONOLOGUE_", env_nested_delimiter="__", extra="forbid")

    home: Path = Field(default=Path("var"), description="local state: Temporal's DB, SQLite, objects, logs")
    database_url: str | None = Field(
        default=None, description="default sqlite:///<home>/monologue.db; or postgresql+psycopg://user@host/db"
    )
    database_pool: DatabasePoolSettings = DatabasePoolSettings()
    log_format: Literal["auto", "json", "console"] = "auto"  # auto: console on a TTY, JSON elsewhere
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    storage: StorageSettings = StorageSettings()
    temporal: TemporalSettings = TemporalSettings()
    api: ApiSettings = ApiSettings()
    node: NodeSettings = NodeSettings()
    limits: LimitSettings = LimitSettings()
    sched: SchedSettings = SchedSettings()
    sinks: SinkSettings = SinkSettings()
    render: RenderDefaults = RenderDefaults()
    tracing: TracingSettings = TracingSettings()
    links: LinkSettings = LinkSettings()
    webhooks: WebhookSettings = WebhookSettings()
    outbound: OutboundSettings = OutboundSettings()
    inputs: InputSettings = InputSettings()
    retention: RetentionSettings = RetentionSettings()
    tts: TtsSettings = TtsSettings()
    ice: IceSettings = IceSettings()
    sfu: SfuSettings = SfuSettings()

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        self.home = self.home.absolute()
        if self.database_url is None:
            self.database_url = f"sqlite:///{self.home / 'monologue.db'}"
        if self.storage.backend == "local" and self.storage.root is None:
            self.storage.root = self.home / "objects"
        if self.temporal.ui_url is None:
            self.temporal.ui_url = f"http://127.0.0.1:{self.temporal.ui_port}"
        if self.api.public_url is None:
            self.api.public_url = f"http://{self.api.host}:{self.api.port}"
        return self

    @property
    def db_url(self) -> str:
        """The database URL, always set after validation."""
        if self.database_url is None:  # pragma: no cover - filled by the validator
            raise RuntimeError("database_url not resolved")
        return self.database_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, validated once."""
    return Settings()


def to_env(settings: Settings) -> dict[str, str]:
    """The `MONOLOGUE_*` variables that rebuild `settings` in a child process (unset fields omitted)."""
    env: dict[str, str] = {}

    def walk(prefix: str, data: dict[str, object]) -> None:
        for name, value in data.items():
            key = f"{prefix}{name.upper()}"
            if isinstance(value, dict):
                walk(f"{key}__", value)
            elif isinstance(value, list):
                env[key] = json.dumps(value)  # pydantic-settings reads lists as JSON
            elif value is not None:
                env[key] = str(value)

    walk("MONOLOGUE_", _revealed(settings, settings.model_dump(mode="json")))
    return env


def _revealed(model: BaseModel, data: dict[str, object]) -> dict[str, object]:
    """`data` (a JSON dump of `model`) with its secrets in clear: the dump masks them, a child needs them."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, SecretStr):
            data[name] = value.get_secret_value()
        elif isinstance(value, list) and any(isinstance(item, SecretStr) for item in value):
            data[name] = [item.get_secret_value() if isinstance(item, SecretStr) else item for item in value]
        elif isinstance(value, BaseModel) and isinstance(data.get(name), dict):
            _revealed(value, data[name])  # type: ignore[arg-type]
    return data


def describe_settings() -> str:
    """One line per setting, for `--help` and the README."""
    lines: list[str] = []

    def walk(prefix: str, model: type[BaseModel]) -> None:
        for name, info in model.model_fields.items():
            annotation = info.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(f"{prefix}{name.upper()}__", annotation)
                continue
            default = info.get_default(call_default_factory=False)
            if info.default_factory is not None and info.default_factory() == []:  # type: ignore[call-arg]
                shown = "[]"
            elif info.default_factory is not None:
                shown = "(computed)"
            elif default is None:
                shown = "(unset)"
            else:
                shown = str(default)
            note = f"  -- {info.description}" if info.description else ""
            lines.append(f"{prefix}{name.upper()}={shown}{note}")

    walk("MONOLOGUE_", Settings)
    return "\n".join(lines)
