"""Sinks running while the session's workflow continues as new every 2 chunks: each run cancels its pumps
(which hand over: close their connection, record how far their sink got) and the next run starts them again from
the `sinks` table. Across those handovers every S3 key is written once, in timeline order, and every Kinesis
Video fragment is received once, in order, its timecodes one continuous timeline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import CancelledError
from temporalio.testing import ActivityEnvironment

from activities.sinks import SinkActivities
from cli.live_stream import stream_live
from cli.stack import Stack, free_port
from gpu_worker.publish.playlist import playlist as hls_playlist
from gpu_worker.publish.s3_sink import segment_name
from gpu_worker.publish.sinks import Sink
from monologue import contracts as c, keys, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.plan import plan_timeline
from monologue.repo import sinks as repo_sinks
from monologue.settings import (
    ApiSettings,
    NodeSettings,
    RenderDefaults,
    Settings,
    SinkSettings,
    StorageSettings,
    TemporalSettings,
)
from monologue.storage import LocalStore
from tests.conftest import SAMPLES
from tests.helpers import api_key, get, postgres_database, register_api, submit, wait_done
from tests.kvs_server import KvsServer
from tests.s3_server import CountingS3Proxy, S3Server

STORE_BUCKET, SINK_BUCKET = "monologue-renewing", "monologue-renewing-sink"


@pytest.fixture(scope="module")
def kvs(s3_server: S3Server) -> Iterator[KvsServer]:
    server = KvsServer(
        stream_name="avatar", access_key=s3_server.access_key, secret_key=s3_server.secret_key, region=s3_server.region
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def s3_proxy(s3_server: S3Server) -> Iterator[CountingS3Proxy]:
    """The sink writes through this proxy, which counts its PUTs and their answers."""
    with CountingS3Proxy(s3_server.endpoint_url) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def renewing_stack(
    s3_server: S3Server, kvs: KvsServer, s3_proxy: CountingS3Proxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The production configuration (PostgreSQL, S3 storage, sinks allowed), continuing as new every 2 chunks."""
    for bucket in (STORE_BUCKET, SINK_BUCKET):
        s3_server.client().create_bucket(Bucket=bucket)
    with postgres_database() as database_url:
        settings = Settings(
            home=tmp_path_factory.mktemp("renewing"),
            database_url=database_url,
            log_format="json",
            storage=StorageSettings(
                backend="s3", bucket=STORE_BUCKET, prefix="tenant-a", endpoint_url=s3_server.endpoint_url
            ),
            temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
            api=ApiSettings(port=free_port()),
            node=NodeSettings(id="renewing-node"),
            render=RenderDefaults(continue_as_new_every=2),
            sinks=SinkSettings(
                s3_buckets=[f"{SINK_BUCKET}/{{tenant}}"],
                kvs_streams=["avatar"],
                s3_endpoints=[s3_proxy.url],
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


@pytest.mark.slow
def test_a_render_s_sinks_get_every_segment_once_in_order_across_continue_as_new(
    renewing_stack: Stack,
    s3_server: S3Server,
    s3_proxy: CountingS3Proxy,
    kvs: KvsServer,
    sample_portrait: bytes,
    sample_speech: bytes,
) -> None:
    url = str(renewing_stack.settings.api.public_url)
    seen = _Seen(len(kvs.persisted), len(kvs.connections), len(kvs.refusals))
    sinks = json.dumps(_sinks("renders", s3_server, s3_proxy, kvs))
    created = submit(url, sample_portrait, sample_speech, sinks=sinks)
    assert created.status_code == 201, created.text
    session = wait_done(url, created.json()["id"], timeout_s=90)
    assert session["status"] == "completed", session["error"]
    _check_delivered_once(renewing_stack, s3_server, s3_proxy, kvs, session, seen, prefix="renders", first_frames=None)


@pytest.mark.slow
def test_a_live_session_s_sinks_get_every_segment_once_in_order_across_continue_as_new(
    renewing_stack: Stack, s3_server: S3Server, s3_proxy: CountingS3Proxy, kvs: KvsServer
) -> None:
    """The same with speech streamed in: the plan grows while the runs renew (a short first chunk)."""
    url = str(renewing_stack.settings.api.public_url)
    seen = _Seen(len(kvs.persisted), len(kvs.connections), len(kvs.refusals))
    sinks = json.dumps(_sinks("live", s3_server, s3_proxy, kvs))
    report = stream_live(
        url, SAMPLES / "portrait.jpg", SAMPLES / "speech.wav", options={"sinks": sinks}, api_key=api_key(url)
    )
    assert report.session["status"] == "completed", report.session["error"]
    _check_delivered_once(
        renewing_stack, s3_server, s3_proxy, kvs, report.session, seen, prefix="live", first_frames=16
    )


class _SwallowingSink(Sink):
    """A sink whose playlist call, like many a library call, catches `Exception` while it works (a cancel raised
    into the thread there is lost) and tells the test when it is in there."""

    name = "swallowing"

    def __init__(self, inside: threading.Event) -> None:
        self.inside, self.finished, self._next = inside, False, 0

    def start(self, init_segment: bytes, next_index: int) -> None:
        self._next = next_index

    def put(self, index: int, segment: bytes) -> None:
        self._next = index + 1

    def playlist(self, durations: list[float], *, ended: bool) -> None:
        self.inside.set()
        for _ in range(10):
            with contextlib.suppress(Exception):  # the point: code that swallows what is raised into it
                time.sleep(0.05)

    def acknowledged(self) -> int:
        return self._next

    def finish(self, *, ended: bool) -> None:
        self.finished = True

    def close(self) -> None:
        pass


def test_a_cancelled_pump_hands_over_even_if_its_sink_swallows_the_cancel(tmp_path: Path) -> None:
    """The workflow waits for its pumps to hand over before continuing as new: a cancel lost inside a library's
    `except Exception` must not leave the pump running (and the session hung)."""
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    sessions = make_sessionmaker(make_engine(url))
    with sessions() as db:
        repo.create_session(
            db, session_id="s1", tenant="local", options={}, workflow_id="w", audio_seconds=1.0, width=64, height=64
        )
    store = LocalStore(tmp_path / "objects")
    store.put(keys.init_segment("s1"), b"init")
    store.put(keys.output("s1", "seg-N00000.m4s"), b"segment")
    store.put(
        keys.playlist("s1"),
        hls_playlist([("seg-N00000.m4s", 1.6)], init_uri="init.mp4", ended=False, target_duration=1.6).encode(),
    )
    inside = threading.Event()
    sink = _SwallowingSink(inside)
    activities = SinkActivities(
        store=store,
        sessions=sessions,
        allowed=SinkSettings(s3_buckets=["videos/{tenant}"]),
        factory=lambda *_: sink,
        poll_s=0.05,
    )
    environment = ActivityEnvironment()
    outcome: list[BaseException | c.RunSinkResult] = []

    def pump() -> None:
        request = c.RunSinkInput(
            session_id="s1",
            options=c.RenderOptions(),
            sink=c.S3Sink(name="swallowing", bucket="videos", prefix="local"),
        )
        try:
            outcome.append(environment.run(activities.run_sink, request))
        except BaseException as error:  # handed to the test thread
            outcome.append(error)

    worker = threading.Thread(target=pump, daemon=True)
    worker.start()
    assert inside.wait(10)
    environment.cancel()  # raised into the pump's thread while it is inside the sink's playlist call
    worker.join(10)
    assert not worker.is_alive(), "the cancelled pump is still running"
    assert len(outcome) == 1 and isinstance(outcome[0], CancelledError), outcome
    assert sink.finished  # it handed over: finish(ended=False), then recorded how far it got
    with sessions() as db:
        row = repo_sinks.get_sink(db, session_id="s1", name="swallowing")
    assert row is not None and (row.status, row.acknowledged) == ("streaming", 1)


@dataclass
class _Seen:
    """How much the module's KVS server had recorded before a session: its records are the ones after."""

    fragments: int
    connections: int
    refusals: int


def _sinks(prefix: str, s3_server: S3Server, s3_proxy: CountingS3Proxy, kvs: KvsServer) -> list[dict[str, str]]:
    return [
        {"type": "s3", "bucket": SINK_BUCKET, "prefix": f"local/{prefix}", "endpoint_url": s3_proxy.url},
        {"type": "kvs", "stream_name": "avatar", "endpoint_url": kvs.url, "region": s3_server.region},
    ]


def _check_delivered_once(
    stack: Stack,
    s3_server: S3Server,
    s3_proxy: CountingS3Proxy,
    kvs: KvsServer,
    session: dict[str, Any],
    seen: _Seen,
    *,
    prefix: str,
    first_frames: int | None,
) -> None:
    session = _wait_for_sinks(str(stack.settings.api.public_url), session)
    chunks, frames = session["progress"]["chunks_total"], session["progress"]["frames_total"]
    assert sorted((s["name"], s["status"], s["acknowledged"]) for s in session["sinks"]) == [
        ("kvs", "done", chunks),
        ("s3", "done", chunks),
    ]
    runs = _workflow_runs(stack.settings, c.render_workflow_id(session["id"]))
    assert len(runs) > 1, runs  # the pumps were handed over between runs
    timeline = plan_timeline(frames, n_frames=40, i_frames=4, first_frames=first_frames)
    _check_s3(s3_server, s3_proxy, session["id"], f"local/{prefix}/{session['id']}/", timeline)
    _check_kvs(kvs, seen, timeline)


def _check_s3(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, session_id: str, prefix: str, timeline: list[Any]
) -> None:
    """Every key created by exactly one PUT; segments each sent once, in timeline order, never refused as already
    there (a resumed pump starts after what its sink acknowledged, not before), byte for byte what is stored."""
    base = f"/{SINK_BUCKET}/{prefix}"
    puts = [r for r in s3_proxy.requests if r.method == "PUT" and r.path.startswith(base)]
    created_keys = [r.path.removeprefix(base) for r in puts if r.status == 200 and r.if_none_match == "*"]
    segments = [segment_name(index) for index in range(len(timeline))]
    assert created_keys == ["init.mp4", *segments], created_keys
    segment_puts = [(r.path.removeprefix(base), r.status) for r in puts if "/seg-" in r.path]
    assert segment_puts == [(name, 200) for name in segments]
    bucket = s3_server.client()
    stored = [
        bucket.get_object(
            Bucket=STORE_BUCKET, Key=f"tenant-a/sessions/{session_id}/out/seg-{spec.kind}{spec.index:05d}.m4s"
        )["Body"].read()
        for spec in timeline
    ]
    assert [bucket.get_object(Bucket=SINK_BUCKET, Key=prefix + name)["Body"].read() for name in segments] == stored
    playlist = bucket.get_object(Bucket=SINK_BUCKET, Key=prefix + "stream.m3u8")["Body"].read().decode()
    assert [line for line in playlist.splitlines() if line.startswith("seg-")] == segments
    assert playlist.rstrip().endswith("#EXT-X-ENDLIST")


def _check_kvs(kvs: KvsServer, seen: _Seen, timeline: list[Any]) -> None:
    """Every fragment persisted once, in order, over several connections (one per run at least), none refused
    for overlapping the previous pump's; timecodes one timeline from the same origin in every run."""
    persisted, connections = kvs.persisted[seen.fragments :], kvs.connections[seen.connections :]
    origin = persisted[0].timecode
    assert [f.timecode - origin for f in persisted] == [spec.first_frame * 1000 // 25 for spec in timeline]
    assert all(f.producer_timestamp_ms == f.timecode for f in persisted)  # ABSOLUTE timecodes
    assert all(fragment.starts_with_video_keyframe for fragment in persisted)
    assert len({fragment.connection for fragment in persisted}) > 1
    assert kvs.refusals[seen.refusals :] == []
    starts = {round(float(conn.headers["x-amzn-producer-start-timestamp"]) * 1000) for conn in connections}
    assert starts == {origin}, starts


def _wait_for_sinks(url: str, session: dict[str, Any]) -> dict[str, Any]:
    """The pumps follow the stored playlist and finish on their own schedule."""
    deadline = time.monotonic() + 60
    while {s["status"] for s in session["sinks"]} != {"done"} and time.monotonic() < deadline:
        time.sleep(0.2)
        session = get(f"{url}/v1/renders/{session['id']}", timeout=10).json()
    return session


def _workflow_runs(settings: Settings, workflow_id: str) -> list[str]:
    """Every run of one workflow id (each continue-as-new starts a new run), as 'run id: status'."""
    from temporalio.client import Client

    async def runs() -> list[str]:
        client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace)
        found = client.list_workflows(f"WorkflowId = '{workflow_id}'")
        return [f"{execution.run_id}: {execution.status}" async for execution in found]

    return asyncio.run(runs())
