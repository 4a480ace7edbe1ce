"""Sink pumps: one long-running activity per session and sink (S3, Kinesis Video Streams) that feeds the
sink every segment of the session's stream, in timeline order, from what is stored.

The session's own HLS playlist in storage is the pump's source of truth: it lists exactly the segments
that are published, in timeline order, and gets its ENDLIST when the session ends. So a pump needs no
signals and never touches generation: a slow or failing sink delays only itself. It heartbeats the
number of segments the sink has acknowledged and records it in the `sinks` table; a retried or resumed
pump (after a crash, a sink error, or the workflow continuing as new) starts from there, re-reading the
segments from storage, so nothing is lost and, for sinks that acknowledge durably, nothing repeats.

Pumps run on their own queue (`<shared>-sinks`), so sessions that stream for hours never take the
shared queue's slots. Before it writes anything a pump checks its sink against the node's allow-lists for
the session's tenant (`monologue.sink_policy`): the operator may have removed the entry since the session
started, and the node's credentials must not follow a stale promise. A refused sink fails for good.
"""

from __future__ import annotations

import re
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from activities.errors import activity_context
from gpu_worker.publish.sinks import Sink, SinkError
from monologue import contracts as c, keys, metrics, repo
from monologue.errors import NotFound
from monologue.repo import sinks as repo_sinks
from monologue.schemas import SinkState
from monologue.settings import SinkSettings
from monologue.sink_policy import SinkRefused, for_tenant, refusal
from monologue.storage import ObjectStore, on_retry

POLL_S = 0.2
_EXTINF = re.compile(r"^#EXTINF:([0-9.]+),")

SinkFactory = Callable[[c.Sink, str, c.RenderOptions, int, SinkSettings], Sink]


def build_sink(spec: c.Sink, session_id: str, options: c.RenderOptions, origin_ms: int, allowed: SinkSettings) -> Sink:
    """The sink a spec describes (imports its client library only when used). `origin_ms`: the session's
    creation time (epoch ms), the producer timestamp of its first frame, the same for every pump. `allowed`:
    the tenant's allow-lists (the spec itself is already checked; the KVS sink checks its data endpoint)."""
    longest = max(options.chunk_frames, options.i_frames) / options.fps
    if isinstance(spec, c.S3Sink):
        from gpu_worker.publish.s3_sink import S3Sink

        return S3Sink(
            session_id=session_id,
            bucket=spec.bucket,
            prefix=spec.prefix,
            endpoint_url=spec.endpoint_url,
            region=spec.region,
            target_duration=longest,
            name=spec.label,
        )
    if isinstance(spec, c.KvsSink):
        from gpu_worker.publish.kvs import KinesisVideoSink

        sink: Sink = KinesisVideoSink(
            spec.stream_name,
            region=spec.region or "us-east-1",
            allowed=allowed,
            endpoint_url=spec.endpoint_url,
            producer_start_ms=origin_ms,
        )
        sink.name = spec.label
        return sink
    raise ApplicationError(f"unknown sink type {spec.type!r}", non_retryable=True)


@dataclass
class StoredStream:
    """The session's published stream as its stored playlist says: segment names and durations, in order."""

    names: list[str]
    durations: list[float]
    ended: bool


def read_stream(store: ObjectStore, session_id: str) -> StoredStream:
    try:
        text = store.get(keys.playlist(session_id)).decode()
    except NotFound:
        return StoredStream([], [], False)
    names, durations, pending = [], [], None
    for line in text.splitlines():
        match = _EXTINF.match(line)
        if match:
            pending = float(match.group(1))
        elif line and not line.startswith("#") and pending is not None:
            names.append(line)
            durations.append(pending)
            pending = None
    return StoredStream(names, durations, "#EXT-X-ENDLIST" in text)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)  # SQLite drops the zone


def _heartbeating(step: Callable[[], None], sink: Sink) -> None:
    """Run a blocking sink step (a flush can wait minutes for acknowledgements) while heartbeating."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as err:  # handed to the activity thread below
            failure.append(err)

    worker = threading.Thread(target=run, name="sink-flush", daemon=True)
    worker.start()
    while worker.is_alive():
        activity.heartbeat(sink.acknowledged())
        worker.join(timeout=1.0)
    if failure:
        raise failure[0]


def _heartbeat(acknowledged: int) -> None:
    """Heartbeat, and raise the workflow's cancel here, where the pump hands over (see `run_sink`)."""
    activity.heartbeat(acknowledged)
    if activity.is_cancelled():
        raise CancelledError("the workflow cancelled the sink pump")


class SinkActivities:
    def __init__(
        self,
        *,
        store: ObjectStore,
        sessions: sessionmaker[Any],
        allowed: SinkSettings,
        factory: SinkFactory = build_sink,
        poll_s: float = POLL_S,
        scratch_dir: Path | None = None,
    ) -> None:
        """`scratch_dir`: where the final video is copied before a sink takes it (None: the system's temporary
        folder); the node's scratch disk, which activities/disks.py watches."""
        self._store = store
        self._scratch_dir = scratch_dir
        self._sessions = sessions
        self._allowed = allowed  # the node's MONOLOGUE_SINKS__*, read at each pump's start
        self._factory = factory
        self._poll_s = poll_s
        self._lags: dict[tuple[str, str], tuple[str, int]] = {}  # (session, sink) → (type, segments behind)
        self._lags_lock = threading.Lock()

    def _set_lag(self, session_id: str, spec: c.Sink, lag: int | None) -> None:
        """This pump's lag (None: it stopped) and the sink type's total over this node's pumps."""
        with self._lags_lock:
            if lag is None:
                self._lags.pop((session_id, spec.label), None)
            else:
                self._lags[(session_id, spec.label)] = (spec.type, lag)
            total = sum(behind for kind, behind in self._lags.values() if kind == spec.type)
        metrics.SINK_LAG.labels(sink=spec.type).set(total)

    @activity.defn(name=c.RUN_SINK)
    def run_sink(self, request: c.RunSinkInput) -> c.RunSinkResult:
        """Feed the sink until the stream ends (or the workflow cancels the pump to continue as new)."""
        # Temporal cancels a thread activity by raising into it wherever it is; an `except Exception` in boto3,
        # SQLAlchemy or a sink swallowed that now and then, the pump ran on and the workflow, waiting for it to
        # hand over before continuing as new, hung. Shielded, the cancel is raised only where `_heartbeat` checks.
        with activity.shield_thread_cancel_exception():
            return self._pump(request)

    def _pump(self, request: c.RunSinkInput) -> c.RunSinkResult:
        spec, sid = request.sink, request.session_id
        with activity_context(session_id=sid, sink=spec.label) as log:
            start, origin_ms, tenant = self._resume_point(sid, spec)
            allowed = self._tenant_allowed(sid, spec, tenant, start)
            init_segment = self._wait_for(keys.init_segment(sid))  # cancelled here: no sink to hand over
            sink = self._factory(spec, sid, request.options, origin_ms, allowed)
            try:
                sink.start(init_segment, start)
                self._record(sid, spec, SinkState.STREAMING, sink.acknowledged())
                # Waiting for storage (bounded by its retry time) heartbeats the count a retry would resume from.
                with on_retry(lambda _what: activity.heartbeat(sink.acknowledged())):
                    self._follow(sid, spec, sink, start)
                    self._put_final(sid, sink)
                _heartbeating(lambda: sink.finish(ended=True), sink)
                acknowledged = sink.acknowledged()
                self._record(sid, spec, SinkState.DONE, acknowledged)
                log.info("sink done", segments=acknowledged)
                return c.RunSinkResult(acknowledged=acknowledged)
            except CancelledError:
                # The workflow continues as new (or stopped): hand over cleanly; the next pump resumes here.
                try:
                    _heartbeating(lambda: sink.finish(ended=False), sink)
                except SinkError as err:
                    log.warning("sink finish on cancel failed", error=str(err))
                self._record(sid, spec, SinkState.STREAMING, sink.acknowledged())
                raise
            except SinkError as err:
                metrics.SINK_FAILURES.labels(sink=spec.type).inc()
                attempt = activity.info().attempt
                status = SinkState.FAILED if attempt >= c.SINK_ATTEMPTS else SinkState.RETRYING
                self._record(sid, spec, status, sink.acknowledged(), error=f"attempt {attempt}: {err}")
                log.warning("sink failed; the pump retries from what is stored", error=str(err))
                raise ApplicationError(str(err), type="SinkError") from err
            except SinkRefused as err:  # the KVS sink's data endpoint; activity_context makes it final
                metrics.SINK_FAILURES.labels(sink=spec.type).inc()
                self._record(sid, spec, SinkState.FAILED, sink.acknowledged(), error=str(err))
                raise
            finally:
                self._set_lag(sid, spec, None)
                sink.close()

    def _follow(self, sid: str, spec: c.Sink, sink: Sink, index: int) -> None:
        """Hand the sink every segment of the stored playlist from `index` on, and its playlist, until it ends."""
        shown: tuple[int, bool] | None = None
        while True:
            stream = read_stream(self._store, sid)
            while index < len(stream.names):
                sink.put(index, self._store.get(keys.output(sid, stream.names[index])))
                index += 1
                _heartbeat(sink.acknowledged())
            self._set_lag(sid, spec, len(stream.names) - sink.acknowledged())
            if (index, stream.ended) != shown:
                sink.playlist(stream.durations[:index], ended=stream.ended)
                self._record(sid, spec, SinkState.STREAMING, sink.acknowledged())
                shown = (index, stream.ended)
            if stream.ended and index == len(stream.names):
                return
            _heartbeat(sink.acknowledged())
            time.sleep(self._poll_s)

    def _resume_point(self, session_id: str, spec: c.Sink) -> tuple[int, int, str | None]:
        """Segments the sink already holds (from this attempt's last heartbeat, or the last pump's record),
        the session's creation time in epoch ms (its streams' time origin) and its tenant (None: no session)."""
        details = activity.info().heartbeat_details
        from_heartbeat = int(details[0]) if details else 0
        with self._sessions() as db:
            row = repo_sinks.get_sink(db, session_id=session_id, name=spec.label)
            session = repo.get_session(db, session_id=session_id)
            created = session.created_at if session is not None else None
            tenant = session.tenant if session is not None else None
        origin_ms = int(_aware(created).timestamp() * 1000) if created is not None else 0
        return max(from_heartbeat, row.acknowledged if row is not None else 0), origin_ms, tenant

    def _tenant_allowed(self, session_id: str, spec: c.Sink, tenant: str | None, acknowledged: int) -> SinkSettings:
        """The tenant's allow-lists, once the spec is checked against them; a refused sink is recorded `failed`
        and raises SinkRefused (final: retrying would not change the settings)."""
        if tenant is None:
            problem = f"sink {spec.label!r}: session {session_id} has no record, so its tenant is unknown"
            raise self._refused(session_id, spec, acknowledged, problem)
        reason = refusal(spec, tenant=tenant, allowed=self._allowed)
        if reason is not None:
            raise self._refused(session_id, spec, acknowledged, reason)
        return for_tenant(self._allowed, tenant)

    def _refused(self, session_id: str, spec: c.Sink, acknowledged: int, problem: str) -> SinkRefused:
        self._record(session_id, spec, SinkState.FAILED, acknowledged, error=f"{problem}; nothing more is sent")
        return SinkRefused(problem)

    def _wait_for(self, key: str) -> bytes:
        while True:
            try:
                return self._store.get(key)
            except NotFound:
                _heartbeat(0)
                time.sleep(self._poll_s)

    def _put_final(self, session_id: str, sink: Sink) -> None:
        if not self._store.exists(keys.final_video(session_id)):
            return  # cancelled or failed: no final video
        with tempfile.TemporaryDirectory(prefix="monologue-sink-", dir=self._scratch_dir) as scratch:
            path = Path(scratch) / "final.mp4"
            self._store.get_file(keys.final_video(session_id), path)
            sink.put_final(path)

    def _record(
        self, session_id: str, spec: c.Sink, status: SinkState, acknowledged: int, error: str | None = None
    ) -> None:
        with self._sessions() as db:
            repo_sinks.record_sink(
                db,
                session_id=session_id,
                name=spec.label,
                kind=c.SinkType(spec.type),
                status=status,
                acknowledged=acknowledged,
                error=error,
            )
