"""A session's data lifecycle: removing its objects when it is deleted (`DELETE /v1/renders/{id}`, through
`api/deletion.py`) or when retention is due (`activities/retention.py`). Portraits and voices are personal data.

What is removed is named by `keys`: everything under the session's own prefix in our store, and, on a delete, what
its S3 sinks wrote under `<sink prefix>/<session id>/` (a sink writes nothing else there). Nothing outside those
prefixes is ever listed or touched; Kinesis Video streams are left alone (a stream holds other sessions' fragments
too and ages them out by its own retention). Blocking (storage and database calls): run on a thread."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import botocore.exceptions as bce
import structlog
from sqlalchemy.orm import sessionmaker

from monologue import contracts as c, keys, repo
from monologue.contracts.retention import DataPart
from monologue.errors import SinkObjectsKept
from monologue.repo import lifecycle as repo_lifecycle
from monologue.s3_presign import s3_client, sink_base_key
from monologue.storage import DELETE_BATCH, ObjectStore

log = structlog.get_logger("monologue.lifecycle")

SinkClient = Callable[..., Any]  # `s3_client(endpoint_url=..., region=...)`: tests pass one signed for their server


def remove_part(store: ObjectStore, session_id: str, part: DataPart) -> int:
    """Delete one part of a session's objects (`keys.part_prefixes`); the number deleted."""
    return sum(store.delete_prefix(prefix) for prefix in keys.part_prefixes(session_id, part))


def remove_sink_copies(options: dict[str, Any], session_id: str, *, sink_client: SinkClient = s3_client) -> int:
    """Delete what the session's S3 sinks wrote (each under `<prefix>/<session id>/` in its bucket); the number
    deleted. SinkObjectsKept, naming the sink, when its bucket refuses (the credentials may lack s3:DeleteObject)."""
    removed = 0
    for sink in c.render_options(options).sinks:
        if not isinstance(sink, c.S3Sink):
            continue
        base = sink_base_key(sink.prefix, session_id)
        client = sink_client(endpoint_url=sink.endpoint_url, region=sink.region)
        try:
            removed += _delete_under(client, sink.bucket, base)
        except (bce.BotoCoreError, bce.ClientError, SinkObjectsKept) as err:
            raise SinkObjectsKept(f"the {sink.label} sink's objects at s3://{sink.bucket}/{base} stay: {err}") from err
    return removed


def _delete_under(client: Any, bucket: str, prefix: str) -> int:
    keys_found = [
        str(item["Key"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
    ]
    for start in range(0, len(keys_found), DELETE_BATCH):
        batch = [{"Key": key} for key in keys_found[start : start + DELETE_BATCH]]
        answer = client.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        if errors := answer.get("Errors"):
            first = errors[0]
            raise SinkObjectsKept(f"{len(errors)} objects refused, e.g. {first.get('Key')!r}: {first.get('Code')}")
    return len(keys_found)


def delete_session(
    sessions: sessionmaker[Any], store: ObjectStore, session_id: str, *, sink_client: SinkClient = s3_client
) -> int:
    """Remove every object of a session whose workflow has ended, and keep its tombstone; the number of objects
    deleted. Marked deleted (and fenced) first, so a failure half-way leaves a tombstone that the next call finishes;
    a session already purged is left as it is (0)."""
    with sessions() as db:
        repo_lifecycle.mark_deleted(db, session_id=session_id)
        row = repo.get_session(db, session_id=session_id)
    if row is None or repo_lifecycle.purged(row):
        return 0
    removed = store.delete_prefix(keys.session_prefix(session_id))
    removed += remove_sink_copies(row.options, session_id, sink_client=sink_client)
    with sessions() as db:
        repo_lifecycle.keep_tombstone(db, session_id=session_id)
    log.info("session deleted", session_id=session_id, objects=removed)
    return removed


def clear_due(
    sessions: sessionmaker[Any],
    store: ObjectStore,
    *,
    part: DataPart,
    ended_before: datetime,
    batch: int,
    progress: Callable[[str], None] = lambda _session_id: None,
) -> tuple[int, int]:
    """Remove `part` of at most `batch` sessions that ended before `ended_before` (UTC), marking each row once its
    objects are gone, and calling `progress` after each (the activity heartbeats there). (sessions, objects)."""
    with sessions() as db:
        due = [row.id for row in repo_lifecycle.due(db, part=part, ended_before=ended_before, limit=batch)]
    objects = 0
    for session_id in due:
        objects += remove_part(store, session_id, part)
        with sessions() as db:
            repo_lifecycle.mark_removed(db, session_id=session_id, part=part)
        progress(session_id)
    if due:
        log.info("retention applied", part=part, sessions=len(due), objects=objects)
    return len(due), objects


def expire_assets(
    store: ObjectStore, *, uploaded_before: float, batch: int, progress: Callable[[str], None] = lambda _key: None
) -> tuple[int, int]:
    """Remove at most `batch` uploaded assets older than `uploaded_before` (Unix seconds, read from their ids:
    `keys.asset_uploaded_s`), oldest first, calling `progress` after each. (assets, objects)."""
    prefixes = {key.rsplit("/", 1)[0] + "/" for key in store.list(keys.ASSETS)}  # assets/<tenant>/<id>/
    aged = sorted((keys.asset_uploaded_s(prefix.rstrip("/").rsplit("/", 1)[1]), prefix) for prefix in prefixes)
    due = [prefix for uploaded, prefix in aged if uploaded < uploaded_before][:batch]
    objects = 0
    for prefix in due:
        objects += store.delete_prefix(prefix)
        progress(prefix)
    if due:
        log.info("retention applied", part="assets", assets=len(due), objects=objects)
    return len(due), objects
