"""Checkpoints: after each N chunk, its head and tail anchors go to object storage with their SHA-256 in the
database, so any node can regenerate any later chunk with the same frames (the node restarted, or the
session moved here). A checkpoint is trusted only when its bytes match the recorded SHA-256.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from safetensors.numpy import load as load_tensors, save as save_tensors
from sqlalchemy.orm import sessionmaker
from temporalio.exceptions import ApplicationError

from activities.heartbeat import STORAGE_LOAD_LIMIT_S, ChunkHeartbeat
from gpu_worker.pipeline.pipeline import Session
from monologue import contracts as c, keys, repo
from monologue.errors import NotFound
from monologue.repo import fence
from monologue.storage import ObjectStore


class Checkpoints:
    def __init__(self, *, store: ObjectStore, sessions: sessionmaker[Any]) -> None:
        self._store = store
        self._sessions = sessions

    def write(self, request: c.GenerateChunkInput, session: Session) -> str:
        """After N chunk k: its head and tail anchors (and the cursor, as metadata) with their SHA-256 in the
        database; the files of checkpoints older than the last two go. Returns the checkpoint's key."""
        index = request.chunk.index
        # The file keeps its chunk's anchors by end alone ("head.<field>", "tail.<field>"), as it always has.
        flat = {
            f"{ref.end}.{field}": value
            for ref in request.chunk.anchors_left()
            for field, value in session.anchors.get(ref).items()
        }
        cursor = {
            "chunk": request.chunk.name,
            "first_frame": str(request.chunk.first_frame),
            "n_frames": str(request.chunk.n_frames),
            "seed": str(request.options.seed),
        }
        data = save_tensors(flat, metadata=cursor)
        # c.FENCING: a stale lease stops before it writes, and a late write lands in its lease's own file.
        fence.check(self._sessions, session_id=request.session_id, lease=request.lease)
        key = keys.checkpoint(request.session_id, index, request.lease)
        self._store.put(key, data)
        with self._sessions() as db:
            stale = repo.record_checkpoint(
                db,
                session_id=request.session_id,
                index=index,
                key=key,
                sha256=hashlib.sha256(data).hexdigest(),
                lease=request.lease,
            )
        for old in stale:
            self._store.delete(old)
        return key

    def ensure_anchors(self, request: c.GenerateChunkInput, session: Session, heartbeat: ChunkHeartbeat) -> None:
        """Load from checkpoints the anchors this chunk needs but this node does not hold (the node restarted,
        or the session moved here): a known long step, reads from storage. A checkpoint whose bytes do not match
        its recorded SHA-256 (or is gone) raises CheckpointLost, and the workflow regenerates that N chunk
        instead."""
        missing = [ref for ref in request.chunk.anchors_read() if ref not in session.anchors]
        if not missing:
            return
        with heartbeat.long_step("loading checkpoints", limit_s=STORAGE_LOAD_LIMIT_S):
            for ref in missing:
                flat = self.read(request.session_id, ref.index)
                prefix = f"{ref.end}."
                session.anchors.put_one(ref, {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)})

    def read(self, session_id: str, index: int) -> dict[str, np.ndarray]:
        """Checkpoint N`index`'s arrays, or CheckpointLost (non-retryable, the index in its details)."""
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
