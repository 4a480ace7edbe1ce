"""A session's data lifecycle against real backends, SQLite with a local folder and PostgreSQL with S3 (SeaweedFS):
a delete removes everything under the session's own prefixes and nothing else, keeps a tombstone and fences the
node; retention removes one part of the sessions that ended long enough ago, a bounded batch at a time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import sessionmaker

from monologue import audio_tickets, keys, lifecycle, repo
from monologue.contracts import ChunkKind, SessionStatus, SinkType
from monologue.contracts.retention import DataPart
from monologue.db import (
    AudioTicketRow,
    CheckpointRow,
    ChunkRow,
    SessionRow,
    SinkRow,
    make_engine,
    make_sessionmaker,
    migrate,
    utcnow,
)
from monologue.errors import LeaseFenced, SinkObjectsKept
from monologue.repo import fence, lifecycle as repo_lifecycle, sinks as repo_sinks
from monologue.schemas import SinkState
from monologue.storage import LocalStore, ObjectStore, S3Store
from tests.helpers import postgres_database
from tests.s3_server import S3Server

SINK_PREFIX = "videos"
SIZES = {"audio_seconds": 2.0, "width": 64, "height": 64}


@dataclass
class World:
    sessions: sessionmaker[Any]
    store: ObjectStore
    sink_bucket: str
    sink_client: Callable[..., Any]  # signed for the test server, as `s3_client` would be with the nodes' credentials
    s3: Any


@pytest.fixture(params=["sqlite+local", "postgresql+s3"])
def world(request: pytest.FixtureRequest, tmp_path: Path, s3_server: S3Server) -> Iterator[World]:
    s3 = s3_server.client()
    buckets = [f"lifecycle-{uuid.uuid4().hex[:12]}-{part}" for part in ("store", "sink")]
    for bucket in buckets:
        s3.create_bucket(Bucket=bucket)
    store: ObjectStore = (
        LocalStore(tmp_path / "objects")
        if request.param == "sqlite+local"
        else S3Store(bucket=buckets[0], prefix="env", client=s3)
    )
    with _database(request.param, tmp_path) as url:
        migrate(url)
        engine = make_engine(url)
        yield World(make_sessionmaker(engine), store, buckets[1], lambda **_: s3, s3)
        engine.dispose()
    for bucket in buckets:
        s3.delete_bucket(Bucket=bucket)  # the server runs with -s3.allowDeleteBucketNotEmpty


def _database(kind: str, tmp_path: Path) -> AbstractContextManager[str]:
    return nullcontext(f"sqlite:///{tmp_path}/db.sqlite") if kind.startswith("sqlite") else postgres_database()


def _every_key(session_id: str) -> list[str]:
    """One object in each of the session's folders (keys.py names them all)."""
    return [
        keys.staged_upload(session_id, "portrait"),
        keys.portrait(session_id),
        keys.live_audio_piece(session_id, 0),
        keys.reference(session_id),
        keys.checkpoint(session_id, 0, lease=3),
        keys.segment(session_id, "N", 0),
        keys.frame_hashes(session_id, "N", 0),
        keys.final_video(session_id),
    ]


def _session(world: World, session_id: str, *, ended_days_ago: float | None = 0.0) -> None:
    """A session with a row of each kind, an object in each folder and two S3 sink objects; ended that many days
    ago (None: still running), under node lease 3."""
    sink = {"type": "s3", "bucket": world.sink_bucket, "prefix": SINK_PREFIX, "name": "archive"}
    with world.sessions() as db:
        repo.create_session(db, session_id=session_id, tenant="t", options={"sinks": [sink]}, workflow_id="w", **SIZES)
        repo.set_node(db, session_id=session_id, node_id="node-a", lease=3)
        db.add(ChunkRow(session_id=session_id, kind=ChunkKind.N, index=0, first_frame=0, frames=40, segment_key="k"))
        db.commit()
        repo.record_checkpoint(db, session_id=session_id, index=0, key=keys.checkpoint(session_id, 0), sha256="0")
        repo_sinks.record_sink(
            db, session_id=session_id, name="archive", kind=SinkType.S3, status=SinkState.DONE, acknowledged=1
        )
        audio_tickets.issue(db, session_id=session_id, tenant="t", key_id=None, ttl_s=60)
        if ended_days_ago is not None:
            repo.mark_ended(db, session_id=session_id, status=SessionStatus.CANCELLED, error="cancelled")
            ended = utcnow() - timedelta(days=ended_days_ago)
            db.execute(update(SessionRow).where(SessionRow.id == session_id).values(finished_at=ended))
            db.commit()
    for key in _every_key(session_id):
        world.store.put(key, b"personal data")
    for name in ("init.mp4", "seg-N00000.m4s"):
        world.s3.put_object(Bucket=world.sink_bucket, Key=f"{SINK_PREFIX}/{session_id}/{name}", Body=b"copy")


def _sink_keys(world: World) -> list[str]:
    listed = world.s3.list_objects_v2(Bucket=world.sink_bucket).get("Contents", [])
    return sorted(str(item["Key"]) for item in listed)


def _rows(world: World, session_id: str) -> dict[str, int]:
    with world.sessions() as db:
        return {
            table.__tablename__: len(db.scalars(select(table).where(table.session_id == session_id)).all())
            for table in (ChunkRow, CheckpointRow, SinkRow, AudioTicketRow)
        }


def test_a_delete_removes_the_sessions_objects_only_keeps_a_tombstone_and_fences_its_node(world: World) -> None:
    _session(world, "s1")
    _session(world, "s10")  # its keys start with the first's id: a prefix without its '/' would take them too
    world.s3.put_object(Bucket=world.sink_bucket, Key=f"{SINK_PREFIX}/s1", Body=b"not the session's")
    world.s3.put_object(Bucket=world.sink_bucket, Key="s1/seg-N00000.m4s", Body=b"another prefix")
    others = world.store.list("sessions/s10/")

    removed = lifecycle.delete_session(world.sessions, world.store, "s1", sink_client=world.sink_client)

    assert removed == len(_every_key("s1")) + 2
    assert world.store.list("sessions/s1/") == [] and world.store.list("sessions/s10/") == others
    assert _sink_keys(world) == sorted(
        [f"{SINK_PREFIX}/s1", f"{SINK_PREFIX}/s10/init.mp4", f"{SINK_PREFIX}/s10/seg-N00000.m4s", "s1/seg-N00000.m4s"]
    )
    with world.sessions() as db:
        tombstone = repo.get_session(db, session_id="s1")
        assert tombstone is not None and tombstone.deleted_at is not None
        assert (tombstone.status, tombstone.tenant, tombstone.options, tombstone.error) == ("cancelled", "t", {}, None)
        assert tombstone.inputs_removed_at is not None and tombstone.outputs_removed_at is not None
        first_deleted_at = tombstone.deleted_at
    assert _rows(world, "s1") == dict.fromkeys(_rows(world, "s1"), 0)
    assert _rows(world, "s10") == dict.fromkeys(_rows(world, "s10"), 1)
    with pytest.raises(LeaseFenced):  # a chunk still finishing under the node's lease writes nothing more
        fence.check(world.sessions, session_id="s1", lease=3)
    fence.check(world.sessions, session_id="s10", lease=3)

    assert lifecycle.delete_session(world.sessions, world.store, "s1", sink_client=world.sink_client) == 0
    with world.sessions() as db:
        again = repo.get_session(db, session_id="s1")
        assert again is not None and again.deleted_at == first_deleted_at


def test_a_delete_that_a_sinks_bucket_refused_is_finished_by_the_next(world: World) -> None:
    _session(world, "s2")
    missing = {"type": "s3", "bucket": "no-such-bucket-here", "prefix": SINK_PREFIX}
    with world.sessions() as db:
        db.execute(update(SessionRow).where(SessionRow.id == "s2").values(options={"sinks": [missing]}))
        db.commit()

    with pytest.raises(SinkObjectsKept, match="s3://no-such-bucket-here/videos/s2/"):
        lifecycle.delete_session(world.sessions, world.store, "s2", sink_client=world.sink_client)
    with world.sessions() as db:
        row = repo.get_session(db, session_id="s2")
        assert row is not None and row.deleted_at is not None and not repo_lifecycle.purged(row)
        assert row.options == {"sinks": [missing]}  # kept until the sink's objects are gone: the next try needs it
        db.execute(update(SessionRow).where(SessionRow.id == "s2").values(options={}))  # the bucket is back, empty
        db.commit()

    lifecycle.delete_session(world.sessions, world.store, "s2", sink_client=world.sink_client)
    with world.sessions() as db:
        row = repo.get_session(db, session_id="s2")
        assert row is not None and repo_lifecycle.purged(row)


def test_retention_removes_one_part_of_sessions_that_ended_long_enough_ago_a_batch_at_a_time(world: World) -> None:
    _session(world, "old-a", ended_days_ago=10)
    _session(world, "old-b", ended_days_ago=9)
    _session(world, "young", ended_days_ago=1)
    _session(world, "going", ended_days_ago=None)  # started long ago, still running: never due
    _session(world, "deleting", ended_days_ago=20)  # a DELETE failed half-way: the next DELETE's to finish
    with world.sessions() as db:
        repo_lifecycle.mark_deleted(db, session_id="deleting")
    with world.sessions() as db:
        db.execute(update(SessionRow).where(SessionRow.id == "going").values(created_at=utcnow() - timedelta(days=30)))
        db.commit()
    before = utcnow() - timedelta(days=5)
    inputs = {key for key in _every_key("old-a") if key.split("/")[2] != "out"}

    def clear(part: DataPart) -> tuple[int, int]:
        return lifecycle.clear_due(world.sessions, world.store, part=part, ended_before=before, batch=1)

    assert clear(DataPart.INPUTS) == (1, len(inputs))  # the oldest first, one per call
    assert set(world.store.list("sessions/old-a/")) == set(_every_key("old-a")) - inputs
    assert set(world.store.list("sessions/old-b/")) == set(_every_key("old-b"))
    assert clear(DataPart.INPUTS) == (1, len(inputs))
    assert clear(DataPart.INPUTS) == (0, 0)
    assert clear(DataPart.OUTPUTS)[0] == 1 and clear(DataPart.OUTPUTS)[0] == 1 and clear(DataPart.OUTPUTS)[0] == 0

    assert world.store.list("sessions/old-a/") == [] and world.store.list("sessions/old-b/") == []
    for kept in ("young", "going", "deleting"):
        assert set(world.store.list(f"sessions/{kept}/")) == set(_every_key(kept))
    with world.sessions() as db:
        rows = {row.id: row for row in db.scalars(select(SessionRow))}
    assert {sid for sid, row in rows.items() if row.inputs_removed_at and row.outputs_removed_at} == {"old-a", "old-b"}
    assert all(rows[sid].inputs_removed_at is None for sid in ("young", "going", "deleting"))
    assert _rows(world, "old-a")["checkpoints"] == 0 and _rows(world, "young")["checkpoints"] == 1
    assert len(_sink_keys(world)) == 10  # retention keeps to our store: a sink's copies are its owner's


def test_retention_removes_uploaded_assets_older_than_the_inputs_days_oldest_first(world: World) -> None:
    """Assets have no row: their ids carry their upload time, which retention ages them by."""
    day, now = 86_400.0, time.time()
    ages = {"tenant-a": 9.0, "tenant-b": 8.0, "tenant-c": 2.0}
    assets = {tenant: keys.new_asset_id(now - days * day) for tenant, days in ages.items()}
    for tenant, asset_id in assets.items():
        assert abs(keys.asset_uploaded_s(asset_id) - (now - ages[tenant] * day)) < 0.001
        world.store.put(keys.asset(tenant, asset_id, "portrait"), b"a face")
    world.store.put(keys.asset("tenant-a", assets["tenant-a"], "audio"), b"a second object under it")

    def expire() -> tuple[int, int]:
        return lifecycle.expire_assets(world.store, uploaded_before=now - 5 * day, batch=1)

    assert expire() == (1, 2)  # the oldest (tenant-a's) first, every object under it
    assert expire() == (1, 1) and expire() == (0, 0)
    assert world.store.list(keys.ASSETS) == [keys.asset("tenant-c", assets["tenant-c"], "portrait")]
