"""The object-store contract, run against LocalStore and against S3Store on a real SeaweedFS server."""

from __future__ import annotations

import os
import socket
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from monologue import storage
from monologue.errors import NotFound, TransientError
from monologue.settings import StorageSettings
from monologue.storage import LocalStore, ObjectStore, S3Store, open_store
from tests.s3_server import S3Server

KEY = "sessions/abc123/input/portrait.png"
FAST_FAIL = {"retries": {"max_attempts": 1}, "connect_timeout": 1, "read_timeout": 2}


@pytest.fixture
def bucket(s3_server: S3Server) -> Iterator[str]:
    """A fresh bucket per test, removed (with its objects) afterwards."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    client = s3_server.client()
    client.create_bucket(Bucket=name)
    yield name
    client.delete_bucket(Bucket=name)  # the server runs with -s3.allowDeleteBucketNotEmpty


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "objects")
    server: S3Server = request.getfixturevalue("s3_server")
    return S3Store(bucket=request.getfixturevalue("bucket"), prefix="env-a", client=server.client())


def test_put_get_round_trip(store: ObjectStore) -> None:
    store.put(KEY, b"\x89PNG bytes", content_type="image/png")
    assert store.get(KEY) == b"\x89PNG bytes"


def test_overwrite_with_identical_bytes_is_idempotent(store: ObjectStore) -> None:
    store.put(KEY, b"same")
    store.put(KEY, b"same")
    assert store.get(KEY) == b"same"
    assert store.list("sessions/") == [KEY]


def test_put_once_creates_an_object_only_where_none_is(store: ObjectStore) -> None:
    assert store.put_once(KEY, b"first", content_type="video/iso.segment") is True
    assert store.put_once(KEY, b"second") is False  # a later writer (a stale node back from a partition) loses
    assert store.get(KEY) == b"first"
    assert store.list("sessions/") == [KEY]  # no temporary file left behind


def test_of_writers_racing_put_once_exactly_one_creates_the_object(store: ObjectStore) -> None:
    created: list[bytes] = []
    barrier = threading.Barrier(4)

    def write(body: bytes) -> None:
        barrier.wait()
        if store.put_once(KEY, body):
            created.append(body)

    writers = [threading.Thread(target=write, args=(bytes([n]) * 1000,)) for n in range(4)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert len(created) == 1
    assert store.get(KEY) == created[0]


def test_missing_key_raises_not_found(store: ObjectStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound):
        store.get("sessions/nope/out/final.mp4")
    with pytest.raises(NotFound):
        store.size("sessions/nope/out/final.mp4")
    with pytest.raises(NotFound):
        store.get_file("sessions/nope/out/final.mp4", tmp_path / "dl.mp4")
    assert not (tmp_path / "dl.mp4").exists()
    with pytest.raises(NotFound):
        store.stream("sessions/nope/out/final.mp4")  # raised on call, before any iteration


def test_exists_and_size(store: ObjectStore) -> None:
    assert not store.exists(KEY)
    store.put(KEY, b"x" * 1234)
    assert store.exists(KEY)
    assert store.size(KEY) == 1234
    assert not store.exists("sessions/abc123")  # a "folder" is not an object


def test_put_file_get_file_large(store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 5 MiB parts (S3's minimum) so the 12 MB upload really is multipart on S3.
    monkeypatch.setattr(storage, "MULTIPART_THRESHOLD", 5 << 20)
    monkeypatch.setattr(storage, "MULTIPART_CHUNK", 5 << 20)
    parts: list[int] = []
    if isinstance(store, S3Store):
        store._s3.meta.events.register("before-call.s3.UploadPart", lambda **kw: parts.append(1))
    src = tmp_path / "big.mp4"
    payload = os.urandom(12 * 1000 * 1000)
    src.write_bytes(payload)
    key = "sessions/abc123/out/final.mp4"

    store.put_file(key, src, content_type="video/mp4")
    dst = tmp_path / "dl" / "final.mp4"
    store.get_file(key, dst)

    assert store.size(key) == len(payload)
    assert dst.read_bytes() == payload
    if isinstance(store, S3Store):
        assert len(parts) == 3


def test_stream_yields_bytes_in_order(store: ObjectStore) -> None:
    payload = bytes(range(256)) * 1000
    store.put(KEY, payload)
    chunks = list(store.stream(KEY, chunk_size=4096))
    assert b"".join(chunks) == payload
    assert len(chunks) > 1
    with pytest.raises(ValueError):
        store.stream(KEY, chunk_size=0)


def test_list_is_sorted_and_prefix_isolated(store: ObjectStore) -> None:
    keys = ["sessions/s1/out/b.mp4", "sessions/s1/input/a.png", "sessions/s1/out/a.mp4", "sessions/s10/x"]
    for k in keys:
        store.put(k, b"-")
    store.put("other/s1/z", b"-")
    assert store.list("sessions/s1/") == sorted(keys[:3])
    assert store.list("sessions/s1") == sorted(keys)  # a plain string prefix, as in S3
    assert store.list("sessions/s1/out/") == ["sessions/s1/out/a.mp4", "sessions/s1/out/b.mp4"]
    assert store.list("sessions/none/") == []
    assert store.list("") == sorted([*keys, "other/s1/z"])


def test_delete_and_delete_prefix(store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "DELETE_BATCH", 7)  # 30 objects -> 5 DeleteObjects calls
    doomed = [f"sessions/s1/out/seg-{i:05d}.mp4" for i in range(30)]
    for k in doomed:
        store.put(k, b"-")
    store.put("sessions/s2/out/final.mp4", b"keep")

    store.delete(doomed[0])
    store.delete(doomed[0])  # missing key is fine
    assert not store.exists(doomed[0])
    assert store.delete_prefix("sessions/s1/") == 29
    assert store.list("sessions/") == ["sessions/s2/out/final.mp4"]
    assert store.delete_prefix("sessions/s1/") == 0
    with pytest.raises(ValueError):
        store.delete_prefix("")


@pytest.mark.parametrize(
    "bad", ["", "/etc/passwd", "a/../b", "..", "a\\b", "a//b", "a/", "./a", "a/./b", "a/b.part-tmp"]
)
def test_invalid_keys_raise_value_error(store: ObjectStore, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(bad, b"x")
    with pytest.raises(ValueError, match="invalid object key"):
        store.get(bad)
    with pytest.raises(ValueError, match="invalid object key"):
        store.exists(bad)


def test_local_writes_leave_no_temp_files(tmp_path: Path) -> None:
    root = tmp_path / "objects"
    store = LocalStore(root)
    store.put(KEY, b"first")
    src = tmp_path / "src.bin"
    src.write_bytes(b"y" * 100_000)
    store.put_file("sessions/abc123/out/final.mp4", src)
    store.get_file("sessions/abc123/out/final.mp4", tmp_path / "copy.bin")
    # A write that fails after the temp file exists (the source is missing) must leave the old object intact.
    with pytest.raises(FileNotFoundError):
        store.put_file(KEY, tmp_path / "missing.bin")
    assert store.get(KEY) == b"first"
    with pytest.raises(FileNotFoundError):
        store.put_file("sessions/abc123/out/never.mp4", tmp_path / "missing.bin")
    assert not store.exists("sessions/abc123/out/never.mp4")

    leftovers = [p for p in tmp_path.rglob("*") if p.is_file() and p.name.endswith(".part-tmp")]
    assert leftovers == []
    assert store.path(KEY).read_bytes() == b"first"
    assert sorted(p.name for p in store.path(KEY).parent.iterdir()) == ["portrait.png"]


def test_local_delete_prefix_removes_empty_folders(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    store.put("sessions/s1/out/a.mp4", b"-")
    store.put("sessions/s2/out/a.mp4", b"-")
    store.delete_prefix("sessions/s1/")
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["s2"]


def test_s3_prefix_isolation(s3_server: S3Server, bucket: str) -> None:
    a = S3Store(bucket=bucket, prefix="env-a", client=s3_server.client())
    b = S3Store(bucket=bucket, prefix="/env-b/", client=s3_server.client())
    a.put(KEY, b"a")
    b.put(KEY, b"b")
    assert a.get(KEY) == b"a"
    assert b.get(KEY) == b"b"
    assert a.list("") == [KEY]
    assert a.delete_prefix("sessions/") == 1
    assert b.list("sessions/") == [KEY]
    raw = s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]
    assert [o["Key"] for o in raw] == [f"env-b/{KEY}"]


def test_s3_presigned_url_downloads(s3_server: S3Server, bucket: str) -> None:
    store = S3Store(bucket=bucket, prefix="env-a", client=s3_server.client())
    store.put(KEY, b"presigned payload", content_type="image/png")
    with urllib.request.urlopen(store.presigned_url(KEY, expires_s=60), timeout=5) as resp:
        assert resp.read() == b"presigned payload"
        assert resp.headers["Content-Type"] == "image/png"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_s3_endpoint_down_is_transient(tmp_path: Path) -> None:
    down = S3Server(f"http://127.0.0.1:{_closed_port()}", "key", "secret")
    store = S3Store(bucket="whatever", client=down.client(**FAST_FAIL))
    src = tmp_path / "f.bin"
    src.write_bytes(b"x")
    calls: list[Any] = [
        lambda: store.put(KEY, b"x"),
        lambda: store.get(KEY),
        lambda: store.exists(KEY),
        lambda: store.list("sessions/"),
        lambda: store.put_file(KEY, src),
        lambda: store.get_file(KEY, tmp_path / "out.bin"),
    ]
    for call in calls:
        with pytest.raises(TransientError, match="unreachable"):
            call()


class _Always503(BaseHTTPRequestHandler):
    def _reply(self) -> None:
        body = b"<Error><Code>ServiceUnavailable</Code><Message>busy</Message></Error>"
        self.send_response(503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_HEAD = _reply

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_s3_5xx_is_transient() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        busy = S3Server(f"http://127.0.0.1:{httpd.server_address[1]}", "k", "s")
        store = S3Store(bucket="whatever", client=busy.client(**FAST_FAIL))
        with pytest.raises(TransientError, match=r"503|ServiceUnavailable"):
            store.get(KEY)
        with pytest.raises(TransientError):
            store.put(KEY, b"x")
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_open_store_builds_each_backend(
    s3_server: S3Server, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = open_store(StorageSettings(backend="local", root=tmp_path / "objects"))
    assert isinstance(local, LocalStore)
    local.put(KEY, b"l")
    assert (tmp_path / "objects" / KEY).read_bytes() == b"l"

    # The S3 store makes its own client here, from boto3's usual credential chain (the environment).
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    settings = StorageSettings(
        backend="s3", bucket=bucket, prefix="env-c", endpoint_url=s3_server.endpoint_url, region="us-east-1"
    )
    remote = open_store(settings)
    assert isinstance(remote, S3Store)
    remote.put(KEY, b"s")
    assert remote.get(KEY) == b"s"
    assert s3_server.client().get_object(Bucket=bucket, Key=f"env-c/{KEY}")["Body"].read() == b"s"


def test_get_range_reads_exactly_the_requested_bytes(store: ObjectStore) -> None:
    data = bytes(range(256)) * 40
    store.put("sessions/r/input/audio.wav", data)
    assert store.get_range("sessions/r/input/audio.wav", 0, 44) == data[:44]
    assert store.get_range("sessions/r/input/audio.wav", 1000, 5000) == data[1000:5000]
    assert store.get_range("sessions/r/input/audio.wav", 10_000, 20_000) == data[10_000:]  # short at the end
    assert store.get_range("sessions/r/input/audio.wav", 20_000, 30_000) == b""
    assert store.get_range("sessions/r/input/audio.wav", 7, 7) == b""
    with pytest.raises(ValueError, match="range"):
        store.get_range("sessions/r/input/audio.wav", 10, 5)
    with pytest.raises(NotFound):
        store.get_range("sessions/r/input/missing.wav", 0, 10)
