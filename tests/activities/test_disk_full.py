"""A node's disk filling up (issue 28, item 4), on a real tmpfs of a few hundred KB: a write that finds no room inside
an activity becomes NodeDiskFull naming the disk and its free space, the node then has a shortage until room comes
back, and the local object store leaves neither a truncated object nor its temporary file behind."""

from __future__ import annotations

import dataclasses
import errno
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import disks as node_disks
from activities.disks import NodeDisks
from activities.errors import activity_context
from monologue import contracts as c
from monologue.storage import LocalStore
from tests.helpers import grow_tmpfs, tmpfs

NODE = "n1"
DISK = "256k"
TOO_MUCH = b"\x01" * (512 << 10)  # twice the disk


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "small", DISK) as folder:
        yield folder


@pytest.fixture
def watch() -> Iterator[Callable[[NodeDisks], NodeDisks]]:
    """Watch a node's disks, as the node process does at its start; forgotten afterwards."""

    def watching(disks: NodeDisks) -> NodeDisks:
        disks.scratch.mkdir(exist_ok=True)
        node_disks.watch(disks)
        return disks

    yield watching
    node_disks._watched = None


@pytest.fixture
def watched(small_disk: Path, tmp_path: Path, watch: Callable[[NodeDisks], NodeDisks]) -> NodeDisks:
    """A node whose scratch folder is on the small disk (its store is S3: no local folder)."""
    return watch(NodeDisks(node_id=NODE, scratch=small_disk / "scratch", min_free_bytes=16 << 10))


def _in_activity(work: Callable[[], object], queue: str = c.node_task_queue(NODE), kind: str = c.FINALIZE) -> None:
    """Run `work` inside `activity_context` as an activity of type `kind` on `queue`."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, task_queue=queue, activity_type=kind)

    def activity() -> None:
        with activity_context(node_id=NODE):
            work()

    env.run(activity)


def _assemble(scratch: Path, data: bytes) -> None:
    """Write `data` in a temporary folder of `scratch`, as finalize assembles the final MP4."""
    with tempfile.TemporaryDirectory(dir=scratch) as folder:
        (Path(folder) / "final.mp4").write_bytes(data)


def test_a_write_that_finds_no_room_becomes_node_disk_full_naming_the_disk(watched: NodeDisks) -> None:
    """Finalize's write to the scratch disk: non-retryable (a retry on this node's queue would fail again), its
    message naming the node, the folder, that it is the scratch disk and its free space; the node then takes no
    session until the disk has more room than it had then."""
    assert watched.shortage() is None
    with pytest.raises(ApplicationError) as raised:
        _in_activity(lambda: _assemble(watched.scratch, TOO_MUCH))
    error = raised.value
    assert (error.type, error.non_retryable) == (c.NODE_DISK_FULL, True)
    assert f"node {NODE}: no space left on {watched.scratch} (scratch, " in error.message, error.message
    assert error.message.endswith(" free): finalize"), error.message
    shortage = watched.shortage()
    assert shortage is not None and f"scratch {watched.scratch} filled up" in shortage, shortage
    grow_tmpfs(watched.scratch.parent, "1m")
    assert watched.shortage() is None


def test_a_scratch_disk_under_its_minimum_is_a_shortage(watched: NodeDisks) -> None:
    (watched.scratch / "filler").write_bytes(b"\x00" * (250 << 10))
    shortage = watched.shortage()
    assert shortage is not None and "under min_free_scratch_mb (16 KiB)" in shortage, shortage
    (watched.scratch / "filler").unlink()
    assert watched.shortage() is None


def test_a_spent_quota_behind_another_error_is_a_full_disk_and_other_errors_pass(watched: NodeDisks) -> None:
    """EDQUOT counts as a full disk, wrapped or not; on the sink queue a retry may find another node: retryable."""

    def wrapped() -> None:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as err:
            raise RuntimeError("the encoder gave up") from err

    with pytest.raises(ApplicationError) as raised:
        _in_activity(wrapped, queue=c.sink_task_queue("monologue"), kind=c.RUN_SINK)
    assert (raised.value.type, raised.value.non_retryable) == (c.NODE_DISK_FULL, False)
    assert raised.value.message.endswith(": run_sink")

    def denied() -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(watched.scratch))

    with pytest.raises(PermissionError):
        _in_activity(denied)


def test_the_local_store_on_a_full_disk_leaves_no_partial_object(
    small_disk: Path, tmp_path: Path, watch: Callable[[NodeDisks], NodeDisks]
) -> None:
    """put and put_file raise (NodeDiskFull inside an activity, naming the store's disk), remove their temporary
    file, and leave the object as it was: absent, or its previous whole version."""
    watched = watch(NodeDisks(node_id=NODE, scratch=tmp_path / "scratch", min_free_bytes=0, store=small_disk))
    store = LocalStore(small_disk)
    store.put("sessions/s/out/final.mp4", b"previous")
    source = tmp_path / "big.mp4"
    source.write_bytes(TOO_MUCH)
    for write in (
        lambda: store.put("sessions/s/out/final.mp4", TOO_MUCH),
        lambda: store.put_file("sessions/s/out/final.mp4", source),
        lambda: store.put_file("sessions/s/out/new.mp4", source),
    ):
        with pytest.raises(ApplicationError) as raised:
            _in_activity(write)
        assert raised.value.type == c.NODE_DISK_FULL and f"on {watched.store} (store, " in raised.value.message
        assert store.get("sessions/s/out/final.mp4") == b"previous"
        assert not store.exists("sessions/s/out/new.mp4")
        assert store.list("sessions/") == ["sessions/s/out/final.mp4"]
        leftovers = [path.name for path in small_disk.rglob("*") if path.is_file()]
        assert leftovers == ["final.mp4"], leftovers
    with pytest.raises(OSError) as outside:  # outside an activity: the OSError itself
        store.put("sessions/s/out/final.mp4", TOO_MUCH)
    assert outside.value.errno == errno.ENOSPC
