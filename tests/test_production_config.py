"""The same render on the production configuration: PostgreSQL through psycopg and S3 (a real
SeaweedFS server) through boto3, with the API streaming the video out of the bucket."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from monologue.live_client import stream_live
from monologue.plan import plan_timeline
from monologue.settings import (
    ApiSettings,
    NodeSettings,
    Settings,
    SinkSettings,
    StorageSettings,
    TemporalSettings,
)
from monologue.stack import Stack, free_port
from tests.conftest import SAMPLES
from tests.helpers import api_key, decode_video, get, post, postgres_database, register_api, submit, wait_done
from tests.kvs_server import KvsServer
from tests.s3_server import S3Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kvs(s3_server: S3Server) -> Iterator[KvsServer]:
    """The local PutMedia server, signing with the same credentials the nodes have."""
    server = KvsServer(
        stream_name="avatar", access_key=s3_server.access_key, secret_key=s3_server.secret_key, region=s3_server.region
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def production_stack(s3_server: S3Server, kvs: KvsServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s3_server.client().create_bucket(Bucket="monologue-prod")
    with postgres_database() as database_url:
        settings = Settings(
            home=tmp_path_factory.mktemp("prod"),
            database_url=database_url,
            log_format="json",
            storage=StorageSettings(
                backend="s3", bucket="monologue-prod", prefix="tenant-a", endpoint_url=s3_server.endpoint_url
            ),
            temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
            api=ApiSettings(port=free_port()),
            node=NodeSettings(id="prod-node"),
            # What sessions may publish to (nothing is allowed by default): a second bucket and a stream.
            sinks=SinkSettings(
                s3_buckets=["monologue-sink"], kvs_streams=["avatar*"], endpoints=[s3_server.endpoint_url, kvs.url]
            ),
        )
        credentials = {
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
            "AWS_DEFAULT_REGION": s3_server.region,
        }
        stack = Stack(settings, env=credentials)
        stack.start()
        register_api(stack)
        yield stack
        stack.stop()


def test_render_on_postgres_and_s3_gives_the_same_frames(
    production_stack: Stack, stack: Stack, s3_server: S3Server, sample_portrait: bytes, sample_speech: bytes
) -> None:
    prod_url = str(production_stack.settings.api.public_url)
    render = wait_done(prod_url, submit(prod_url, sample_portrait, sample_speech).json()["id"])
    assert render["status"] == "completed", render["error"]
    assert render["node_id"] == "prod-node"
    video = get(render["links"]["video"], timeout=60)
    assert video.status_code == 200 and int(video.headers["content-length"]) == len(video.content)
    frames, video_seconds, audio_seconds = decode_video(video.content)
    assert len(frames) == render["progress"]["frames_total"] and abs(video_seconds - audio_seconds) < 0.04

    bucket = s3_server.client()
    keys = {item["Key"] for item in bucket.list_objects_v2(Bucket="monologue-prod")["Contents"]}
    prefix = f"tenant-a/sessions/{render['id']}"
    assert {f"{prefix}/input/portrait.png", f"{prefix}/input/audio.wav", f"{prefix}/out/final.mp4"} <= keys
    s3_manifest = bucket.get_object(Bucket="monologue-prod", Key=f"{prefix}/out/frames.jsonl")["Body"].read()

    # The embedded default (SQLite + a folder) renders the very same frames from the same inputs.
    local_url = str(stack.settings.api.public_url)
    local = wait_done(local_url, submit(local_url, sample_portrait, sample_speech).json()["id"])
    root = stack.settings.storage.root
    assert local["status"] == "completed" and root is not None
    local_manifest = (root / "sessions" / local["id"] / "out" / "frames.jsonl").read_text()
    assert _hashes(s3_manifest.decode()) == _hashes(local_manifest)


def test_a_live_session_publishes_to_an_s3_sink_every_segment_once(
    production_stack: Stack, s3_server: S3Server, kvs: KvsServer
) -> None:
    """Live speech in; the session's segments land in a second bucket as they are published, each exactly
    once and in timeline order, and the API serves that bucket's stream as a presigned playlist."""
    url = str(production_stack.settings.api.public_url)
    bucket = s3_server.client()
    bucket.create_bucket(Bucket="monologue-sink")
    s3_sink = {"type": "s3", "bucket": "monologue-sink", "prefix": "live", "endpoint_url": s3_server.endpoint_url}
    # Kinesis Video Streams: the local PutMedia server answers fragment 2 with a retryable error and drops
    # the connection after fragment 4.
    kvs.error_at, kvs.drop_at = {2: 5000}, {4}
    kvs_sink = {"type": "kvs", "stream_name": "avatar", "endpoint_url": kvs.url, "region": s3_server.region}
    report = stream_live(
        url,
        SAMPLES / "portrait.jpg",
        SAMPLES / "speech.wav",
        options={"sinks": json.dumps([s3_sink, kvs_sink])},
        api_key=api_key(url),
    )
    session = report.session
    assert session["status"] == "completed", session["error"]
    # The sinks finish on their own schedule (each pump follows the stored playlist): wait for them.
    deadline = time.monotonic() + 60
    while {s["status"] for s in session["sinks"]} != {"done"} and time.monotonic() < deadline:
        time.sleep(0.2)
        session = get(f"{url}/v1/renders/{session['id']}", timeout=10).json()
    chunks = session["progress"]["chunks_total"]
    kvs_status, status = session["sinks"]
    assert (status["name"], status["status"], status["acknowledged"], status["error"]) == ("s3", "done", chunks, None)
    assert (kvs_status["name"], kvs_status["status"], kvs_status["acknowledged"]) == ("kvs", "done", chunks)
    # Every fragment persisted exactly once, in order, each opening with a video key frame.
    timeline = plan_timeline(session["progress"]["frames_total"], n_frames=40, i_frames=4, first_frames=16)
    persisted = [fragment.timecode - kvs.persisted[0].timecode for fragment in kvs.persisted]
    assert persisted == [spec.first_frame * 1000 // 25 for spec in timeline]
    assert all(fragment.starts_with_video_keyframe for fragment in kvs.persisted)
    assert len(kvs.connections) >= 3  # the injected error and the dropped connection forced reconnects

    listed = bucket.list_objects_v2(Bucket="monologue-sink", Prefix=f"live/{session['id']}/")["Contents"]
    names = sorted(item["Key"].rsplit("/", 1)[1] for item in listed)
    assert names == sorted(["init.mp4", "stream.m3u8", "final.mp4", *(f"seg-{i:06d}.m4s" for i in range(chunks))])
    playlist = get(status["playback"], timeout=10)
    assert playlist.status_code == 200 and playlist.text.rstrip().endswith("#EXT-X-ENDLIST")
    segment_urls = [line for line in playlist.text.splitlines() if line.startswith("http")]
    assert len(segment_urls) == chunks
    # In timeline order, byte for byte the segments the session stored (N0 I0 N1 I1 ...).
    stored = [
        bucket.get_object(Bucket="monologue-prod", Key=f"tenant-a/sessions/{session['id']}/out/{name}")["Body"].read()
        for name in _timeline_names(session["progress"]["frames_total"])
    ]
    assert [get(u, timeout=10).content for u in segment_urls] == stored
    final = bucket.get_object(Bucket="monologue-sink", Key=f"live/{session['id']}/final.mp4")["Body"].read()
    assert final == get(session["links"]["video"], timeout=30).content


def test_sinks_the_operator_has_not_allowed_are_refused(production_stack: Stack, s3_server: S3Server) -> None:
    """Sinks write with the nodes' credentials: only listed buckets, streams and endpoints are accepted."""
    url = str(production_stack.settings.api.public_url)
    refused = [
        (
            {"type": "s3", "bucket": "someone-elses", "endpoint_url": s3_server.endpoint_url},
            "MONOLOGUE_SINKS__S3_BUCKETS",
        ),
        ({"type": "s3", "bucket": "monologue-sink", "endpoint_url": "http://169.254.169.254"}, "ENDPOINTS"),
        ({"type": "kvs", "stream_name": "other"}, "MONOLOGUE_SINKS__KVS_STREAMS"),
    ]
    for sink, setting in refused:
        with (SAMPLES / "portrait.jpg").open("rb") as image:
            response = post(
                f"{url}/v1/sessions", files={"portrait": image}, data={"sinks": json.dumps([sink])}, timeout=30
            )
        assert response.status_code == 422 and setting in response.json()["detail"], response.text


def _timeline_names(frames: int) -> list[str]:
    return [f"seg-{s.kind}{s.index:05d}.m4s" for s in plan_timeline(frames, n_frames=40, i_frames=4, first_frames=16)]


def _hashes(manifest: str) -> list[str]:
    return [json.loads(line)["sha256"] for line in manifest.splitlines()]
