"""Nothing lost when object storage fails (issue 28, item 3). SeaweedFS stopped for 30 s mid-session and the nodes'
storage throttled are faults of the loopback rig (cli/faults.py, tests/test_infra_faults.py). Here: the whole stack
(Temporal's dev server, PostgreSQL, SeaweedFS, one API process and one node) with the fault proxy (cli/s3_faults.py)
in front of every storage request, the API's and the S3 sink's too, answering 30% of them with 503 SlowDown, 500
InternalError or a reset connection (some after S3 carried the request out): every session completes with a clean
render's frames, every playlist lists each stored segment exactly once, stored objects are whole (checkpoints match
their SHA-256), the sink holds each segment once, and the API answered only normally or 503 with Retry-After. And the
pieces: the store's retries, a store down longer than its retry time, live audio taken while storage is down.

The outage rides on the storage retries (MONOLOGUE_STORAGE__RETRY_FOR_S, 45 s per call on nodes, monologue/s3_retry.py);
the API holds live audio in memory meanwhile (api/live_socket.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import select

from cli.benches.cluster import database, hashes, speech, submit, wait_all
from cli.benches.cluster_live import OPTIONS, LiveRun, start_live_session, stream_live_session
from cli.cluster import Cluster, Shape, cluster
from cli.s3_faults import FaultKind, S3FaultProxy
from cli.seaweed import seaweed_process
from gpu_worker.publish.s3_sink import S3Sink, segment_name
from gpu_worker.publish.sinks import SinkError
from monologue import SAMPLES, keys
from monologue.client import Client, auth
from monologue.contracts import SessionStatus
from monologue.db import CheckpointRow, ChunkRow, SessionRow, SinkRow
from monologue.errors import StorageUnavailable
from monologue.live_audio import LIVE_PIECE_SAMPLES, LiveAudio, LiveAudioWriter
from monologue.schemas import SinkState
from monologue.settings import SinkSettings
from monologue.storage import LocalStore, S3Store, on_retry
from tests.helpers import postgres_database
from tests.s3_server import S3Server

SHAPE = Shape(apis=1, nodes=1, capacity=3, chunk_delay_s=0.3, live_idle_timeout_s=90.0)
SPEECH_S = 4.0  # every session speaks the same 4 s, so one clean render is every session's reference
THROTTLED = 0.3  # the fraction of S3 requests the proxy faults while throttling
SESSION_TIMEOUT_S = 240.0
PROBE_TIMEOUT_S = 20.0  # an API answer slower than this counts as a hang
SINK_BUCKET = "faults-sink"
NORMAL = {200, 404}  # 404: a playlist asked for before its first segment is published


@dataclass
class Prober:
    """What a client asks the API while the fault lasts (each session's state, each render's playlist), and every
    answer: the status (or the error, a timeout among them) and its Retry-After."""

    api_url: str
    api_key: str
    paths: list[str]
    answers: list[tuple[str, int | str, str | None]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.api_url, headers=auth(self.api_key), timeout=PROBE_TIMEOUT_S) as client:
            while not self._stop.is_set():
                for path in self.paths:
                    try:
                        response = client.get(path)
                        self.answers.append((path, response.status_code, response.headers.get("retry-after")))
                    except httpx.HTTPError as err:
                        self.answers.append((path, type(err).__name__, None))
                self._stop.wait(0.5)

    @contextmanager
    def probing(self) -> Iterator[Prober]:
        thread = threading.Thread(target=self.run, name="api-prober", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join(PROBE_TIMEOUT_S * len(self.paths))

    def problems(self) -> list[tuple[str, int | str, str | None]]:
        return [a for a in self.answers if a[1] not in NORMAL and not (a[1] == 503 and a[2])]


@dataclass
class Sessions:
    """The sessions under the fault: the renders, the live session and the thread streaming its speech."""

    renders: list[str]
    live: LiveRun
    streaming: threading.Thread

    @property
    def ids(self) -> list[str]:
        return [*self.renders, *([self.live.session_id] if self.live.session_id else [])]


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_s3_throttling_and_resets_mid_session_lose_nothing(tmp_path: Path) -> None:
    with (
        seaweed_process(tmp_path / "s3") as weed,
        S3FaultProxy(weed.server.endpoint_url, seed=28) as proxy,
        postgres_database() as database_url,
        cluster(
            tmp_path / "cluster",
            database_url,
            dataclasses.replace(weed.server, endpoint_url=proxy.url),
            SHAPE,
            sinks=SinkSettings(s3_buckets=[f"{SINK_BUCKET}/{{tenant}}"], s3_endpoints=[proxy.url]),
        ) as running,
    ):
        weed.server.client().create_bucket(Bucket=SINK_BUCKET)
        reference = _clean_render(running, tmp_path)
        sink = {"type": "s3", "bucket": SINK_BUCKET, "prefix": "local/faults", "endpoint_url": proxy.url}
        sessions = _start_sessions(running, tmp_path, sink=sink)
        prober = Prober(running.api_urls[0], running.api_key, _probe_paths(sessions))
        with prober.probing():
            proxy.throttle(THROTTLED)
            sessions.streaming.join(SESSION_TIMEOUT_S)
            wait_all(running, sessions.ids, SESSION_TIMEOUT_S)
            _wait_for_sink(running, sessions.renders[0])
            proxy.clear()
        counts = proxy.counts()
        print(f"proxy: {counts.passed} requests relayed, faults injected: {counts.injected}")
        print(f"API answers while throttled: {Counter(status for _, status, _ in prober.answers)}")
        _check(running, sessions, reference)
        _check_sink(running, proxy, sessions.renders[0], f"local/faults/{sessions.renders[0]}/")
    assert prober.problems() == []
    assert set(counts.injected) == set(FaultKind) and counts.faults >= 50, counts


def test_the_store_rides_out_throttling_and_resets_and_each_sink_key_is_created_once(s3_server: S3Server) -> None:
    """Through the fault proxy at 50% faults (every kind), every write and read of the object store ends well, and
    the S3 sink's conditional writes create each key exactly once, although some writes reach S3 twice."""
    bucket = f"faults-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=bucket)
    with S3FaultProxy(s3_server.endpoint_url, seed=3) as proxy:
        client = dataclasses.replace(s3_server, endpoint_url=proxy.url).client(retries={"max_attempts": 2})
        store, retries = S3Store(bucket=bucket, client=client, retry_for_s=30), []
        sink = S3Sink(session_id="s1", bucket=bucket, client=client, target_duration=1.0)
        proxy.throttle(0.5)
        with on_retry(retries.append):
            for index in range(30):
                store.put(f"objects/{index}", bytes([index]) * 1000)
            assert [store.get(f"objects/{index}") for index in range(30)] == [bytes([i]) * 1000 for i in range(30)]
        _until_delivered(lambda: sink.start(b"init", 0))
        for index in range(30):
            _until_delivered(lambda index=index: sink.put(index, bytes([index]) * 100))
        proxy.clear()
        counts = proxy.counts()
    assert set(counts.injected) == set(FaultKind) and retries, counts
    created = Counter(
        exchange.path for exchange in proxy.exchanges if exchange.method == "PUT" and exchange.s3_status == 200
    )
    sink_keys = [f"/{bucket}/s1/{segment_name(index)}" for index in range(30)]
    assert all(created[key] == 1 for key in sink_keys), created  # S3 stored each once (a retry found it: 412)
    stored = [
        s3_server.client().get_object(Bucket=bucket, Key=key[len(bucket) + 2 :])["Body"].read() for key in sink_keys
    ]
    assert stored == [bytes([index]) * 100 for index in range(30)]


def _until_delivered(call: Callable[[], None]) -> None:
    """A sink step, again while it fails (SinkError once botocore's retries are spent), as the pump's retries do."""
    for _ in range(20):
        with contextlib.suppress(SinkError):
            call()
            return
    raise AssertionError("a sink step failed 20 times")


def test_a_store_down_longer_than_its_retry_time_raises_storage_unavailable() -> None:
    """Past its retry time a call gives up with an error naming storage (an activity then fails and is retried)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    down = S3Server(f"http://127.0.0.1:{closed}", "key", "secret")
    store = S3Store(bucket="b", client=down.client(retries={"max_attempts": 1}), retry_for_s=1.0)
    retries: list[str] = []
    with on_retry(retries.append), pytest.raises(StorageUnavailable, match="object storage unavailable"):
        store.put("a/b", b"x")
    assert retries and all("a/b" in what for what in retries)


class _FailingStore(LocalStore):
    """A local store whose puts fail (StorageUnavailable) once `puts_left` is spent: object storage going down."""

    puts_left: int | None = None  # None: up

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        if self.puts_left is not None:
            if self.puts_left == 0:
                raise StorageUnavailable(f"object storage unavailable ({key!r})")
            self.puts_left -= 1
        super().put(key, data, content_type=content_type)


def test_live_audio_taken_while_storage_is_down_is_stored_once_it_is_back(tmp_path: Path) -> None:
    """A writer whose store failed mid-append carries on where it stopped: every piece once, in order."""
    store = _FailingStore(tmp_path / "objects")
    writer = LiveAudioWriter(store, "live-1")
    speech = np.arange(6 * LIVE_PIECE_SAMPLES, dtype="<i2")
    writer.append(speech[:10])
    store.puts_left = 1  # storage goes down after one more piece: mid-append
    with pytest.raises(StorageUnavailable):
        writer.append(speech[10 : 4 * LIVE_PIECE_SAMPLES])
    store.puts_left = None
    writer.append(speech[4 * LIVE_PIECE_SAMPLES :])
    writer.finish()
    audio = LiveAudio(store, "live-1")
    audio.update(len(speech), True)
    assert np.array_equal(audio.read(0, len(speech)), speech.astype(np.float32) / 32768.0)


def _clean_render(running: Cluster, folder: Path) -> list[str]:
    """The frame hashes of a render of the sessions' speech made before any fault."""
    session_id = submit(running, 0, SAMPLES / "portrait.jpg", speech(folder, SPEECH_S))
    wait_all(running, [session_id], SESSION_TIMEOUT_S)
    return hashes(running, session_id)


def _start_sessions(running: Cluster, folder: Path, *, sink: dict[str, str] | None = None) -> Sessions:
    """Two renders (the first publishing to `sink`, if given) and a live session, returned once each has a chunk
    done and the live one is streaming: the fault starts mid-session."""
    audio = speech(folder, SPEECH_S)
    options = {**OPTIONS, "sinks": json.dumps([sink] if sink else [])}
    with Client(running.api_urls[0], api_key=running.api_key) as client:
        first = client.create_render(portrait=SAMPLES / "portrait.jpg", audio=audio, options=options).id
    renders = [first, submit(running, 1, SAMPLES / "portrait.jpg", audio)]
    live = LiveRun(running.api_urls[0])
    start_live_session(running, live, SAMPLES / "portrait.jpg", retry_for_s=60.0)
    assert live.session_id is not None, live.error
    streaming = threading.Thread(target=stream_live_session, args=(running, live, audio), daemon=True)
    streaming.start()
    deadline = time.monotonic() + SESSION_TIMEOUT_S
    with database(running)() as db:
        while time.monotonic() < deadline:
            started = set(db.scalars(select(ChunkRow.session_id).where(ChunkRow.session_id.in_(renders))))
            db.rollback()
            if started == set(renders) and live.sent_s >= 1.0:
                return Sessions(renders, live, streaming)
            time.sleep(0.2)
    raise AssertionError("the sessions did not get going")


def _probe_paths(sessions: Sessions) -> list[str]:
    paths = [f"/v1/renders/{sid}{suffix}" for sid in sessions.renders for suffix in ("", "/stream.m3u8")]
    return [*paths, f"/v1/sessions/{sessions.live.session_id}"]


def _check(running: Cluster, sessions: Sessions, reference: list[str]) -> None:
    """Every session completed with the reference's frames, each segment once, whole checkpoints."""
    assert not sessions.live.cut and sessions.live.error is None, sessions.live
    with database(running)() as db:
        rows = {row.id: row for row in db.scalars(select(SessionRow).where(SessionRow.id.in_(sessions.ids)))}
        checkpoints = list(db.scalars(select(CheckpointRow).where(CheckpointRow.session_id.in_(sessions.ids))))
    assert {sid: (rows[sid].status, rows[sid].error) for sid in sessions.ids} == {
        sid: (SessionStatus.COMPLETED, None) for sid in sessions.ids
    }
    for session_id in sessions.ids:
        assert hashes(running, session_id) == reference, f"session {session_id}: frames differ from the clean render"
        _check_stream(running, session_id)
    for checkpoint in checkpoints:
        assert hashlib.sha256(running.object(checkpoint.key)).hexdigest() == checkpoint.sha256, checkpoint.key


def _check_stream(running: Cluster, session_id: str) -> None:
    """The playlist lists each stored segment exactly once, and ends; the final video is stored whole."""
    playlist = running.object(keys.playlist(session_id)).decode().splitlines()
    listed = [line for line in playlist if line.startswith("seg-")]
    stored = sorted(key.rsplit("/", 1)[1] for key in running.keys(keys.output(session_id, "seg-")))
    assert len(listed) == len(set(listed)), f"session {session_id}: a segment is listed twice"
    assert sorted(listed) == stored, f"session {session_id}: listed {listed}, stored {stored}"
    assert playlist[-1] == "#EXT-X-ENDLIST"
    segments = b"".join(running.object(keys.output(session_id, name)) for name in listed)
    init = running.object(keys.init_segment(session_id))
    assert running.object(keys.final_video(session_id)) == init + segments


def _wait_for_sink(running: Cluster, session_id: str) -> None:
    """Until the session's S3 sink is done (its pump outlives the session: it delivers the final video last)."""
    deadline = time.monotonic() + SESSION_TIMEOUT_S
    with database(running)() as db:
        while time.monotonic() < deadline:
            row = db.get(SinkRow, (session_id, "s3"))
            db.rollback()
            if row is not None and row.status in (SinkState.DONE, SinkState.FAILED):
                return
            time.sleep(0.5)


def _check_sink(running: Cluster, proxy: S3FaultProxy, session_id: str, prefix: str) -> None:
    """The sink holds every segment of the session's stream exactly once, byte for byte, its playlist lists each
    once, and no segment key was ever created twice (its writes are conditional: a retry finds it there); the
    proxy's faults reached the sink's writes."""
    with database(running)() as db:
        row = db.get(SinkRow, (session_id, "s3"))
        assert row is not None and (row.status, row.error) == (SinkState.DONE, None), row and row.error
    listed = [line for line in running.object(keys.playlist(session_id)).decode().splitlines() if line[:4] == "seg-"]
    names = [segment_name(index) for index in range(len(listed))]
    bucket = running.s3.client()
    sink_keys = sorted(item["Key"] for item in bucket.list_objects_v2(Bucket=SINK_BUCKET, Prefix=prefix)["Contents"])
    assert sink_keys == sorted(prefix + name for name in ["init.mp4", "stream.m3u8", "final.mp4", *names])
    for name, ours in zip(names, listed, strict=True):
        sent = bucket.get_object(Bucket=SINK_BUCKET, Key=prefix + name)["Body"].read()
        assert sent == running.object(keys.output(session_id, ours)), name
    playlist = bucket.get_object(Bucket=SINK_BUCKET, Key=prefix + "stream.m3u8")["Body"].read().decode()
    assert [line for line in playlist.splitlines() if line.startswith("seg-")] == names
    base = f"/{SINK_BUCKET}/{prefix}"
    puts = [x for x in proxy.exchanges if x.method == "PUT" and x.path.startswith(base) and "/seg-" in x.path]
    # S3 stored each key once, counting writes whose answer the proxy dropped (their retries found it: 412).
    created = Counter(x.path.removeprefix(base) for x in puts if x.s3_status == 200)
    assert set(created) == set(names) and set(created.values()) == {1}, created
    sent = [x for x in proxy.exchanges if x.path.startswith(base)]
    assert sum(isinstance(x.outcome, FaultKind) for x in sent) > 0, "no fault reached the sink's requests"
