"""The same render on the production configuration: PostgreSQL through psycopg and S3 (a real
SeaweedFS server) through boto3, with the API streaming the video out of the bucket; sinks that publish
with the nodes' credentials, and the per-tenant allow-lists that bound them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from cli.live_stream import stream_live
from cli.stack import Stack, free_port
from monologue import apikeys
from monologue.client import auth
from monologue.db import make_engine, make_sessionmaker
from monologue.media import decode_wav, normalise_audio
from monologue.plan import plan_timeline
from monologue.settings import (
    ApiSettings,
    InputSettings,
    NodeSettings,
    Settings,
    SinkSettings,
    StorageSettings,
    TemporalSettings,
)
from tests.conftest import SAMPLES
from tests.helpers import (
    api_key,
    decode_video,
    get,
    node_of,
    post,
    postgres_database,
    register_api,
    submit,
    wait_done,
    wav_bytes,
    workflow_count,
)
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
            # Inputs by s3:// URL: each tenant from its own prefix of an inputs bucket.
            inputs=InputSettings(s3_buckets=["monologue-inputs/{tenant}"], s3_endpoint_url=s3_server.endpoint_url),
            # What sessions may publish to (nothing is allowed by default): each tenant its own prefix of a
            # second bucket and its own streams, besides one shared stream.
            sinks=SinkSettings(
                s3_buckets=["monologue-sink/{tenant}"],
                kvs_streams=["avatar", "avatar-{tenant}-*"],
                s3_endpoints=[s3_server.endpoint_url],
                kvs_endpoints=[kvs.url],
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
    assert node_of(prod_url, render["id"]) == "prod-node"
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


def test_inputs_from_an_allowed_bucket_render_and_the_progressive_mp4_is_kept_in_s3(
    production_stack: Stack, s3_server: S3Server, sample_portrait: bytes, sample_speech: bytes
) -> None:
    """s3:// inputs from the tenant's prefix of the inputs bucket are read with the API's credentials and checked on
    a node; another tenant's prefix is refused. The progressive MP4, made at its first request, goes to S3."""
    bucket = s3_server.client()
    bucket.create_bucket(Bucket="monologue-inputs")
    speech = wav_bytes(decode_wav(normalise_audio(sample_speech).wav)[:16_000])
    bucket.put_object(Bucket="monologue-inputs", Key="local/in/face.jpg", Body=sample_portrait)
    bucket.put_object(Bucket="monologue-inputs", Key="local/in/speech.wav", Body=speech)
    bucket.put_object(Bucket="monologue-inputs", Key="acme/face.jpg", Body=sample_portrait)
    url = str(production_stack.settings.api.public_url)
    fields = {
        "portrait_url": "s3://monologue-inputs/local/in/face.jpg",
        "audio_url": "s3://monologue-inputs/local/in/speech.wav",
    }
    created = post(f"{url}/v1/renders", data=fields, timeout=120)
    assert created.status_code == 201, created.text
    others = post(
        f"{url}/v1/renders", data=fields | {"portrait_url": "s3://monologue-inputs/acme/face.jpg"}, timeout=60
    )
    assert others.status_code == 422 and "MONOLOGUE_INPUTS__S3_BUCKETS" in others.json()["detail"]
    render = wait_done(url, created.json()["id"])
    assert render["status"] == "completed" and render["progress"]["frames_total"] == 25, render["error"]
    progressive = get(f"{render['links']['video']}?layout=progressive", timeout=60)
    assert (
        progressive.status_code == 200 and progressive.content[4:8] == b"ftyp" and b"moov" in progressive.content[:64]
    )
    key = f"tenant-a/sessions/{render['id']}/out/progressive.mp4"
    assert bucket.head_object(Bucket="monologue-prod", Key=key)["ContentLength"] == len(progressive.content)


def test_a_live_session_publishes_to_an_s3_sink_every_segment_once(
    production_stack: Stack, s3_server: S3Server, kvs: KvsServer
) -> None:
    """Live speech in; the session's segments land in a second bucket as they are published, each exactly
    once and in timeline order, and the API serves that bucket's stream as a presigned playlist."""
    url = str(production_stack.settings.api.public_url)
    bucket = s3_server.client()
    bucket.create_bucket(Bucket="monologue-sink")
    s3_sink = {"type": "s3", "bucket": "monologue-sink", "prefix": "local/live", "endpoint_url": s3_server.endpoint_url}
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

    listed = bucket.list_objects_v2(Bucket="monologue-sink", Prefix=f"local/live/{session['id']}/")["Contents"]
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
    final = bucket.get_object(Bucket="monologue-sink", Key=f"local/live/{session['id']}/final.mp4")["Body"].read()
    assert final == get(session["links"]["video"], timeout=30).content


def test_sinks_the_operator_has_not_allowed_are_refused(
    production_stack: Stack, s3_server: S3Server, kvs: KvsServer
) -> None:
    """Sinks write with the nodes' credentials: only listed buckets, prefixes, streams and endpoints are
    accepted, and S3 and Kinesis Video endpoints are separate lists."""
    url = str(production_stack.settings.api.public_url)
    s3_endpoint = s3_server.endpoint_url
    refused = [
        ({"type": "s3", "bucket": "someone-elses", "endpoint_url": s3_endpoint}, "MONOLOGUE_SINKS__S3_BUCKETS"),
        (
            {"type": "s3", "bucket": "monologue-sink", "prefix": "tenant-b/live", "endpoint_url": s3_endpoint},
            "MONOLOGUE_SINKS__S3_BUCKETS",
        ),
        (
            {"type": "s3", "bucket": "monologue-sink", "prefix": "local", "endpoint_url": "http://169.254.169.254"},
            "MONOLOGUE_SINKS__S3_ENDPOINTS",
        ),
        (
            {"type": "s3", "bucket": "monologue-sink", "prefix": "local", "endpoint_url": kvs.url},
            "MONOLOGUE_SINKS__S3_ENDPOINTS",
        ),
        ({"type": "kvs", "stream_name": "avatar", "endpoint_url": s3_endpoint}, "MONOLOGUE_SINKS__KVS_ENDPOINTS"),
        ({"type": "kvs", "stream_name": "other"}, "MONOLOGUE_SINKS__KVS_STREAMS"),
    ]
    for sink, setting in refused:
        with (SAMPLES / "portrait.jpg").open("rb") as image:
            response = post(
                f"{url}/v1/sessions", files={"portrait": image}, data={"sinks": json.dumps([sink])}, timeout=30
            )
        assert response.status_code == 422 and setting in response.json()["detail"], response.text


def test_a_tenant_may_not_publish_to_another_tenants_stream(production_stack: Stack) -> None:
    """With `avatar-{tenant}-*` allowed, each tenant gets its own streams; another tenant's is a 422 that names
    the setting. (A bad portrait after the sinks shows which sinks passed, without starting a session.)"""
    url = str(production_stack.settings.api.public_url)
    engine = make_engine(production_stack.settings.db_url)
    with make_sessionmaker(engine)() as db:
        keys = {tenant: apikeys.create_key(db, tenant=tenant)[1] for tenant in ("tenant-a", "tenant-b")}
    engine.dispose()

    def start(tenant: str, stream_name: str) -> tuple[int, str]:
        sinks = json.dumps([{"type": "kvs", "stream_name": stream_name}])
        response = httpx.post(
            f"{url}/v1/sessions",
            files={"portrait": ("p.jpg", b"not an image")},
            data={"sinks": sinks},
            headers=auth(keys[tenant]),
            timeout=30,
        )
        return response.status_code, response.json()["detail"]

    for tenant, other in (("tenant-a", "tenant-b"), ("tenant-b", "tenant-a")):
        status, detail = start(tenant, f"avatar-{other}-1")
        assert status == 422 and "MONOLOGUE_SINKS__KVS_STREAMS" in detail and f"avatar-{other}-1" in detail, detail
        status, detail = start(tenant, f"avatar-{tenant}-1")
        assert status == 422 and "sinks" not in detail and "portrait" in detail, detail  # the sink passed


def test_a_session_whose_sink_was_removed_from_the_allow_list_neither_pumps_nor_resumes(
    production_stack: Stack, s3_server: S3Server, sample_portrait: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API that allowed a bucket starts a session with it; the node and, later, the API no longer allow
    it. The node's pump refuses before writing (the sink is `failed`, naming the setting) and the session
    goes on; once cancelled, resuming it is refused with 409 and starts nothing."""
    settings = production_stack.settings
    for name, value in [("AWS_ACCESS_KEY_ID", s3_server.access_key), ("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)]:
        monkeypatch.setenv(name, value)  # the API in this process stores the portrait in the S3 storage
    endpoint = s3_server.endpoint_url
    bucket = s3_server.client()
    bucket.create_bucket(Bucket="retired-sink")
    sink = {"type": "s3", "name": "retired", "bucket": "retired-sink", "endpoint_url": endpoint}
    then = settings.model_copy(update={"sinks": SinkSettings(s3_buckets=["retired-sink"], s3_endpoints=[endpoint])})
    headers = auth(production_stack.api_key)
    base_url = str(settings.api.public_url)  # the Host the API answers
    with TestClient(create_app(then), base_url=base_url) as client:
        created = client.post(
            "/v1/sessions",
            files={"portrait": ("p.jpg", sample_portrait)},
            data={"sinks": json.dumps([sink])},
            headers=headers,
        )
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        session = _wait_for(client, session_id, headers, lambda s: [x["status"] for x in s["sinks"]] == ["failed"])
        assert "MONOLOGUE_SINKS__S3_BUCKETS" in session["sinks"][0]["error"]
        assert session["status"] not in ("failed", "cancelled")  # a refused sink does not end the session
        assert client.post(f"/v1/renders/{session_id}/cancel", headers=headers).status_code == 202
        _wait_for(client, session_id, headers, lambda s: s["status"] == "cancelled")
    assert bucket.list_objects_v2(Bucket="retired-sink").get("KeyCount") == 0

    runs = workflow_count(settings)
    with TestClient(create_app(settings), base_url=base_url) as client:
        resumed = client.post(f"/v1/renders/{session_id}/resume", headers=headers)
        assert resumed.status_code == 409, resumed.text
        assert "MONOLOGUE_SINKS__S3_BUCKETS" in resumed.json()["detail"] and "retired" in resumed.json()["detail"]
        assert client.get(f"/v1/renders/{session_id}", headers=headers).json()["status"] == "cancelled"
    assert workflow_count(settings) == runs


def _wait_for(
    client: TestClient, session_id: str, headers: dict[str, str], done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        session: dict[str, Any] = client.get(f"/v1/renders/{session_id}", headers=headers).json()
        if done(session):
            return session
        assert time.monotonic() < deadline, f"session {session_id} never got there: {session}"
        time.sleep(0.2)


def _timeline_names(frames: int) -> list[str]:
    return [f"seg-{s.kind}{s.index:05d}.m4s" for s in plan_timeline(frames, n_frames=40, i_frames=4, first_frames=16)]


def _hashes(manifest: str) -> list[str]:
    return [json.loads(line)["sha256"] for line in manifest.splitlines()]
