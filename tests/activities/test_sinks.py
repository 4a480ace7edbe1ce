"""Sink pumps and the S3 sink: every segment exactly once, in timeline order, from what is stored; a failing
sink resumes where it stopped; S3 writes are conditional (If-None-Match) so retries never overwrite; a pump
writes nothing to a sink the node's allow-lists do not allow the session's tenant."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sinks import SinkActivities, read_stream
from gpu_worker.publish import StreamFormat, init_segment, playlist
from gpu_worker.publish.kvs import KinesisVideoSink
from gpu_worker.publish.s3_sink import S3Sink, segment_name
from gpu_worker.publish.sinks import Sink, SinkError
from monologue import contracts as c, keys, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.repo import sinks as repo_sinks
from monologue.s3_presign import presigned_playlist
from monologue.settings import SinkSettings
from monologue.storage import LocalStore
from tests.gpu_worker.test_kvs import FixedDataEndpoint
from tests.kvs_server import KvsServer
from tests.s3_server import S3Server

SID = "sess1"  # a session of tenant `local`
RECORDING = c.S3Sink(name="rec", bucket="videos", prefix="local/live")
ALLOWED = SinkSettings(s3_buckets=["videos/{tenant}"])


class RecordingSink(Sink):
    """Keeps what it is given; `fail_at` makes one put fail (once), like a sink whose service dropped out."""

    name = "rec"

    def __init__(self, log: list[tuple[str, Any]], fail_at: set[int]) -> None:
        self.log, self.fail_at, self._next = log, fail_at, 0

    def start(self, init_segment: bytes, next_index: int) -> None:
        self.log.append(("start", next_index))
        self._next = next_index

    def put(self, index: int, segment: bytes) -> None:
        if index in self.fail_at:
            self.fail_at.discard(index)
            raise SinkError(f"injected failure at segment {index}")
        assert index == self._next
        self.log.append(("put", index, segment))
        self._next += 1

    def acknowledged(self) -> int:
        return self._next

    def finish(self, *, ended: bool) -> None:
        self.log.append(("finish", ended))

    def close(self) -> None:
        pass


@pytest.fixture
def pump_env(tmp_path: Path) -> tuple[LocalStore, Any]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions() as db:
        repo.create_session(
            db, session_id=SID, tenant="local", options={}, workflow_id="w", audio_seconds=1.0, width=64, height=64
        )
    return LocalStore(tmp_path / "objects"), sessions


def _publish(store: LocalStore, count: int, *, ended: bool) -> None:
    """Stored segments 0..count-1 and the playlist listing them, as the publish activity writes it."""
    names = [keys.segment_name("N", i) for i in range(count)]
    for i, name in enumerate(names):
        store.put(keys.output(SID, name), f"segment {i}".encode())
    text = playlist([(name, 1.6) for name in names], init_uri="init.mp4", ended=ended, target_duration=1.6)
    store.put(keys.playlist(SID), text.encode())


def _run(activities: SinkActivities, sink: c.Sink = RECORDING) -> c.RunSinkResult:
    request = c.RunSinkInput(session_id=SID, options=c.RenderOptions(), sink=sink)
    result: c.RunSinkResult = ActivityEnvironment().run(activities.run_sink, request)
    return result


def test_the_pump_feeds_segments_in_order_as_they_are_published(pump_env: tuple[LocalStore, Any]) -> None:
    store, sessions = pump_env
    log: list[tuple[str, Any]] = []
    activities = SinkActivities(
        store=store, sessions=sessions, allowed=ALLOWED, factory=lambda *_: RecordingSink(log, set()), poll_s=0.02
    )
    store.put(keys.init_segment(SID), b"init")
    _publish(store, 2, ended=False)

    def grow() -> None:  # the session goes on publishing while the pump runs
        for count in (3, 5):
            time.sleep(0.1)
            _publish(store, count, ended=False)
        time.sleep(0.1)
        _publish(store, 6, ended=True)

    writer = threading.Thread(target=grow)
    writer.start()
    result = _run(activities)
    writer.join()
    assert result.acknowledged == 6
    assert [entry[1] for entry in log if entry[0] == "put"] == list(range(6))
    assert log[0] == ("start", 0) and log[-1] == ("finish", True)
    with sessions() as db:
        row = repo_sinks.get_sink(db, session_id=SID, name="rec")
    assert row is not None and (row.status, row.acknowledged, row.error) == ("done", 6, None)


def test_a_failed_sink_resumes_after_what_it_acknowledged_without_repeats(pump_env: tuple[LocalStore, Any]) -> None:
    store, sessions = pump_env
    log: list[tuple[str, Any]] = []
    failures = {3}
    activities = SinkActivities(
        store=store, sessions=sessions, allowed=ALLOWED, factory=lambda *_: RecordingSink(log, failures), poll_s=0.02
    )
    store.put(keys.init_segment(SID), b"init")
    _publish(store, 5, ended=True)
    with pytest.raises(ApplicationError, match="injected failure at segment 3"):
        _run(activities)
    with sessions() as db:
        row = repo_sinks.get_sink(db, session_id=SID, name="rec")
    assert row is not None and row.status == "retrying" and row.acknowledged == 3 and "segment 3" in (row.error or "")
    assert _run(activities).acknowledged == 5  # the retry (Temporal's, here by hand) starts at segment 3
    puts = [entry[1] for entry in log if entry[0] == "put"]
    assert puts == [0, 1, 2, 3, 4]  # every segment exactly once
    assert ("start", 3) in log


def test_the_pump_refuses_a_sink_the_nodes_settings_no_longer_allow_and_writes_nothing(
    pump_env: tuple[LocalStore, Any], s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session was allowed this sink when it started; today's node settings are checked again by the pump,
    with the session's tenant, before the first write: a refusal is final and names the setting."""
    store, sessions = pump_env
    for name, value in [("AWS_ACCESS_KEY_ID", s3_server.access_key), ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)]:
        monkeypatch.setenv(name, value)  # the node's credentials: boto3's default chain
    bucket = s3_server.client()
    bucket.create_bucket(Bucket="pump-sink")
    endpoint = s3_server.endpoint_url
    spec = c.S3Sink(name="archive", bucket="pump-sink", prefix="local/live", endpoint_url=endpoint)
    store.put(keys.init_segment(SID), b"init")
    _publish(store, 2, ended=True)
    refusals = [
        (SinkSettings(s3_endpoints=[endpoint]), "MONOLOGUE_SINKS__S3_BUCKETS"),  # the bucket was removed
        (SinkSettings(s3_buckets=["pump-sink/tenant-b"], s3_endpoints=[endpoint]), "MONOLOGUE_SINKS__S3_BUCKETS"),
        (SinkSettings(s3_buckets=["pump-sink/{tenant}"]), "MONOLOGUE_SINKS__S3_ENDPOINTS"),  # the endpoint was
    ]
    for allowed, setting in refusals:
        with pytest.raises(ApplicationError, match=setting) as refused:
            _run(SinkActivities(store=store, sessions=sessions, allowed=allowed, poll_s=0.02), spec)
        assert refused.value.non_retryable and refused.value.type == "SinkRefused"
        with sessions() as db:
            row = repo_sinks.get_sink(db, session_id=SID, name="archive")
        assert row is not None and row.status == "failed" and setting in (row.error or "")
        assert bucket.list_objects_v2(Bucket="pump-sink").get("KeyCount") == 0

    # The same pump on settings that allow the tenant's prefix writes the stream.
    allowed = SinkSettings(s3_buckets=["pump-sink/{tenant}"], s3_endpoints=[endpoint])
    assert _run(SinkActivities(store=store, sessions=sessions, allowed=allowed, poll_s=0.02), spec).acknowledged == 2
    listed = bucket.list_objects_v2(Bucket="pump-sink")["Contents"]
    assert sorted(item["Key"] for item in listed) == [
        f"local/live/{SID}/{name}" for name in ("init.mp4", segment_name(0), segment_name(1), "stream.m3u8")
    ]


def test_a_kvs_data_endpoint_the_node_does_not_allow_fails_the_pump_for_good(pump_env: tuple[LocalStore, Any]) -> None:
    """The allowed control plane hands out a data endpoint that is not in MONOLOGUE_SINKS__KVS_ENDPOINTS: the
    pump fails without a retry, the sink is marked failed, and nothing reaches that endpoint."""
    store, sessions = pump_env
    store.put(keys.init_segment(SID), init_segment(StreamFormat(width=64, height=48, fps=25)))
    _publish(store, 1, ended=True)
    plane = "https://kvs-control.internal"
    spec = c.KvsSink(name="live", stream_name="avatar-local-1", endpoint_url=plane)
    with KvsServer(stream_name="avatar-local-1") as elsewhere:

        def factory(
            spec: c.Sink, session_id: str, options: c.RenderOptions, origin_ms: int, allowed: SinkSettings
        ) -> KinesisVideoSink:  # build_sink's, but with a control plane that answers with `elsewhere`
            return KinesisVideoSink(
                spec.stream_name,
                region=elsewhere.region,
                allowed=allowed,
                endpoint_url=spec.endpoint_url,
                client=FixedDataEndpoint(elsewhere.url),
                credentials=elsewhere.credentials(),
                producer_start_ms=origin_ms,
            )

        allowed = SinkSettings(kvs_streams=["avatar-{tenant}-*"], kvs_endpoints=[plane])
        activities = SinkActivities(store=store, sessions=sessions, allowed=allowed, factory=factory, poll_s=0.02)
        with pytest.raises(ApplicationError, match="MONOLOGUE_SINKS__KVS_ENDPOINTS") as refused:
            _run(activities, spec)
        assert refused.value.non_retryable
        assert elsewhere.connections == []
    with sessions() as db:
        row = repo_sinks.get_sink(db, session_id=SID, name="live")
    assert row is not None and row.status == "failed" and elsewhere.url in (row.error or "")


def test_read_stream_follows_the_stored_playlist(pump_env: tuple[LocalStore, Any]) -> None:
    store, _ = pump_env
    assert read_stream(store, SID).names == []
    _publish(store, 2, ended=True)
    stream = read_stream(store, SID)
    assert stream.names == ["seg-N00000.m4s", "seg-N00001.m4s"] and stream.durations == [1.6, 1.6] and stream.ended


def test_s3_sink_writes_each_key_once_and_serves_a_presigned_playlist(s3_server: S3Server, tmp_path: Path) -> None:
    client = s3_server.client()
    client.create_bucket(Bucket="sink-unit")
    sink = S3Sink(session_id=SID, bucket="sink-unit", prefix="live/", target_duration=1.6, client=client)
    sink.start(b"init", 0)
    for index in range(3):
        sink.put(index, f"segment {index}".encode())
    sink.playlist([1.6, 1.6, 1.6], ended=False)
    assert sink.written == 4 and sink.acknowledged() == 3
    with pytest.raises(SinkError, match="out of order"):
        sink.put(5, b"x")

    # A resumed sink (after a crash) re-sends segment 2: the key exists, so If-None-Match refuses the write
    # (412) and the sink moves on; the stored object is never overwritten.
    again = S3Sink(session_id=SID, bucket="sink-unit", prefix="live/", target_duration=1.6, client=client)
    again.start(b"init", 2)
    again.put(2, b"different bytes")
    again.put(3, b"segment 3")
    assert again.written == 1
    stored = client.get_object(Bucket="sink-unit", Key=f"live/{SID}/{segment_name(2)}")["Body"].read()
    assert stored == b"segment 2"

    big = tmp_path / "final.mp4"
    big.write_bytes(bytes(range(256)) * (9 * 4096))  # 9 MiB: above the multipart threshold
    again.put_final(big)
    head = client.head_object(Bucket="sink-unit", Key=f"live/{SID}/final.mp4")
    assert head["ContentLength"] == big.stat().st_size and head["ETag"].strip('"').endswith("-2")  # two parts

    text = client.get_object(Bucket="sink-unit", Key=f"live/{SID}/stream.m3u8")["Body"].read().decode()
    signed = presigned_playlist(client, bucket="sink-unit", base_key=f"live/{SID}/", playlist_text=text, expires_s=60)
    uris = [line for line in signed.splitlines() if line.startswith("http")]
    assert len(uris) == 3 and all("X-Amz-Signature" in uri for uri in uris)
    assert [httpx.get(uri).content for uri in uris] == [f"segment {i}".encode() for i in range(3)]
    init_uri = next(line for line in signed.splitlines() if line.startswith("#EXT-X-MAP")).split('"')[1]
    assert httpx.get(init_uri).content == b"init"
    assert httpx.get(f"{s3_server.endpoint_url}/sink-unit/live/{SID}/{segment_name(0)}").status_code == 403
