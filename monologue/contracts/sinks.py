"""Publishers besides the HLS stream: a session's sinks (S3, Kinesis Video), as its options carry them.
Standard library only: they cross Temporal inside `RenderOptions`."""

# No `from __future__ import annotations`: Temporal's converter resolves these field types at run time.
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal

from monologue.contracts.bounds import Bounds

_SINK_NAME = Bounds("Unique per session; default: type.", pattern=r"^[a-z0-9-]{0,32}$")
_ENDPOINT = Bounds("Endpoint (default AWS's own).", pattern=r"^https?://[^\s/]+(/\S*)?$")
_REGION = Bounds("AWS region.", pattern=r"^[a-z0-9-]{1,32}$")


@dataclass(frozen=True)
class S3Sink:
    """Publish the stream to an S3-compatible bucket: keys under <prefix>/<session id>/. Credentials are the
    nodes' (boto3's usual chain)."""

    bucket: Annotated[str, Bounds("Bucket.", pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")]
    type: Literal["s3"] = "s3"
    name: Annotated[str, _SINK_NAME] = ""
    prefix: Annotated[str, Bounds("Keys go under <prefix>/<session id>/.", pattern=r"^[A-Za-z0-9/_.-]{0,200}$")] = ""
    endpoint_url: Annotated[str | None, _ENDPOINT] = None
    region: Annotated[str | None, _REGION] = None

    def __post_init__(self) -> None:
        if ".." in self.prefix.split("/"):
            raise ValueError(f"an s3 prefix may not contain '..' (got {self.prefix!r})")

    @property
    def label(self) -> str:
        return self.name or self.type


@dataclass(frozen=True)
class KvsSink:
    """Publish the stream to a Kinesis Video stream (PutMedia). Credentials are the nodes'."""

    stream_name: Annotated[str, Bounds("Kinesis Video stream name.", pattern=r"^[a-zA-Z0-9_.-]{1,256}$")]
    type: Literal["kvs"] = "kvs"
    name: Annotated[str, _SINK_NAME] = ""
    endpoint_url: Annotated[str | None, _ENDPOINT] = None
    region: Annotated[str | None, _REGION] = None

    @property
    def label(self) -> str:
        return self.name or self.type


# A sink, told apart by `type` (S3 first: Temporal's converter tries a union's members in order, and the
# `type` literal refuses the wrong one).
Sink = S3Sink | KvsSink


class SinkType(StrEnum):
    """Which publisher a sink is: its spec's `type` tag (the literal that tells the union's members apart on the
    wire), as an enum for everything past the spec (the sink's row, the API, metrics)."""

    S3 = S3Sink.type
    KVS = KvsSink.type


def sink_spec(spec: object) -> Sink:
    """A sink from its stored or decoded form (a dict, or a sink already)."""
    if isinstance(spec, S3Sink | KvsSink):
        return spec
    fields = {key: value for key, value in dict(spec).items() if value not in ("", None)}  # type: ignore[call-overload]
    if fields.get("type") == SinkType.KVS:
        return KvsSink(**{k: v for k, v in fields.items() if k in _KVS_FIELDS})
    return S3Sink(**{k: v for k, v in fields.items() if k in _S3_FIELDS})


_S3_FIELDS = frozenset(S3Sink.__dataclass_fields__)
_KVS_FIELDS = frozenset(KvsSink.__dataclass_fields__)
