"""Activities on the shared queue: checking a session's stored inputs, handing it to a node, and
recording failures. Any node process can run them."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import sessionmaker
from temporalio import activity

from activities.errors import activity_context
from monologue import contracts as c
from monologue import keys, repo
from monologue.errors import InputError
from monologue.media import AUDIO_RATE, decode_png, decode_wav
from monologue.plan import frame_count, plan_chunks
from monologue.storage import ObjectStore


class SessionActivities:
    def __init__(self, *, store: ObjectStore, sessions: sessionmaker[Any], node_id: str) -> None:
        self._store = store
        self._sessions = sessions
        self._node_id = node_id

    @activity.defn(name=c.PREPARE)
    def prepare(self, request: c.PrepareInput) -> c.PrepareResult:
        """Check the normalised inputs the API stored and size the timeline."""
        with activity_context(session_id=request.session_id) as log:
            portrait = decode_png(self._store.get(keys.portrait(request.session_id)))
            audio = decode_wav(self._store.get(keys.audio(request.session_id)))
            frames = frame_count(len(audio), rate=AUDIO_RATE, fps=request.fps)
            if frames < 1:
                raise InputError(f"audio: {len(audio)} samples is shorter than one frame at {request.fps} fps")
            chunks = len(plan_chunks(frames, chunk_frames=request.chunk_frames))
            with self._sessions() as db:
                repo.mark_running(db, session_id=request.session_id, frames=frames, chunks_total=chunks)
            log.info("prepared", frames=frames, chunks=chunks, audio_samples=len(audio))
            return c.PrepareResult(
                frames=frames, audio_samples=len(audio), width=portrait.shape[1], height=portrait.shape[0]
            )

    @activity.defn(name=c.ACQUIRE_NODE)
    def acquire_node(self, request: c.AcquireNodeInput) -> c.AcquireNodeResult:
        """Answered by whichever node polls the shared queue first: that node takes the session."""
        with activity_context(session_id=request.session_id, node_id=self._node_id) as log:
            with self._sessions() as db:
                repo.set_node(db, session_id=request.session_id, node_id=self._node_id)
            log.info("node acquired")
            return c.AcquireNodeResult(node_id=self._node_id, task_queue=c.node_task_queue(self._node_id))

    @activity.defn(name=c.RECORD_FAILURE)
    def record_failure(self, request: c.RecordFailureInput) -> None:
        with activity_context(session_id=request.session_id) as log:
            with self._sessions() as db:
                repo.mark_failed(db, session_id=request.session_id, error=request.error)
            log.warning("session failed", error=request.error)
