"""Activities pinned to one node (queue `node-<id>`): set a session up, generate its chunks through the
Pipeline, and assemble the final video.

This module strings the node's rooms together in the order a chunk needs them; each idea lives in its own:
- `chunk_order.py`: the chunks the workflow keeps scheduled ahead wait their turn here;
- `pipelines.py`: each family's pipeline, loaded once, and the slot that lets one chunk at a time through;
- `session_cache.py`: each session's pipeline state (reference conditioning, anchors), rebuilt from storage
  when missing, so any chunk can run on any node and give the same frames;
- `checkpoints.py`: the anchors written after every N chunk, and read back on a node that lacks them;
- `heartbeat.py`: the pipeline's progress reports become Temporal heartbeats, so a hung node is noticed
  within the heartbeat timeout; the node's known long steps (loads) beat from a helper thread, up to a limit;
- `warm_up.py`: the throwaway session a node runs before it takes any (node/warm.py);
- `fault_injection.py`: the tests' slow and hung chunks.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import sessionmaker
from temporalio import activity

from activities.checkpoints import Checkpoints
from activities.chunk_order import ChunkOrder
from activities.errors import activity_context
from activities.fault_injection import Faults
from activities.frame_tap import FrameTap, TeeSink, chunk_speech
from activities.heartbeat import ChunkHeartbeat
from activities.pipelines import Pipelines, node_pipeline
from activities.playlist import write_playlist
from activities.session_cache import SessionCache
from gpu_worker.pipeline import ChunkRequest, Pipeline
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.publish import SegmentWriter, StreamFormat, concat, init_segment
from monologue import contracts as c, keys, metrics, repo
from monologue.live_audio import LiveAudio
from monologue.plan import chunk_sizes, plan_timeline
from monologue.repo import fence
from monologue.storage import ObjectStore, on_retry


def stream_format(session: Session) -> StreamFormat:
    return StreamFormat(width=session.frame_width, height=session.frame_height, fps=session.output.fps)


@dataclass
class MadeChunk:
    """A chunk's output before it is stored: its segment, per-frame hashes and timings."""

    segment: bytes
    frame_hashes: list[str]
    stage_ms: dict[str, float]
    checkpoint_key: str | None


class NodeActivities:
    def __init__(
        self,
        *,
        store: ObjectStore,
        sessions: sessionmaker[Any],
        node_id: str,
        pipeline_factory: Callable[[c.Family], Pipeline] | None = None,
        faults: Faults | None = None,
        scratch_dir: Path | None = None,
    ) -> None:
        """`pipeline_factory` builds a family's pipeline (a multi-GPU node's runs on every rank);
        `faults` are the tests' (never set in production); `scratch_dir` holds the node's temporary files (the final
        MP4 being assembled; None: the system's temporary folder), on a disk `activities/disks.py` watches."""
        self._store = store
        self._scratch_dir = scratch_dir
        self._sessions = sessions
        self._node_id = node_id
        self._faults = faults or Faults()
        self._pipelines = Pipelines(pipeline_factory or node_pipeline)
        self._cache = SessionCache(store=store, pipelines=self._pipelines, faults=self._faults)
        self._checkpoints = Checkpoints(store=store, sessions=sessions)
        self._order = ChunkOrder()
        self.frame_tap: FrameTap | None = None  # a live WebRTC session's frames, also to its viewers (node/webrtc/)

    @property
    def pipelines(self) -> Pipelines:
        """The node's family pipelines (warmed before the node takes a session: node/warm.py)."""
        return self._pipelines

    @property
    def chunks_done(self) -> int:
        """Chunks generated since the node started (for the node registry)."""
        return self._order.chunks_done

    @activity.defn(name=c.INIT_SESSION)
    def init_session(self, request: c.InitSessionInput) -> c.InitSessionResult:
        """Encode the reference once and write the stream's init segment."""
        with (
            activity_context(session_id=request.session_id, node_id=self._node_id) as log,
            on_retry(activity.heartbeat),  # waiting for storage (bounded by its retry time) is not hanging
        ):
            slot = self._pipelines.slot(request.options.family)
            with slot.hold("init_session"):
                progress = ChunkHeartbeat("init_session", on_report=slot.touch)
                session = self._cache.get(request.session_id, request.options, request.session_kind, progress=progress)
            with self._sessions() as db:  # the claim comes first: a stale lease writes nothing (c.FENCING)
                previous = repo.set_node(db, session_id=request.session_id, node_id=self._node_id, lease=request.lease)
            self._store.put_once(
                keys.init_segment(request.session_id), init_segment(stream_format(session)), content_type="video/mp4"
            )
            if previous is not None and previous != self._node_id:
                metrics.NODE_CHANGES.inc()
            if self.frame_tap is not None and _webrtc_live(request.session_kind, request.options):
                self.frame_tap.session_started(request.session_id, request.options.fps)
            log.info(
                "session initialised",
                family=request.options.family,
                width=session.frame_width,
                height=session.frame_height,
            )
            return c.InitSessionResult(width=session.frame_width, height=session.frame_height)

    @activity.defn(name=c.GENERATE_CHUNK)
    def generate_chunk(self, request: c.GenerateChunkInput) -> c.GenerateChunkResult:
        """Run the pipeline for one chunk, in its turn; its frames become one fMP4 segment."""
        chunk = ChunkRequest.of(request.chunk, request.options)
        with (
            activity_context(session_id=request.session_id, node_id=self._node_id, chunk=chunk.name) as log,
            on_retry(activity.heartbeat),
        ):
            idle_ms = self._order.wait_turn(request)
            self._faults.stretch(chunk.name)
            made = self._make(request, chunk)
            if idle_ms is not None:
                made.stage_ms["idle_before"] = idle_ms
            segment_key, digest = self._store_chunk(request, chunk, made)
            self._order.finish(request)
            _observe_chunk(request, made)
            log.info(
                "chunk done",
                frames=request.chunk.n_frames,
                bytes=len(made.segment),
                **{f"{name}_ms": round(ms, 1) for name, ms in made.stage_ms.items()},
            )
            return c.GenerateChunkResult(
                segment_key=segment_key,
                frames=request.chunk.n_frames,
                frames_sha256=digest,
                stage_ms=made.stage_ms,
                checkpoint_key=made.checkpoint_key,
            )

    @activity.defn(name=c.FINALIZE)
    def finalize(self, request: c.FinalizeInput) -> c.FinalizeResult:
        """The final MP4 is the init segment plus every fragment in timeline order: no re-encoding."""
        with (
            activity_context(session_id=request.session_id, node_id=self._node_id) as log,
            on_retry(activity.heartbeat),
        ):
            # A node cut off and back stops here (c.FENCING); what it wrote before stands.
            fence.check(self._sessions, session_id=request.session_id, lease=request.lease)
            sid, options = request.session_id, request.options
            timeline = plan_timeline(request.frames, **chunk_sizes(options))
            manifest: list[str] = []
            for spec in timeline:
                hashes = json.loads(self._store.get(keys.frame_hashes(sid, spec.kind, spec.index)))
                manifest.extend(
                    json.dumps({"frame": spec.first_frame + offset, "sha256": digest})
                    for offset, digest in enumerate(hashes)
                )
            with tempfile.TemporaryDirectory(prefix="monologue-final-", dir=self._scratch_dir) as scratch:
                folder = Path(scratch)
                init_path = folder / "init.mp4"
                self._store.get_file(keys.init_segment(sid), init_path)

                def segments() -> Iterator[Path]:
                    for spec in timeline:  # one fragment on disk at a time: flat memory and disk
                        path = folder / "segment.m4s"
                        self._store.get_file(keys.segment(sid, spec.kind, spec.index), path)
                        activity.heartbeat(spec.name)
                        yield path

                final_path = folder / "final.mp4"
                concat(init_path, segments(), final_path)
                video_key, size = keys.final_video(sid), final_path.stat().st_size
                self._store.put_file(video_key, final_path, content_type="video/mp4")
            # Finalize is safe to repeat on another node: it only reads what the chunks stored and overwrites
            # its outputs whole (atomic puts), so a node killed anywhere in here leaves nothing to clean up.
            self._faults.pause_finalize(sid)
            self._store.put(
                keys.frames_manifest(sid), ("\n".join(manifest) + "\n").encode(), content_type="application/x-ndjson"
            )
            write_playlist(self._store, sid, options, request.frames, request.frames, ended=True)
            with self._sessions() as db:
                completed = repo.mark_completed(
                    db,
                    session_id=sid,
                    video_key=video_key,
                    frames=request.frames,
                    chunks=len(timeline),
                    lease=request.lease,
                )
                row = repo.get_session(db, session_id=sid)
            if not completed:  # its workflow ended it first (a finalize outliving a lost lease): that stands
                log.warning("session had already ended; the video is stored but not linked")
            elif row is not None and row.kind == c.SessionKind.RENDER and row.started_at and row.finished_at:
                wall_s = (row.finished_at - row.started_at).total_seconds()
                if wall_s > 0:
                    metrics.REALTIME_RATIO.labels(family=options.family.value).observe(
                        request.frames / options.fps / wall_s
                    )
            self._cache.drop(sid)
            self._order.forget(sid)
            if self.frame_tap is not None:
                self.frame_tap.session_ended(sid)
            log.info("session completed", frames=request.frames, bytes=size)
            return c.FinalizeResult(video_key=video_key, size_bytes=size)

    def _make(self, request: c.GenerateChunkInput, chunk: ChunkRequest) -> MadeChunk:
        """Run the stages holding the family's pipeline slot, heartbeating from their progress; then encode
        the frames into a segment."""
        family = request.options.family
        pipeline, slot = self._pipelines.get(family), self._pipelines.slot(family)
        heartbeat = ChunkHeartbeat(chunk.name, on_report=slot.touch)
        # A storage retry inside the slot (the checkpoint) reports as progress, so chunks queued behind it live on.
        with slot.hold(chunk.name), on_retry(heartbeat):
            session = self._cache.get(request.session_id, request.options, request.session_kind, progress=heartbeat)
            if isinstance(session.audio, LiveAudio):
                session.audio.update(request.audio_samples, request.audio_ended)
            self._checkpoints.ensure_anchors(request, session, heartbeat)
            self._faults.hang(chunk.name)
            writer = SegmentWriter(stream_format(session), first_frame=request.chunk.first_frame, audio=session.audio)
            tee = TeeSink(writer) if self._tapped(request) else None
            result = pipeline.run_chunk(session, chunk, tee or writer, heartbeat)
            if tee is not None and self.frame_tap is not None:
                first, fps = request.chunk.first_frame, session.output.fps
                speech = chunk_speech(session.audio, first, request.chunk.n_frames, fps)
                self.frame_tap.chunk_made(request.session_id, first, np.concatenate(tee.frames), speech, fps)
                tee.release()  # the segment's frames, now that the viewers have them
                # The writer takes its write time out of decode_publish; these writes ran after it, so put it back.
                result.stage_ms["decode_publish"] += writer.write_seconds * 1000
            checkpoint_key, checkpoint_ms = self._checkpoint(request, session, heartbeat)
        heartbeat("encoding")
        segment = writer.finish()
        stage_ms = writer.stage_ms(result.stage_ms)
        if checkpoint_key is not None:
            stage_ms["checkpoint"] = checkpoint_ms
        return MadeChunk(segment, result.frame_hashes, stage_ms, checkpoint_key)

    def _tapped(self, request: c.GenerateChunkInput) -> bool:
        """Whether this chunk's frames also go to the session's WebRTC viewers."""
        return self.frame_tap is not None and _webrtc_live(request.session_kind, request.options)

    def _checkpoint(
        self, request: c.GenerateChunkInput, session: Session, heartbeat: ChunkHeartbeat
    ) -> tuple[str | None, float]:
        """After an N chunk: its anchors to storage (key, ms); I chunks leave none."""
        if request.chunk.kind != c.ChunkKind.N:
            return None, 0.0
        heartbeat("checkpoint")
        started = time.perf_counter()
        key = self._checkpoints.write(request, session)
        return key, (time.perf_counter() - started) * 1000

    def _store_chunk(self, request: c.GenerateChunkInput, chunk: ChunkRequest, made: MadeChunk) -> tuple[str, str]:
        """The segment and its frame hashes to storage, the chunk's row to the database: (segment key, SHA-256
        over the frame hashes)."""
        activity.heartbeat(f"{chunk.name} storing")
        fence.check(self._sessions, session_id=request.session_id, lease=request.lease)  # c.FENCING
        # Published objects are created once (c.FENCING): a chunk made again (a moved session, a stale node back)
        # has the same bytes, and the first copy stored stands; the database write below is the fenced one.
        segment_key = keys.segment(request.session_id, chunk.kind, chunk.index)
        self._store.put_once(segment_key, made.segment, content_type="video/iso.segment")
        self._store.put_once(
            keys.frame_hashes(request.session_id, chunk.kind, chunk.index),
            json.dumps(made.frame_hashes).encode(),
            content_type="application/json",
        )
        digest = hashlib.sha256("".join(made.frame_hashes).encode()).hexdigest()
        with self._sessions() as db:
            ttff_ms = repo.record_chunk(
                db,
                session_id=request.session_id,
                kind=c.ChunkKind(chunk.kind),
                index=chunk.index,
                first_frame=chunk.first_frame,
                frames=chunk.n_frames,
                node_id=self._node_id,
                attempt=activity.info().attempt,
                stage_ms=made.stage_ms,
                segment_key=segment_key,
                frames_sha256=digest,
                audio_ready_ms=request.audio_ready_ms,
                lease=request.lease,
            )
        if ttff_ms is not None:
            metrics.TTFF.labels(kind=request.session_kind.value).observe(ttff_ms / 1000)
        return segment_key, digest


def _observe_chunk(request: c.GenerateChunkInput, made: MadeChunk) -> None:
    """A finished chunk's figures for Prometheus: its stage times, and whether it was a retry."""
    family = request.options.family.value
    metrics.observe_stages(family, made.stage_ms)
    metrics.CHUNKS.labels(family=family, kind=str(request.chunk.kind)).inc()
    if "checkpoint" in made.stage_ms:
        metrics.CHECKPOINT_WRITE.observe(made.stage_ms["checkpoint"] / 1000)
    if activity.info().attempt > 1:
        metrics.CHUNK_RETRIES.labels(family=family).inc()


def _webrtc_live(kind: c.SessionKind, options: c.RenderOptions) -> bool:
    """A live session delivered over WebRTC: its frames go to the node's media hub as well."""
    return kind == c.SessionKind.LIVE and options.delivery == c.Delivery.WEBRTC
