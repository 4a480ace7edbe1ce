"""The S3 sink: a session's HLS stream and final video in any S3-compatible bucket, as they land.

Keys under `<prefix>/<session id>/`: `init.mp4`, `seg-<timeline index>.m4s`, `stream.m3u8` and, once the
session completes, `final.mp4` (a multipart upload above 8 MiB, through boto3's managed transfer).

Segments are written with `If-None-Match: *`: a segment key is derived from the session and its timeline
position, and a regenerated segment has the same bytes, so a retry or a resumed sink that finds the key
taken (412) knows it is already there and moves on; nothing is ever overwritten. The playlist is the one
object that changes, so it is a plain put. Credentials come from boto3's usual chain (environment,
profile, instance role): never from the request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from boto3.s3.transfer import TransferConfig
from botocore.exceptions import BotoCoreError, ClientError

from gpu_worker.publish.playlist import playlist as hls_playlist
from gpu_worker.publish.sinks import Sink, SinkError
from monologue.s3_presign import s3_client, sink_base_key

MULTIPART_THRESHOLD = 8 * 1024 * 1024


def segment_name(index: int) -> str:
    return f"seg-{index:06d}.m4s"


class S3Sink(Sink):
    def __init__(
        self,
        *,
        session_id: str,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        target_duration: float,
        client: Any = None,
        name: str = "s3",
    ) -> None:
        self.name = name
        self._client = client or s3_client(endpoint_url=endpoint_url, region=region)
        self._bucket = bucket
        self._base = sink_base_key(prefix, session_id)
        self._target_duration = target_duration
        self._next = 0
        self.written = 0  # objects this sink created (412: already there, not counted)

    def key(self, name: str) -> str:
        return self._base + name

    def start(self, init_segment: bytes, next_index: int) -> None:
        self._put_once("init.mp4", init_segment, "video/mp4")
        self._next = next_index

    def put(self, index: int, segment: bytes) -> None:
        if index != self._next:
            raise SinkError(f"s3 sink: segment {index} put out of order (expected {self._next})")
        self._put_once(segment_name(index), segment, "video/iso.segment")
        self._next = index + 1

    def playlist(self, durations: list[float], *, ended: bool) -> None:
        text = hls_playlist(
            [(segment_name(index), seconds) for index, seconds in enumerate(durations)],
            init_uri="init.mp4",
            ended=ended,
            target_duration=self._target_duration,
        )
        self._call(
            "put_object",
            Bucket=self._bucket,
            Key=self.key("stream.m3u8"),
            Body=text.encode(),
            ContentType="application/vnd.apple.mpegurl",
            CacheControl="no-cache",
        )

    def put_final(self, path: Path) -> None:
        try:
            self._client.upload_file(
                str(path),
                self._bucket,
                self.key("final.mp4"),
                ExtraArgs={"ContentType": "video/mp4"},
                Config=TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_THRESHOLD),
            )
        except (BotoCoreError, ClientError) as err:
            raise SinkError(
                f"s3 sink: uploading final.mp4 to s3://{self._bucket}/{self.key('final.mp4')}: {err}"
            ) from err

    def acknowledged(self) -> int:
        return self._next  # a put returns once S3 has stored the object

    def finish(self, *, ended: bool) -> None:
        """Every put has already been stored: nothing is pending."""

    def close(self) -> None:
        """No connection to drop (boto3 pools its own)."""

    def _put_once(self, name: str, body: bytes, content_type: str) -> None:
        try:
            self._client.put_object(
                Bucket=self._bucket, Key=self.key(name), Body=body, ContentType=content_type, IfNoneMatch="*"
            )
            self.written += 1
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412"):
                return  # already stored by an earlier attempt: same key, same bytes
            raise SinkError(f"s3 sink: writing s3://{self._bucket}/{self.key(name)}: {err}") from err
        except BotoCoreError as err:
            raise SinkError(f"s3 sink: writing s3://{self._bucket}/{self.key(name)}: {err}") from err

    def _call(self, method: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, method)(**kwargs)
        except (BotoCoreError, ClientError) as err:
            raise SinkError(f"s3 sink: {method} s3://{self._bucket}/{kwargs.get('Key')}: {err}") from err
