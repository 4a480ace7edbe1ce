"""The one place that turns settings into a Temporal connection, for the API, the nodes, the embedded stack's
checks and the benches: address and namespace, TLS (the cluster's CA, a client certificate for mTLS), an API
key (Temporal Cloud), all on top of an optional `temporalio.envconfig` profile (Temporal's own TOML file and
`TEMPORAL_*` variables); plus the tracing interceptor and the SDK's Prometheus metrics runtime.

Precedence: a profile's values first, then every `MONOLOGUE_TEMPORAL__*` value that is set. Nothing here
imports OpenTelemetry unless tracing is on (`monologue/tracing.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from temporalio.client import Client, Interceptor
from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RetryConfig, TLSConfig

from monologue import tracing
from monologue.errors import InputError
from monologue.settings import TemporalSettings, TemporalTlsSettings

# The client's retries of a call Temporal did not answer (not its workers' long polls: node/pollers.py): the SDK's
# default, but never more than a second apart, so a call made during an outage goes through within a second of the
# server's return; still given up after about 10 s (the API then answers 503, api/outages.py).
RETRY = RetryConfig(
    initial_interval_millis=100,
    multiplier=1.5,
    max_interval_millis=1000,
    max_elapsed_time_millis=10_000,
    max_retries=30,
)


class TemporalConfigError(InputError):
    """The Temporal connection settings cannot work (a missing certificate file, an unknown profile)."""


def connect_args(settings: TemporalSettings) -> dict[str, Any]:
    """`Client.connect` keyword arguments (target_host, namespace, tls, api_key, rpc_metadata) from settings."""
    args: dict[str, Any] = dict(_profile(settings))
    explicit = settings.model_fields_set
    for field, key in (("address", "target_host"), ("namespace", "namespace")):
        if field in explicit or key not in args:
            args[key] = getattr(settings, field)
    if settings.api_key is not None:
        args["api_key"] = settings.api_key.get_secret_value()
    tls = _tls(settings.tls, args.get("tls"), api_key=args.get("api_key") is not None)
    if tls is None:
        args.pop("tls", None)
    else:
        args["tls"] = tls
    return args


def _profile(settings: TemporalSettings) -> dict[str, Any]:
    """The envconfig profile's connect config, or nothing when no profile or file is named."""
    if settings.profile is None and settings.config_file is None:
        return {}
    if settings.config_file is not None and not settings.config_file.is_file():
        raise TemporalConfigError(f"temporal.config_file {settings.config_file} is not a file")
    try:
        profile = ClientConfigProfile.load(profile=settings.profile, config_source=settings.config_file)
    except (RuntimeError, ValueError, OSError) as err:  # the bridge reports a bad file or profile as these
        raise TemporalConfigError(f"temporal.profile {settings.profile or 'default'}: {err}") from err
    return dict(profile.to_client_connect_config())


def _tls(settings: TemporalTlsSettings, from_profile: object, *, api_key: bool) -> bool | TLSConfig | None:
    """Our TLS settings over the profile's: False (off), True (system roots), a TLSConfig, or None (unsaid)."""
    if settings.enabled is False:
        return False
    files = (settings.server_ca_cert, settings.client_cert, settings.client_key)
    if all(path is None for path in files) and settings.server_name is None:
        if settings.enabled or (from_profile is None and api_key):
            return from_profile if isinstance(from_profile, TLSConfig) else True
        return from_profile if isinstance(from_profile, bool | TLSConfig) else None
    base = from_profile if isinstance(from_profile, TLSConfig) else TLSConfig()
    return TLSConfig(
        server_root_ca_cert=_read(settings.server_ca_cert, "SERVER_CA_CERT") or base.server_root_ca_cert,
        client_cert=_read(settings.client_cert, "CLIENT_CERT") or base.client_cert,
        client_private_key=_read(settings.client_key, "CLIENT_KEY") or base.client_private_key,
        domain=settings.server_name or base.domain,
    )


def _read(path: Path | None, name: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.read_bytes()
    except OSError as err:
        raise TemporalConfigError(f"MONOLOGUE_TEMPORAL__TLS__{name}={path}: {err.strerror}") from err


@lru_cache(maxsize=4)
def metrics_runtime(bind_address: str) -> Runtime:
    """One SDK runtime per metrics address: its workers' and clients' metrics on a Prometheus endpoint."""
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind_address)))


async def connect(
    settings: TemporalSettings,
    *,
    metrics_address: str | None = None,
    lazy: bool = False,
    interceptors: Sequence[Interceptor] = (),
) -> Client:
    """A Temporal client from settings. `metrics_address` ("host:port"): the SDK's metrics there (one runtime
    per address and process); `lazy`: connect on first use (an API may start before Temporal answers; a
    worker's client must not be lazy). Tracing on (`tracing.configure`) adds its interceptor: on a worker's
    client it traces the workflows and activities too."""
    extra: dict[str, Any] = {}
    if metrics_address is not None:
        extra["runtime"] = metrics_runtime(metrics_address)
    try:
        return await Client.connect(
            **connect_args(settings),
            interceptors=[*tracing.temporal_interceptors(), *interceptors],
            lazy=lazy,
            retry_config=RETRY,
            **extra,
        )
    except RuntimeError as err:  # the bridge's connection errors name the address, not our settings
        raise ConnectionError(f"cannot connect to Temporal at {settings.address}: {err}") from err
