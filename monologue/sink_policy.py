"""Which sinks a session may publish to: the operator's allow-lists (`SinkSettings`) applied to one tenant.

Sinks write with the nodes' credentials, so a sink is checked against the settings of the day wherever it
is about to be used: by the API when a session starts and when it resumes, by each sink pump before it
writes, and by the Kinesis Video sink on the data endpoint its control plane hands back. One module, so
they all agree. It is imported by the API, the activities and the node alike: never boto3 or torch here.

Patterns: `{tenant}` is replaced by the session's tenant, and a trailing `*` matches any rest of the name
(for S3, of the pattern's last path segment). S3 entries are 'bucket' (any prefix) or 'bucket/prefix',
matched by whole path segments: 'videos/{tenant}' lets tenant `a` write under `a/` and `a/x/`, never `ab/`.
Endpoints match by scheme, host, port (defaults filled in) and path, a trailing slash ignored; Kinesis
Video endpoints may also name '*.' host wildcards, which match subdomains.
"""

from __future__ import annotations

import re
from typing import NamedTuple
from urllib.parse import urlsplit

from monologue.apikeys import TENANT
from monologue.contracts import KvsSink, S3Sink, Sink
from monologue.errors import InputError
from monologue.settings import SinkSettings

DEFAULT_PORTS = {"http": 80, "https": 443}
_REGION = re.compile(r"[a-z0-9-]{1,32}")


class SinkRefused(InputError):
    """The operator's allow-lists do not (or no longer) allow a sink; the message names the setting."""


class Endpoint(NamedTuple):
    scheme: str
    host: str
    port: int
    path: str


def for_tenant(allowed: SinkSettings, tenant: str) -> SinkSettings:
    """The allow-lists with `{tenant}` filled in: what `tenant`'s sinks may use (nothing for a bad name)."""
    # Tenants are checked when keys are made; checked again here because a tenant holding '*' or '/' would
    # widen every pattern it lands in (another tenant's prefix, any stream).
    if not TENANT.fullmatch(tenant):
        return SinkSettings()

    def fill(patterns: list[str]) -> list[str]:
        return [pattern.replace("{tenant}", tenant) for pattern in patterns]

    return SinkSettings(
        s3_buckets=fill(allowed.s3_buckets),
        kvs_streams=fill(allowed.kvs_streams),
        s3_endpoints=fill(allowed.s3_endpoints),
        kvs_endpoints=fill(allowed.kvs_endpoints),
    )


def refusal(sink: Sink, *, tenant: str, allowed: SinkSettings) -> str | None:
    """Why a session of `tenant` may not publish to `sink` under `allowed` (naming the setting), or None."""
    if not TENANT.fullmatch(tenant):
        return f"sink {sink.label!r}: tenant {tenant!r} is not a valid tenant name, so it may use no sink"
    mine = for_tenant(allowed, tenant)
    if isinstance(sink, S3Sink):
        return _s3_refusal(sink, tenant, mine)
    return _kvs_refusal(sink, tenant, mine)


def check(sink: Sink, *, tenant: str, allowed: SinkSettings) -> None:
    """`refusal` as an error: SinkRefused (an InputError: never worth a retry) if the sink is not allowed."""
    problem = refusal(sink, tenant=tenant, allowed=allowed)
    if problem is not None:
        raise SinkRefused(problem)


def data_endpoint_refusal(url: str, *, region: str, control_endpoint: str | None, allowed: SinkSettings) -> str | None:
    """Why a Kinesis Video sink may not connect to the data endpoint `url` its control plane returned, or None.

    AWS's control plane (no `control_endpoint`) must hand out an https host of its own region; a control plane
    the operator named hands out endpoints that must be in `allowed.kvs_endpoints` (the tenant's lists)."""
    if control_endpoint is None:
        suffix = f".kinesisvideo.{region}.amazonaws.com" + (".cn" if region.startswith("cn-") else "")
        given = parse_endpoint(url)
        if (
            given is None
            or not _REGION.fullmatch(region)
            or (given.scheme, given.port, given.path) != ("https", 443, "")
            or not given.host.endswith(suffix)
        ):
            return (
                f"GetDataEndpoint returned {url!r}, not an AWS Kinesis Video endpoint of region {region}"
                f" (https://<name>{suffix}); refusing to send the stream there"
            )
        return None
    if not endpoint_allowed(url, allowed.kvs_endpoints, wildcards=True):
        return (
            f"the control plane {control_endpoint} returned the data endpoint {url!r}, which is not in"
            " MONOLOGUE_SINKS__KVS_ENDPOINTS; refusing to send the stream there"
        )
    return None


def endpoint_allowed(url: str, entries: list[str], *, wildcards: bool = False) -> bool:
    """Whether `url` is one of `entries` (scheme, host, port and path); `wildcards`: '*.host' entries match
    subdomains of host."""
    given = parse_endpoint(url)
    if given is None:
        return False
    for entry in entries:
        wanted = parse_endpoint(entry)
        if wanted is None or (given.scheme, given.port, given.path) != (wanted.scheme, wanted.port, wanted.path):
            continue
        if given.host == wanted.host or (
            wildcards and wanted.host.startswith("*.") and given.host.endswith(wanted.host[1:])
        ):
            return True
    return False


def parse_endpoint(url: str) -> Endpoint | None:
    """An endpoint URL normalised for comparison; None for anything but plain http(s)://host[:port][/path]
    (user info, a query or a fragment would let one URL say two things)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").rstrip(".")
    if scheme not in DEFAULT_PORTS or not host or "@" in parts.netloc or parts.query or parts.fragment:
        return None
    return Endpoint(scheme, host, port or DEFAULT_PORTS[scheme], parts.path.rstrip("/"))


def s3_object_allowed(patterns: list[str], *, tenant: str, bucket: str, key: str) -> bool:
    """Whether object `key` of `bucket` is under one of `patterns` ('bucket' or 'bucket/prefix', `{tenant}` filled
    in, matched by whole path segments as for sinks): where inputs by s3:// URL may come from."""
    if not TENANT.fullmatch(tenant):
        return False
    folders = _segments(key)[:-1]
    if any(segment in (".", "..") for segment in _segments(key)):
        return False
    return any(_bucket_matches(pattern.replace("{tenant}", tenant), bucket, folders) for pattern in patterns)


def _s3_refusal(sink: S3Sink, tenant: str, mine: SinkSettings) -> str | None:
    if sink.endpoint_url is not None and not endpoint_allowed(sink.endpoint_url, mine.s3_endpoints):
        return (
            f"sink {sink.label!r}: endpoint_url {sink.endpoint_url} is not one S3 sinks may use"
            " (MONOLOGUE_SINKS__S3_ENDPOINTS)"
        )
    segments = _segments(sink.prefix)
    if any(segment in (".", "..") for segment in segments):
        return f"sink {sink.label!r}: prefix {sink.prefix!r} may not contain '.' or '..' segments"
    if not any(_bucket_matches(pattern, sink.bucket, segments) for pattern in mine.s3_buckets):
        where = "/".join([sink.bucket, *segments])
        return (
            f"sink {sink.label!r}: tenant {tenant!r} may not write to s3://{where}/"
            " (MONOLOGUE_SINKS__S3_BUCKETS lists where sinks may write)"
        )
    return None


def _kvs_refusal(sink: KvsSink, tenant: str, mine: SinkSettings) -> str | None:
    if sink.endpoint_url is not None and not endpoint_allowed(sink.endpoint_url, mine.kvs_endpoints, wildcards=True):
        return (
            f"sink {sink.label!r}: endpoint_url {sink.endpoint_url} is not one Kinesis Video sinks may use"
            " (MONOLOGUE_SINKS__KVS_ENDPOINTS)"
        )
    if not any(_name_matches(pattern, sink.stream_name) for pattern in mine.kvs_streams):
        return (
            f"sink {sink.label!r}: tenant {tenant!r} may not publish to stream {sink.stream_name!r}"
            " (MONOLOGUE_SINKS__KVS_STREAMS)"
        )
    return None


def _segments(prefix: str) -> list[str]:
    """A prefix's path segments as the S3 sink uses it (it strips outer slashes; inner ones are kept)."""
    stripped = prefix.strip("/")
    return stripped.split("/") if stripped else []


def _bucket_matches(pattern: str, bucket: str, segments: list[str]) -> bool:
    bucket_pattern, _, prefix_pattern = pattern.partition("/")
    wanted = _segments(prefix_pattern)
    if not wanted:
        return _name_matches(bucket_pattern, bucket)
    if bucket != bucket_pattern or len(segments) < len(wanted):
        return False
    *leading, last = wanted
    return segments[: len(leading)] == leading and _name_matches(last, segments[len(leading)])


def _name_matches(pattern: str, name: str) -> bool:
    return name == pattern or (pattern.endswith("*") and name.startswith(pattern[:-1]))
