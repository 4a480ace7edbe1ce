"""The same render on the production configuration: PostgreSQL through psycopg and S3 (a real
SeaweedFS server) through boto3, with the API streaming the video out of the bucket."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from monologue.settings import ApiSettings, NodeSettings, Settings, StorageSettings, TemporalSettings
from monologue.stack import Stack, free_port
from tests.helpers import decode_video, postgres_database, submit, wait_done
from tests.s3_server import S3Server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def production_stack(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
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
        )
        credentials = {
            "AWS_ACCESS_KEY_ID": s3_server.access_key,
            "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
            "AWS_DEFAULT_REGION": s3_server.region,
        }
        stack = Stack(settings, env=credentials)
        stack.start()
        yield stack
        stack.stop()


def test_render_on_postgres_and_s3_gives_the_same_frames(
    production_stack: Stack, stack: Stack, s3_server: S3Server, sample_portrait: bytes, sample_speech: bytes
) -> None:
    prod_url = str(production_stack.settings.api.public_url)
    render = wait_done(prod_url, submit(prod_url, sample_portrait, sample_speech).json()["id"])
    assert render["status"] == "completed", render["error"]
    assert render["node_id"] == "prod-node"
    video = httpx.get(render["links"]["video"], timeout=60)
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


def _hashes(manifest: str) -> list[str]:
    return [json.loads(line)["sha256"] for line in manifest.splitlines()]
