"""Object storage: one small interface, a local-folder backend (dev, single host) and an S3 backend.

Keys look like `sessions/<id>/out/final.mp4` and come from `monologue.keys`, never from user input;
`_check_key` is the last guard against a key that could escape the root or the prefix.

Outages (issue 28): every S3 call is retried while the store is unreachable or throttling, for up to `retry_for_s`
(MONOLOGUE_STORAGE__RETRY_FOR_S, 45 s on nodes; the API gives up sooner and answers 503), then raises
`StorageUnavailable` naming storage (monologue/s3_retry.py). Retried writes need no conditional put: every key is
derived from ids and rewritten with the same bytes (a regenerated chunk is bit-identical), and each object is one
PutObject (or a multipart upload that only its completion makes visible), so a reader sees the whole object or
none. Overwriting is also what lets a corrupt checkpoint be replaced.
"""

from __future__ import annotations

import builtins
import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

import boto3
import botocore.exceptions as bce
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from monologue.errors import NotFound, TransientError
from monologue.localfs import private_dir
from monologue.s3_retry import Result, on_retry, retrying, retrying_for, s3_errors

__all__ = ["LocalStore", "ObjectStore", "S3Store", "on_retry", "open_store", "retrying_for"]

if TYPE_CHECKING:
    from monologue.settings import StorageSettings

# Module constants rather than arguments, so tests can lower them instead of moving 1000+ objects.
DELETE_BATCH = 1000  # S3's maximum keys per DeleteObjects call
MULTIPART_THRESHOLD = 16 << 20  # put_file switches to multipart upload above this size
MULTIPART_CHUNK = 8 << 20  # part size; S3 requires >= 5 MiB for all but the last part

_TMP_SUFFIX = ".part-tmp"  # LocalStore's in-progress writes; never a valid key, hidden from list()


class ObjectStore(Protocol):
    """What every backend offers; callers depend on this, so dev (local) and prod (S3) run the same code."""

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None: ...
    def put_file(self, key: str, path: Path, *, content_type: str | None = None) -> None: ...
    # Create the object unless one exists (then leave it): True if this call created it. Atomic on every backend
    # (S3's conditional write, If-None-Match: *), so of two writers racing exactly one creates the object.
    def put_once(self, key: str, data: bytes, *, content_type: str | None = None) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, end: int) -> bytes: ...  # bytes [start, end), fewer at the end
    def get_file(self, key: str, path: Path) -> None: ...
    def exists(self, key: str) -> bool: ...
    def size(self, key: str) -> int: ...
    def stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]: ...
    def list(self, prefix: str) -> builtins.list[str]: ...
    def delete(self, key: str) -> None: ...
    def delete_prefix(self, prefix: str) -> int: ...


def _check_key(key: str, *, what: str = "key") -> str:
    """Reject anything that is not a plain relative `a/b/c` path, so no key can leave the store."""
    bad = (
        not key
        or key.startswith("/")
        or "\\" in key
        or "\x00" in key
        or ".." in key
        or key.endswith(_TMP_SUFFIX)
        or any(part in ("", ".") for part in key.split("/"))
    )
    if bad:
        raise ValueError(f"invalid object {what}: {key!r}")
    return key


def _check_prefix(prefix: str) -> str:
    """A prefix is a key or the start of one; it may be empty (list) or end with '/'."""
    if prefix:
        _check_key(prefix.removesuffix("/"), what="prefix")
    return prefix


def _check_range(start: int, end: int) -> None:
    if start < 0 or end < start:
        raise ValueError(f"invalid byte range [{start}, {end})")


def _check_chunk(chunk_size: int) -> None:
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")


class LocalStore:
    """Objects as files under `root`; what the single-host setup and the tests use. The root is private
    (0700) and every object is written 0600 (`tempfile.mkstemp`'s mode, kept by `os.replace`)."""

    def __init__(self, root: Path) -> None:
        self._root = private_dir(Path(root).absolute(), tighten=True)

    def path(self, key: str) -> Path:
        """The local file for a key (the API serves files from it directly)."""
        return self._root / _check_key(key)

    def _write_atomic(self, target: Path, write: Callable[[IO[bytes]], object]) -> None:
        """Temp file in the same folder, then os.replace: readers never see half a file."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=_TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        self._write_atomic(self.path(key), lambda f: f.write(data))

    def put_once(self, key: str, data: bytes, *, content_type: str | None = None) -> bool:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=_TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, target)  # fails if the name exists: the whole file appears, or nothing does
            return True
        except FileExistsError:
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)

    def put_file(self, key: str, path: Path, *, content_type: str | None = None) -> None:
        def copy(dst: IO[bytes]) -> None:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)

        self._write_atomic(self.path(key), copy)

    def _open(self, key: str) -> IO[bytes]:
        try:
            return open(self.path(key), "rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
            raise NotFound(f"no object {key!r}") from exc

    def get(self, key: str) -> bytes:
        with self._open(key) as f:
            return f.read()

    def get_range(self, key: str, start: int, end: int) -> bytes:
        _check_range(start, end)
        with self._open(key) as f:
            f.seek(start)
            return f.read(end - start)

    def get_file(self, key: str, path: Path) -> None:
        with self._open(key) as src:
            self._write_atomic(Path(path), lambda dst: shutil.copyfileobj(src, dst, 1 << 20))

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def size(self, key: str) -> int:
        p = self.path(key)
        if not p.is_file():
            raise NotFound(f"no object {key!r}")
        return p.stat().st_size

    def stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        _check_chunk(chunk_size)
        f = self._open(key)  # opened here, not in the generator, so NotFound is raised on call

        def chunks() -> Iterator[bytes]:
            with f:
                while block := f.read(chunk_size):
                    yield block

        return chunks()

    def list(self, prefix: str) -> builtins.list[str]:
        _check_prefix(prefix)
        base = self._root / prefix.rpartition("/")[0]  # deepest folder that can hold matches
        keys: builtins.list[str] = []
        for folder, _dirs, files in os.walk(base):
            for name in files:
                key = (Path(folder) / name).relative_to(self._root).as_posix()
                if key.startswith(prefix) and not name.endswith(_TMP_SUFFIX):
                    keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise ValueError("delete_prefix needs a non-empty prefix")
        keys = self.list(prefix)
        for key in keys:
            self.delete(key)
        # Drop the folders this emptied, so a deleted session leaves nothing behind.
        for folder in sorted({self.path(k).parent for k in keys}, key=lambda p: len(p.parts), reverse=True):
            while folder != self._root:
                try:
                    folder.rmdir()
                except OSError:  # not empty (or already gone): stop climbing
                    break
                folder = folder.parent
        return len(keys)


class S3Store:
    """Objects in an S3 bucket (AWS or any S3-compatible server such as SeaweedFS or MinIO). Each call retries
    transient failures for `retry_for_s` seconds (0: one try, after botocore's own few), see the module docstring."""

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        client: Any | None = None,
        retry_for_s: float = 0.0,
    ) -> None:
        self._bucket = bucket
        bare = prefix.strip("/")
        self._prefix = _check_key(bare, what="prefix") + "/" if bare else ""
        self._retry_for_s = retry_for_s
        if client is None:
            # Custom endpoints rarely support virtual-host buckets; path style works everywhere. botocore's own
            # retries smooth over a single dropped connection; `_call` rides out longer outages.
            config = Config(
                signature_version="s3v4",
                s3={"addressing_style": "path" if endpoint_url else "auto"},
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=60,
            )
            client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        self._s3 = client

    def _k(self, key: str) -> str:
        return self._prefix + _check_key(key)

    def _call(self, key: str, action: Callable[[], Result]) -> Result:
        return retrying(key, action, self._retry_for_s)

    def put(self, key: str, data: bytes, *, content_type: str | None = None) -> None:
        extra = {"ContentType": content_type} if content_type else {}
        self._call(key, lambda: self._s3.put_object(Bucket=self._bucket, Key=self._k(key), Body=data, **extra))

    def put_once(self, key: str, data: bytes, *, content_type: str | None = None) -> bool:
        extra = {"ContentType": content_type} if content_type else {}

        def create() -> bool:
            try:
                self._s3.put_object(Bucket=self._bucket, Key=self._k(key), Body=data, IfNoneMatch="*", **extra)
            except bce.ClientError as exc:
                # 412: an object is there. A retry of a write that S3 carried out (its answer lost) lands here too.
                if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "412"):
                    return False
                raise
            return True

        return self._call(key, create)

    def put_file(self, key: str, path: Path, *, content_type: str | None = None) -> None:
        # Above the threshold a multipart upload: only its completion makes the object visible, and a failed one is
        # aborted by boto3 and started again whole.
        config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD, multipart_chunksize=MULTIPART_CHUNK)
        extra = {"ContentType": content_type} if content_type else None
        self._call(
            key, lambda: self._s3.upload_file(str(path), self._bucket, self._k(key), ExtraArgs=extra, Config=config)
        )

    def get(self, key: str) -> bytes:
        def read() -> bytes:
            with self._s3.get_object(Bucket=self._bucket, Key=self._k(key))["Body"] as body:
                return bytes(body.read())

        return self._call(key, read)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        _check_range(start, end)
        if end == start:
            return b""

        def read() -> bytes:
            try:
                response = self._s3.get_object(Bucket=self._bucket, Key=self._k(key), Range=f"bytes={start}-{end - 1}")
            except bce.ClientError as exc:  # a range starting past the end is "not satisfiable": no bytes there
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise
            with response["Body"] as body:
                return bytes(body.read())

        return self._call(key, read)

    def get_file(self, key: str, path: Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # boto3 downloads to a temp name and renames, so no half file is left
        self._call(key, lambda: self._s3.download_file(self._bucket, self._k(key), str(path)))

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except NotFound:
            return False
        return True

    def size(self, key: str) -> int:
        head = self._call(key, lambda: self._s3.head_object(Bucket=self._bucket, Key=self._k(key)))
        return int(head["ContentLength"])

    def stream(self, key: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        _check_chunk(chunk_size)
        # The request happens here, so NotFound is raised on call; a failure mid-body is not retried (the caller
        # has sent part of it already).
        body = self._call(key, lambda: self._s3.get_object(Bucket=self._bucket, Key=self._k(key))["Body"])

        def chunks() -> Iterator[bytes]:
            with body, s3_errors(key):
                yield from body.iter_chunks(chunk_size)

        return chunks()

    def list(self, prefix: str) -> builtins.list[str]:
        full = self._prefix + _check_prefix(prefix)

        def pages() -> builtins.list[str]:
            keys: builtins.list[str] = []
            for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=full):
                keys.extend(str(obj["Key"])[len(self._prefix) :] for obj in page.get("Contents", []))
            return keys

        return sorted(self._call(full, pages))

    def delete(self, key: str) -> None:
        self._call(key, lambda: self._s3.delete_object(Bucket=self._bucket, Key=self._k(key)))

    def delete_prefix(self, prefix: str) -> int:
        if not prefix:
            raise ValueError("delete_prefix needs a non-empty prefix")
        keys = self.list(prefix)
        for start in range(0, len(keys), DELETE_BATCH):
            batch = [{"Key": self._prefix + k} for k in keys[start : start + DELETE_BATCH]]
            resp = self._call(prefix, functools.partial(self._delete_batch, batch))
            if errors := resp.get("Errors"):
                first = errors[0]
                raise TransientError(
                    f"could not delete {len(errors)} objects under {prefix!r}, e.g. "
                    f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message')}"
                )
        return len(keys)

    def _delete_batch(self, batch: builtins.list[dict[str, str]]) -> Any:
        return self._s3.delete_objects(Bucket=self._bucket, Delete={"Objects": batch, "Quiet": True})

    def presigned_url(self, key: str, expires_s: int = 3600) -> str:
        """A time-limited GET link, so clients download straight from the bucket."""
        params = {"Bucket": self._bucket, "Key": self._k(key)}
        with s3_errors(key):
            return str(self._s3.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_s))


def open_store(settings: StorageSettings, *, retry_for_s: float | None = None) -> ObjectStore:
    """The store the settings ask for; an S3 store retries each call for `retry_for_s` (default: the settings')."""
    if settings.backend == "local":
        if settings.root is None:
            raise ValueError("storage.root is not set for the local backend")
        return LocalStore(settings.root)
    if not settings.bucket:
        raise ValueError("storage.backend is 's3' but storage.bucket is empty")
    return S3Store(
        bucket=settings.bucket,
        prefix=settings.prefix,
        endpoint_url=settings.endpoint_url,
        region=settings.region,
        retry_for_s=settings.retry_for_s if retry_for_s is None else retry_for_s,
    )
