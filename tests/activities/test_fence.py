"""Fencing (c.FENCING, monologue/repo/fence.py): a node that was cut off, whose session moved to another node under
a newer lease, writes nothing when it comes back: not its chunk, its checkpoint, its claim on the session or its
final video. Two nodes' activities in one process over one database and real S3 (SeaweedFS behind the logging proxy
the partition fault uses), in the order a partition produces. And with the fence made to fail once, the check the
partition fault runs (`double_publishes`) catches the stale node's segment stored over the new node's."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import sessionmaker
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.node import NodeActivities
from cli.faults import double_publishes
from cli.s3_faults import S3FaultProxy
from monologue import contracts as c, keys, repo
from monologue.db import ChunkRow, SessionRow, make_engine, make_sessionmaker, migrate
from monologue.errors import LeaseFenced
from monologue.repo import fence
from monologue.storage import S3Store
from tests.helpers import postgres_database, stored_session
from tests.s3_server import S3Server

OPTIONS = c.RenderOptions(chunk_frames=8, i_frames=2)
N0, N1 = c.Chunk(c.ChunkKind.N, 0, 0, 8), c.Chunk(c.ChunkKind.N, 1, 8, 8)


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/db.sqlite"
        migrate(url)
        yield make_sessionmaker(make_engine(url))
        return
    with postgres_database() as url:
        migrate(url)
        engine = make_engine(url)
        yield make_sessionmaker(engine)
        engine.dispose()


@pytest.fixture
def proxy(s3_server: S3Server) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(s3_server.endpoint_url) as running:
        yield running


@pytest.fixture
def nodes(sessions: sessionmaker[Any], proxy: S3FaultProxy, s3_server: S3Server) -> tuple[NodeActivities, ...]:
    """Nodes a and b over one database and one bucket (reached through the proxy, which logs every request), and a
    session whose inputs are stored."""
    bucket = f"t-{uuid.uuid4().hex[:16]}"
    s3_server.client().create_bucket(Bucket=bucket)
    store = S3Store(bucket=bucket, client=dataclasses.replace(s3_server, endpoint_url=proxy.url).client())
    stored_session(sessions, store)
    return tuple(NodeActivities(store=store, sessions=sessions, node_id=node) for node in ("a", "b"))


def _run(fn: Any, *args: Any) -> Any:
    return ActivityEnvironment().run(fn, *args)


def _init(node: NodeActivities, lease: int) -> None:
    _run(node.init_session, c.InitSessionInput(session_id="s", node_id="", options=OPTIONS, lease=lease))


def _chunk(node: NodeActivities, chunk: c.Chunk, lease: int) -> c.GenerateChunkResult:
    request = c.GenerateChunkInput(session_id="s", node_id="", options=OPTIONS, chunk=chunk, lease=lease)
    result: c.GenerateChunkResult = _run(node.generate_chunk, request)
    return result


def _fenced(call: Any) -> None:
    with pytest.raises(ApplicationError) as raised:
        call()
    assert raised.value.type == c.LEASE_FENCED and raised.value.non_retryable


def test_a_node_back_from_a_partition_writes_nothing(
    nodes: tuple[NodeActivities, ...], sessions: sessionmaker[Any], proxy: S3FaultProxy
) -> None:
    a, b = nodes
    _init(a, lease=1)
    _chunk(a, N0, lease=1)
    # a is cut off; its lease times out and the session moves to b under lease 2, which makes N1.
    _init(b, lease=2)
    made = _chunk(b, N1, lease=2)
    puts_before = len(proxy.exchanges)
    # a comes back with what it was doing: N1 again, and (a retry) its claim.
    _fenced(lambda: _chunk(a, N1, lease=1))
    _fenced(lambda: _init(a, lease=1))
    finalize = c.FinalizeInput(session_id="s", node_id="", options=OPTIONS, frames=16, lease=1)
    _fenced(lambda: _run(a.finalize, finalize))
    assert [exchange.method for exchange in proxy.exchanges[puts_before:] if exchange.method == "PUT"] == []
    with sessions() as db:
        row = db.get(SessionRow, "s")
        chunk = db.get(ChunkRow, ("s", c.ChunkKind.N, 1))
        assert row is not None and (row.node_id, row.lease, row.status) == ("b", 2, c.SessionStatus.RUNNING)
        assert chunk is not None and (chunk.node_id, chunk.frames_sha256) == ("b", made.frames_sha256)
        checkpoint = repo.get_checkpoint(db, session_id="s", index=1)
        assert checkpoint is not None and checkpoint.key == keys.checkpoint("s", 1, lease=2)
    assert double_publishes(proxy.exchanges) == []


def test_the_partition_check_catches_a_double_publish_when_the_fence_fails(
    nodes: tuple[NodeActivities, ...], proxy: S3FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = nodes
    _init(a, lease=1)
    _init(b, lease=2)
    _chunk(b, N0, lease=2)
    assert double_publishes(proxy.exchanges) == []
    # The fence fails once: no lease check, and published objects written over whatever is there.
    monkeypatch.setattr(fence, "hold", lambda *args, **kwargs: None)
    monkeypatch.setattr(S3Store, "put_once", lambda self, key, data, **kwargs: self.put(key, data) or True)
    _chunk(a, N0, lease=1)
    assert double_publishes(proxy.exchanges) == [f"/{_bucket(a)}/{keys.segment('s', c.ChunkKind.N, 0)} stored 2 times"]


def test_a_lease_claims_a_session_only_if_none_newer_has(sessions: sessionmaker[Any]) -> None:
    with sessions() as db:
        repo.create_session(
            db, session_id="s", tenant="t", options={}, workflow_id="w", audio_seconds=1.0, width=8, height=8
        )
    with sessions() as db:
        assert repo.set_node(db, session_id="s", node_id="b", lease=3) is None
        assert repo.set_node(db, session_id="s", node_id="b", lease=3) == "b"  # a retried claim of the same lease
        with pytest.raises(LeaseFenced) as fenced:
            repo.set_node(db, session_id="s", node_id="a", lease=2)
        assert fenced.value.newest == 3  # what a workflow that numbered its leases too low counts on from
        fence.hold(db, session_id="s", lease=0)  # unfenced (sessions from before fencing): always passes
        repo.set_node(db, session_id="s", node_id="a", lease=0)
        db.commit()
    with sessions() as db:
        row = db.get(SessionRow, "s")
        assert row is not None and row.lease == 3


def _bucket(node: NodeActivities) -> str:
    store = node._store
    assert isinstance(store, S3Store)
    return store._bucket
