"""A session's progress as server-sent events: `GET /v1/renders/{id}/events`, its playback link and /ops.

Each `progress` event carries the whole session (as `GET /v1/renders/{id}` shows it) and an `id:` derived from it
(a digest of what it says, the signed links aside: they renew every minute). A client that reconnects with
`Last-Event-ID` (EventSource does) gets the next event only once something changed; since every event is the
whole state, it misses nothing. While the session waits for a node its `queue` (position, ETA) is part of that
state, so a session ahead leaving, or a chunk changing the ETA, is an event too. An idle stream sends a
`: keep-alive` comment every MONOLOGUE_API__EVENTS_KEEPALIVE_S so proxies keep it open. The database is read on
the thread pool, never on the event loop. Events are framed by FastAPI's own SSE encoder
(`fastapi.sse.format_sse_event`); the keep-alive is part of this loop because FastAPI's own timer is fixed at 15 s
and its generator endpoints cannot hold the stream's slot (`streams.HeldStream`) past the response."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import KEEPALIVE_COMMENT, format_sse_event

from monologue import repo
from monologue.contracts import TERMINAL

from . import streams
from .deps import Services
from .views import public

# Why a stream must end now (a revoked key, an expired link), or None: checked before every poll.
Stop = Callable[[], Awaitable[str | None]]


async def progress_events(
    request: Request,
    services: Services,
    session_id: str,
    slot: streams.StreamSlot,
    stop: Stop,
    *,
    for_operator: bool = False,
) -> Response:
    """The `progress` event stream of a session the caller may see, until it ends or `stop` says why not (an
    `error` event says so); `slot` is the stream's place in its key's (or link's) count, given back at the end.
    A session that has ended and not changed since `Last-Event-ID` is a 204, which tells EventSource to stop
    reconnecting. The operator's stream (`for_operator`) adds the session's `node_id`, which tenants never see."""
    settings = services.settings.api
    last_seen = request.headers.get("last-event-id")

    def snapshot() -> dict[str, Any] | None:
        with services.sessions() as db:
            row = repo.get_session(db, session_id=session_id)
            if row is None:
                return None
            state = public(services, db, row).model_dump(mode="json")
            return state | {"node_id": row.node_id} if for_operator else state

    first: dict[str, Any] | None = await run_in_threadpool(snapshot)
    if first is None or (first["status"] in TERMINAL and state_id(first) == last_seen):
        slot.release()
        return Response(status_code=204)

    async def events() -> AsyncIterator[bytes]:
        last, sent_at = last_seen, time.monotonic()
        state: dict[str, Any] | None = first
        yield format_sse_event(comment="progress events", retry=int(settings.events_poll_s * 1000))
        while not await request.is_disconnected():
            reason = await stop()
            if reason is not None:
                yield format_sse_event(event="error", data_str=json.dumps({"detail": reason}))
                return
            state = state or await run_in_threadpool(snapshot)
            if state is None:
                return
            event_id = state_id(state)
            if event_id != last:
                yield format_sse_event(event="progress", data_str=json.dumps(state), id=event_id)
                last, sent_at = event_id, time.monotonic()
            elif time.monotonic() - sent_at >= settings.events_keepalive_s:
                yield KEEPALIVE_COMMENT
                sent_at = time.monotonic()
            if state["status"] in TERMINAL:
                return
            state = None
            await asyncio.sleep(settings.events_poll_s)

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # nginx: pass each event on at once
    return streams.HeldStream(events(), slot, media_type="text/event-stream", headers=headers)


def state_id(state: dict[str, Any]) -> str:
    """The event id of a session state: what it says, the signed links (which renew) left out."""
    links = {name: value for name, value in state["links"].items() if name != "playback"}
    stable = json.dumps(state | {"links": links}, sort_keys=True).encode()
    return hashlib.sha256(stable).hexdigest()[:20]
