"""Activities pinned to one node (queue `node-<id>`): set a session up, generate its chunks, and
assemble the final video. The node keeps a small per-session cache (portrait, audio, model); if it
is missing (the node restarted), it is rebuilt from object storage, so every activity can retry."""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy.orm import sessionmaker
from temporalio import activity

from activities.errors import activity_context
from gpu_worker.encode import encode_video_segment, mux_final
from gpu_worker.face import FaceRegion, detect_face
from gpu_worker.talking import TalkingPhoto, mouth_openings
from monologue import contracts as c
from monologue import keys, repo
from monologue.errors import NotFound
from monologue.media import AUDIO_RATE, decode_png, decode_wav
from monologue.plan import plan_chunks
from monologue.storage import ObjectStore

CACHED_SESSIONS = 4


@dataclass
class SessionState:
    """What a node holds for a session between chunks: inputs decoded once, the model set up once."""

    audio: np.ndarray  # (samples,) float32 at AUDIO_RATE
    face: FaceRegion
    model: TalkingPhoto


class NodeActivities:
    def __init__(self, *, store: ObjectStore, sessions: sessionmaker[Any], node_id: str) -> None:
        self._store = store
        self._sessions = sessions
        self._node_id = node_id
        self._cache: OrderedDict[str, SessionState] = OrderedDict()

    @activity.defn(name=c.INIT_SESSION)
    def init_session(self, request: c.InitSessionInput) -> c.InitSessionResult:
        """Locate the face once per session and keep it in storage for every later chunk."""
        with activity_context(session_id=request.session_id, node_id=self._node_id) as log:
            self._cache.pop(request.session_id, None)
            state = self._load(request.session_id)
            face = state.face
            log.info("session initialised", face=face.to_dict())
            return c.InitSessionResult(face_box=[face.x, face.y, face.width, face.height])

    @activity.defn(name=c.GENERATE_CHUNK)
    def generate_chunk(self, request: c.GenerateChunkInput) -> c.GenerateChunkResult:
        """Render one chunk's frames, encode them to a segment, and record the chunk."""
        with activity_context(
            session_id=request.session_id, node_id=self._node_id, chunk=f"{request.kind}{request.index}"
        ) as log:
            state = self._load(request.session_id)
            started = time.perf_counter()
            openings = mouth_openings(
                state.audio,
                rate=AUDIO_RATE,
                fps=request.fps,
                first_frame=request.first_frame,
                n_frames=request.n_frames,
            )
            frames = state.model.render(openings)  # (T, H, W, 3) uint8
            generated = time.perf_counter()
            activity.heartbeat("generated")
            frame_hashes = [hashlib.sha256(frame.tobytes()).hexdigest() for frame in frames]
            segment_key = keys.segment(request.session_id, request.kind, request.index)
            with tempfile.TemporaryDirectory(prefix="monologue-seg-") as scratch:
                path = Path(scratch) / "segment.mp4"
                encode_video_segment(frames, fps=request.fps, path=path)
                del frames
                self._store.put_file(segment_key, path, content_type="video/mp4")
            self._store.put(
                keys.frame_hashes(request.session_id, request.kind, request.index),
                json.dumps(frame_hashes).encode(),
                content_type="application/json",
            )
            encoded = time.perf_counter()
            generate_ms, encode_ms = (generated - started) * 1000, (encoded - generated) * 1000
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
                    generate_ms=generate_ms,
                    encode_ms=encode_ms,
                    segment_key=segment_key,
                    frames_sha256=_digest(frame_hashes),
                )
            log.info(
                "chunk done", frames=request.n_frames, generate_ms=round(generate_ms, 1), encode_ms=round(encode_ms, 1)
            )
            return c.GenerateChunkResult(
                segment_key=segment_key,
                frames=request.n_frames,
                frames_sha256=frame_hashes,
                generate_ms=generate_ms,
                encode_ms=encode_ms,
            )

    @activity.defn(name=c.FINALIZE)
    def finalize(self, request: c.FinalizeInput) -> c.FinalizeResult:
        """Join the segments into one MP4 (no video re-encode), add the audio, write the frame manifest."""
        with activity_context(session_id=request.session_id, node_id=self._node_id) as log:
            audio = decode_wav(self._store.get(keys.audio(request.session_id)))
            plan = plan_chunks(request.frames, chunk_frames=request.chunk_frames)
            manifest: list[str] = []
            with tempfile.TemporaryDirectory(prefix="monologue-final-") as scratch:
                segment_paths = []
                for spec in plan:
                    path = Path(scratch) / f"{spec.kind}{spec.index:05d}.mp4"
                    self._store.get_file(keys.segment(request.session_id, spec.kind, spec.index), path)
                    segment_paths.append(path)
                    hashes = json.loads(self._store.get(keys.frame_hashes(request.session_id, spec.kind, spec.index)))
                    manifest.extend(
                        json.dumps({"frame": spec.first_frame + offset, "sha256": digest})
                        for offset, digest in enumerate(hashes)
                    )
                    activity.heartbeat(spec.index)
                final_path = Path(scratch) / "final.mp4"
                mux_final(
                    segment_paths, audio, rate=AUDIO_RATE, fps=request.fps, n_frames=request.frames, path=final_path
                )
                video_key = keys.final_video(request.session_id)
                size = final_path.stat().st_size
                self._store.put_file(video_key, final_path, content_type="video/mp4")
            self._store.put(
                keys.frames_manifest(request.session_id),
                ("\n".join(manifest) + "\n").encode(),
                content_type="application/x-ndjson",
            )
            with self._sessions() as db:
                repo.mark_completed(db, session_id=request.session_id, video_key=video_key)
            self._cache.pop(request.session_id, None)
            log.info("session completed", frames=request.frames, bytes=size)
            return c.FinalizeResult(video_key=video_key, size_bytes=size)

    def _load(self, session_id: str) -> SessionState:
        """The session's state from the cache, or rebuilt from storage (after a node restart)."""
        if session_id in self._cache:
            self._cache.move_to_end(session_id)
            return self._cache[session_id]
        portrait = decode_png(self._store.get(keys.portrait(session_id)))
        audio = decode_wav(self._store.get(keys.audio(session_id)))
        try:
            face = FaceRegion.from_dict(json.loads(self._store.get(keys.face(session_id))))
        except NotFound:
            face = detect_face(portrait)
            self._store.put(keys.face(session_id), json.dumps(face.to_dict()).encode(), content_type="application/json")
        state = SessionState(audio=audio, face=face, model=TalkingPhoto(portrait, face))
        self._cache[session_id] = state
        while len(self._cache) > CACHED_SESSIONS:
            self._cache.popitem(last=False)
        return state


def _digest(frame_hashes: list[str]) -> str:
    return hashlib.sha256("".join(frame_hashes).encode()).hexdigest()
