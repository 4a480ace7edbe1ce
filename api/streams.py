"""Long-lived streams (event streams and audio sockets): how many one API key may hold open at once, and
whether the key that opened one still stands.

The counts live in this API process's memory: behind a load balancer with several API processes, a key may
hold MONOLOGUE_LIMITS__MAX_STREAMS_PER_KEY streams in each. Keys are known here by their public id only; a
raw key never reaches this module.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterable

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.datastructures import State
from starlette.types import Receive, Scope, Send

from monologue.db import ApiKeyRow

from .deps import Services
from .errors import TooManyStreams

REVOKED = "the API key was revoked, so its open streams are closed; use another key (`monologue keys create`)"
_REGISTRY_LOCK = threading.Lock()


class StreamSlots:
    """Open streams per key id; None (the keyless operator on loopback) counts as one key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # sync routes take their slots on the thread pool
        self._open: dict[str | None, int] = {}

    def take(self, key_id: str | None, limit: int) -> StreamSlot:
        """A slot for one more stream of `key_id`; TooManyStreams when it holds `limit` already."""
        with self._lock:
            held = self._open.get(key_id, 0)
            if held >= limit:
                raise TooManyStreams(
                    f"this API key already has {held} open streams (event streams and audio sockets), its limit"
                    " (MONOLOGUE_LIMITS__MAX_STREAMS_PER_KEY); close one before opening another"
                )
            self._open[key_id] = held + 1
        return StreamSlot(self, key_id)

    def release(self, slot: StreamSlot) -> None:
        with self._lock:
            if slot.released:
                return
            slot.released = True
            left = self._open[slot.key_id] - 1
            if left:
                self._open[slot.key_id] = left
            else:
                del self._open[slot.key_id]  # keys come and go: keep only those with open streams


class StreamSlot:
    """One open stream's place in its key's count. `release` may be called more than once."""

    def __init__(self, slots: StreamSlots, key_id: str | None) -> None:
        self._slots = slots
        self.key_id = key_id
        self.released = False

    def release(self) -> None:
        self._slots.release(self)

    def __enter__(self) -> StreamSlot:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def stream_slots(state: State) -> StreamSlots:
    """The app's registry (`app.state`), made at its first use."""
    with _REGISTRY_LOCK:
        slots: StreamSlots | None = getattr(state, "stream_slots", None)
        if slots is None:
            slots = state.stream_slots = StreamSlots()
    return slots


class HeldStream(StreamingResponse):
    """A streaming response that gives its slot back when it ends, however it ends: finished, the client gone,
    an error or a cancellation (the body's own `finally` never runs if the client leaves before it starts)."""

    def __init__(
        self, content: AsyncIterable[str | bytes], slot: StreamSlot, *, media_type: str, headers: dict[str, str]
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self.slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def key_revoked(services: Services, key_id: str) -> bool:
    """Whether the key was revoked (or deleted) since its stream opened. Blocking: call it on the thread pool."""
    with services.sessions() as db:
        row = db.get(ApiKeyRow, key_id)
        return row is None or row.revoked_at is not None


class KeyWatch:
    """Re-checks a stream's key every MONOLOGUE_API__KEY_RECHECK_S, so that a revoked key loses its streams."""

    def __init__(self, services: Services, key_id: str | None) -> None:
        self._services = services
        self._key_id = key_id
        self._every_s = services.settings.api.key_recheck_s
        self._next = time.monotonic() + self._every_s

    async def revoked(self) -> bool:
        """True once the key is revoked; asks the database only when a re-check is due (an event stream looks
        at its next poll after that). The keyless operator on loopback has no key to revoke."""
        if self._key_id is None or time.monotonic() < self._next:
            return False
        self._next = time.monotonic() + self._every_s
        return await run_in_threadpool(key_revoked, self._services, self._key_id)
