"""Activities pinned to one node (queue `node-<id>`): set a session up, generate its chunks through the
Pipeline, and assemble the final video.

The node caches each session's pipeline state (reference conditioning and anchors) between chunks.
Both are also written to object storage (the reference once, the anchors after every N chunk), so if
the cache is missing (the node restarted, or the session moved here) any chunk can be regenerated
from storage and gives the same frames.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors
from sqlalchemy.orm import sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from activities.errors import activity_context
from activities.playlist import write_playlist
from gpu_worker.models import build_family
from gpu_worker.pipeline import ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.types import AudioSource
from gpu_worker.publish import SegmentWriter, StreamFormat, concat, init_segment
from monologue import contracts as c
from monologue import keys, repo
from monologue.errors import NotFound
from monologue.live_audio import LiveAudio
from monologue.media import StoredWav, decode_png
from monologue.plan import chunk_sizes, plan_timeline
from monologue.storage import ObjectStore

CACHED_SESSIONS = 4


def output_spec(options: c.RenderOptions) -> OutputSpec:
    return OutputSpec(fps=options.fps, resolution=options.resolution, preview=options.preview)  # type: ignore[arg-type]


def stream_format(session: Session) -> StreamFormat:
    return StreamFormat(width=session.frame_width, height=session.frame_height, fps=session.output.fps)


class NodeActivities:
    def __init__(
        self,
        *,
        store: ObjectStore,
        sessions: sessionmaker[Any],
        node_id: str,
        chunk_delay_s: float = 0.0,
        pipeline_factory: Callable[[str], Pipeline] | None = None,
    ) -> None:
        """`pipeline_factory` builds a family's pipeline by name (a multi-GPU node's runs on every rank)."""
        self._pipeline_factory = pipeline_factory or (lambda family: Pipeline(build_family(family)))
        self._chunk_delay_s = chunk_delay_s
        self._store = store
        self._sessions = sessions
        self._node_id = node_id
        self._pipelines: dict[str, Pipeline] = {}
        self._cache: OrderedDict[str, Session] = OrderedDict()
        # The workflow keeps the next chunk scheduled while one runs; these put them back in order.
        self._order = threading.Condition()
        # Per workflow run (positions and epochs restart with each run): (epoch, last position done here,
        # when), and the newest epoch seen.
        self._finished: dict[str, tuple[int, int, float]] = {}
        self._epochs: dict[str, int] = {}
        self._running: dict[str, threading.Lock] = {}  # per family: one chunk in its pipeline at a time
        self.chunks_done = 0  # since the node started, for the node registry (guarded by _order)

    @activity.defn(name=c.INIT_SESSION)
    def init_session(self, request: c.InitSessionInput) -> c.InitSessionResult:
        """Encode the reference once and write the stream's init segment."""
        with activity_context(session_id=request.session_id, node_id=self._node_id) as log:
            session = self._session(request.session_id, request.options, live=request.live)
            self._store.put(
                keys.init_segment(request.session_id), init_segment(stream_format(session)), content_type="video/mp4"
            )
            with self._sessions() as db:
                repo.set_node(db, session_id=request.session_id, node_id=self._node_id)
            log.info(
                "session initialised",
                family=request.options.family,
                width=session.frame_width,
                height=session.frame_height,
            )
            return c.InitSessionResult(width=session.frame_width, height=session.frame_height)

    @activity.defn(name=c.GENERATE_CHUNK)
    def generate_chunk(self, request: c.GenerateChunkInput) -> c.GenerateChunkResult:
        """Run the pipeline for one chunk; its frames become one fMP4 segment."""
        chunk_name = f"{request.kind}{request.index}"
        with activity_context(session_id=request.session_id, node_id=self._node_id, chunk=chunk_name) as log:
            idle_ms = self._wait_turn(request)
            self._test_delay(chunk_name)
            chunk = ChunkRequest(
                "I" if request.kind == "I" else "N",
                request.index,
                request.first_frame,
                request.n_frames,
                request.options.seed,
                request.options.prompt,
            )
            pipeline = self._pipeline(request.options.family)
            # A family's modules reuse buffers and a session's anchors change as chunks run: one chunk at a
            # time goes through a pipeline (rendering is CPU-bound; threads would not speed it up anyway).
            with self._running[request.options.family]:
                session = self._session(request.session_id, request.options, live=request.live)
                if isinstance(session.audio, LiveAudio):
                    session.audio.update(request.audio_samples, request.audio_ended)
                self._ensure_anchors(request, session)
                writer = SegmentWriter(stream_format(session), first_frame=request.first_frame, audio=session.audio)
                result = pipeline.run_chunk(session, chunk, writer)
                checkpoint_started = time.perf_counter()
                checkpoint_key = self._write_checkpoint(request, session) if request.kind == "N" else None
                checkpoint_ms = (time.perf_counter() - checkpoint_started) * 1000
            activity.heartbeat(chunk_name)
            segment = writer.finish()
            stage_ms = writer.stage_ms(result.stage_ms)
            if idle_ms is not None:
                stage_ms["idle_before"] = idle_ms
            if checkpoint_key is not None:
                stage_ms["checkpoint"] = checkpoint_ms
            segment_key = keys.segment(request.session_id, request.kind, request.index)
            self._store.put(segment_key, segment, content_type="video/iso.segment")
            self._store.put(
                keys.frame_hashes(request.session_id, request.kind, request.index),
                json.dumps(result.frame_hashes).encode(),
                content_type="application/json",
            )
            digest = hashlib.sha256("".join(result.frame_hashes).encode()).hexdigest()
            with self._sessions() as db:
                repo.record_chunk(
                    db,
                    session_id=request.session_id,
                    kind=request.kind,
                    index=request.index,
                    first_frame=request.first_frame,
                    frames=request.n_frames,
                    node_id=self._node_id,
                    attempt=activity.info().attempt,
                    stage_ms=stage_ms,
                    segment_key=segment_key,
                    frames_sha256=digest,
                    audio_ready_ms=request.audio_ready_ms,
                )
            with self._order:
                self._finished[_run_key(request.session_id)] = (request.epoch, request.position, time.perf_counter())
                self.chunks_done += 1
                self._order.notify_all()
            log.info(
                "chunk done",
                frames=request.n_frames,
                bytes=len(segment),
                **{f"{name}_ms": round(ms, 1) for name, ms in stage_ms.items()},
            )
            return c.GenerateChunkResult(
                segment_key=segment_key,
                frames=request.n_frames,
                frames_sha256=digest,
                stage_ms=stage_ms,
                checkpoint_key=checkpoint_key,
            )

    @activity.defn(name=c.FINALIZE)
    def finalize(self, request: c.FinalizeInput) -> c.FinalizeResult:
        """The final MP4 is the init segment plus every fragment in timeline order: no re-encoding."""
        with activity_context(session_id=request.session_id, node_id=self._node_id) as log:
            sid, options = request.session_id, request.options
            timeline = plan_timeline(request.frames, **chunk_sizes(options))
            manifest: list[str] = []
            for spec in timeline:
                hashes = json.loads(self._store.get(keys.frame_hashes(sid, spec.kind, spec.index)))
                manifest.extend(
                    json.dumps({"frame": spec.first_frame + offset, "sha256": digest})
                    for offset, digest in enumerate(hashes)
                )
            with tempfile.TemporaryDirectory(prefix="monologue-final-") as scratch:
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
            self._store.put(
                keys.frames_manifest(sid), ("\n".join(manifest) + "\n").encode(), content_type="application/x-ndjson"
            )
            write_playlist(self._store, sid, options, request.frames, request.frames, ended=True)
            with self._sessions() as db:
                repo.mark_completed(
                    db, session_id=sid, video_key=video_key, frames=request.frames, chunks=len(timeline)
                )
            self._cache.pop(sid, None)
            with self._order:
                for run in [run for run in self._finished if run.startswith(f"{sid}/")]:
                    self._finished.pop(run, None)
                    self._epochs.pop(run, None)
            log.info("session completed", frames=request.frames, bytes=size)
            return c.FinalizeResult(video_key=video_key, size_bytes=size)

    def _wait_turn(self, request: c.GenerateChunkInput) -> float | None:
        """Block until the chunk scheduled before this one (same epoch) is done on this node; refuse a chunk
        from an abandoned epoch. Returns how long the node sat idle between that chunk and this one (ms)."""
        run = _run_key(request.session_id)
        with self._order:
            self._epochs[run] = max(self._epochs.get(run, 0), request.epoch)
            while True:
                if request.epoch < self._epochs[run]:
                    raise CancelledError(f"chunk {request.kind}{request.index} was abandoned (epoch {request.epoch})")
                epoch, position, _ = self._finished.get(run, (-1, -1, 0.0))
                if request.wait_for is None or (epoch == request.epoch and position >= request.wait_for):
                    break
                activity.heartbeat("waiting for the previous chunk")
                if activity.is_cancelled():
                    raise CancelledError(f"chunk {request.kind}{request.index} cancelled while waiting its turn")
                self._order.wait(timeout=0.2)
            previous = self._finished.get(run)
        if previous is None or previous[:2] != (request.epoch, request.position - 1):
            return None
        return (time.perf_counter() - previous[2]) * 1000

    def _test_delay(self, chunk_name: str) -> None:
        """Fault-injection tests stretch each chunk (setting node.chunk_delay_s) so they can kill the node
        in the middle of one; heartbeats keep flowing meanwhile."""
        deadline = time.monotonic() + self._chunk_delay_s
        while time.monotonic() < deadline:
            activity.heartbeat(chunk_name)
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def _pipeline(self, family: str) -> Pipeline:
        with self._order:
            if family not in self._pipelines:
                self._pipelines[family] = self._pipeline_factory(family)
                self._running[family] = threading.Lock()
            return self._pipelines[family]

    def _session(self, session_id: str, options: c.RenderOptions, *, live: bool) -> Session:
        """The session from the cache, or rebuilt from storage (the reference is encoded only once)."""
        if session_id in self._cache:
            self._cache.move_to_end(session_id)
            return self._cache[session_id]
        portrait = decode_png(self._store.get(keys.portrait(session_id)))
        audio: AudioSource
        audio = LiveAudio(self._store, session_id) if live else StoredWav(self._store, keys.audio(session_id))
        try:
            reference: dict[str, np.ndarray] | None = load_tensors(self._store.get(keys.reference(session_id)))
        except NotFound:
            reference = None
        session = self._pipeline(options.family).start_session(portrait, output_spec(options), audio, reference)
        if reference is None:
            self._store.put(keys.reference(session_id), save_tensors(session.reference))
        self._cache[session_id] = session
        while len(self._cache) > CACHED_SESSIONS:
            self._cache.popitem(last=False)
        return session

    def _write_checkpoint(self, request: c.GenerateChunkInput, session: Session) -> str:
        """After N chunk k: its head and tail anchors (and the cursor, as metadata) with their SHA-256 in the
        database; the files of checkpoints older than the last two go."""
        index = request.index
        head, tail = session.anchors.get("N", index, "head"), session.anchors.get("N", index, "tail")
        flat = {f"head.{k}": v for k, v in head.items()} | {f"tail.{k}": v for k, v in tail.items()}
        cursor = {
            "chunk": f"N{index}",
            "first_frame": str(request.first_frame),
            "n_frames": str(request.n_frames),
            "seed": str(request.options.seed),
        }
        data = save_tensors(flat, metadata=cursor)
        key = keys.checkpoint(request.session_id, index)
        self._store.put(key, data)
        with self._sessions() as db:
            stale = repo.record_checkpoint(
                db, session_id=request.session_id, index=index, key=key, sha256=hashlib.sha256(data).hexdigest()
            )
        for old in stale:
            self._store.delete(old)
        return key

    def _ensure_anchors(self, request: c.GenerateChunkInput, session: Session) -> None:
        """Load from checkpoints the anchors this chunk needs but this node does not hold (the node restarted,
        or the session moved here). A checkpoint whose bytes do not match its recorded SHA-256 (or is gone)
        raises CheckpointLost, and the workflow regenerates that N chunk instead."""
        needed = [(request.index - 1, "tail")] if request.kind == "N" and request.index > 0 else []
        if request.kind == "I":
            needed = [(request.index, "tail"), (request.index + 1, "head")]
        for index, end in needed:
            if f"N{index}.{end}" in session.anchors.names():
                continue
            flat = self._read_checkpoint(request.session_id, index)
            prefix = f"{end}."
            session.anchors.put_one(
                "N", index, end, {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
            )

    def _read_checkpoint(self, session_id: str, index: int) -> dict[str, np.ndarray]:
        with self._sessions() as db:
            row = repo.get_checkpoint(db, session_id=session_id, index=index)
        try:
            data = self._store.get(row.key) if row is not None else None
        except NotFound:
            data = None
        if row is None or data is None or hashlib.sha256(data).hexdigest() != row.sha256:
            problem = "missing" if row is None or data is None else "corrupt (SHA-256 mismatch)"
            raise ApplicationError(
                f"checkpoint N{index} of session {session_id} is {problem}",
                index,
                type=c.CHECKPOINT_LOST,
                non_retryable=True,
            )
        return load_tensors(data)


def _run_key(session_id: str) -> str:
    """Chunk positions and epochs count from zero in every workflow run (continue-as-new, resume)."""
    return f"{session_id}/{activity.info().workflow_run_id}"
