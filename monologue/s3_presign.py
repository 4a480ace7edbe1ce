"""S3 clients and presigned playlists: what the API (serving an S3 sink's playlist) and the node's S3 sink
(writing it) share. Torch-free and media-free on purpose: the API imports it, so it must never import
`gpu_worker` or anything of the media stack."""

from __future__ import annotations

import functools
from typing import Any

import boto3
from botocore.config import Config


@functools.lru_cache(maxsize=32)
def s3_client(*, endpoint_url: str | None, region: str | None) -> Any:
    """A boto3 S3 client with retries in adaptive mode (throttling backs off instead of failing). One per
    endpoint and region, shared (boto3 clients are thread-safe; making one takes tens of milliseconds, too
    much for every playlist a player refetches)."""
    config = Config(
        signature_version="s3v4", retries={"max_attempts": 5, "mode": "adaptive"}, s3={"addressing_style": "path"}
    )
    return boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)


def sink_base_key(prefix: str, session_id: str) -> str:
    """Where an S3 sink puts a session's objects: `<prefix>/<session id>/` (`<session id>/` without a prefix)."""
    bare = prefix.strip("/")
    return f"{bare}/{session_id}/" if bare else f"{session_id}/"


def presigned_playlist(client: Any, *, bucket: str, base_key: str, playlist_text: str, expires_s: int) -> str:
    """A sink's playlist with every URI (the init segment and each segment) replaced by a presigned URL:
    a presigned playlist alone does not play from a private bucket, as its relative segment links carry no
    signature."""

    def sign(name: str) -> str:
        url: str = client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": base_key + name}, ExpiresIn=expires_s
        )
        return url

    lines = []
    for line in playlist_text.splitlines():
        if line.startswith("#EXT-X-MAP:URI="):
            name = line.split('"')[1]
            line = f'#EXT-X-MAP:URI="{sign(name)}"'
        elif line and not line.startswith("#"):
            line = sign(line)
        lines.append(line)
    return "\n".join(lines) + "\n"
