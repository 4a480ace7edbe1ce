"""Viewers through the SFU (`MONOLOGUE_SFU__JANUS_URL`): the API signals a viewer to Janus's Streaming plug-in,
where the session's node publishes it (node/webrtc/sfu.py; with several Janus servers, the session's own). Janus
1.1.2 (Debian 12) offers to its viewers itself, so this is the server-offer flow of the first WHEP drafts
(draft-murillo-whep-00), not a viewer's offer:
- `POST /v1/live/{id}/whep` with an empty body → 201, Janus's SDP offer, `Location: …/whep/sfu-<id>`;
- `PATCH <Location>` with the viewer's SDP answer (`application/sdp`) → 204 with the answered viewer's
  `Location`, which the viewer uses from then on;
- `POST <Location>/alive` → 204: the viewer is still there (Janus ends a viewer's session after its
  session_timeout, 60 s, without one: a page that closed without a DELETE leaves nothing behind); 404 once gone.
  A viewer that says so without ever answering holds its seat for `SfuSettings.answer_timeout_s` at most: past it,
  its `/alive` ends it (404);
- `DELETE <Location>` → 204.
A viewer takes a seat on the mountpoint with the offer; past `max_viewers_per_session` seats the POST answers 429.
Seats are not left behind: Janus hangs up a viewer whose ICE fails (5-15 s after it does) and ends the Janus session,
seat and all, of a viewer that stops saying it is there (never answered, page closed) after its session_timeout.
The resource names the viewer's Janus session and handle and its state (offered at a time, or answered), signed with
the links' key over the live session's id: a playback link of one session cannot touch another session's viewers, and
a viewer cannot pass an offered resource off as answered. The API keeps no state of its own (any replica serves any
request)."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import time
from collections.abc import Awaitable
from dataclasses import dataclass

from fastapi import HTTPException

from monologue.janus import NO_SUCH_MOUNTPOINT, Handle, Janus, JanusError, Mountpoints

from .deps import Services
from .links import link_key

PREFIX = "sfu-"
ANSWERED = "a"  # the state of a viewer whose answer Janus took; an offered one's is "o<unix time of the offer>"
VIEWER_GONE = 458  # Janus's JANUS_ERROR_SESSION_NOT_FOUND
_RETRY = {"Retry-After": "1"}


def janus_of(services: Services, session_id: str) -> Janus | None:
    """The SFU the session's viewers watch through (its Janus: `SfuSettings.janus_for`), or None (viewers connect
    to the session's node)."""
    sfu = services.settings.sfu
    if not sfu.servers():
        return None
    return Janus(sfu.janus_for(session_id), sfu.api_secret.get_secret_value() if sfu.api_secret else None)


def is_sfu_resource(resource: str) -> bool:
    return resource.startswith(PREFIX)


async def offer(services: Services, janus: Janus, session_id: str) -> tuple[str, str]:
    """A new viewer's seat on the session's mountpoint: (resource, Janus's SDP offer). 503 while the mountpoint is
    not there yet (the session's init has not run on a node); 429 past the session's seats (counted after taking
    one: of two viewers racing for the last seat, neither keeps more than the limit)."""
    try:
        handle = await janus.open()
    except JanusError as err:
        raise HTTPException(503, f"the SFU did not answer ({err}); try again", _RETRY) from None
    try:
        watched = await handle.request({"request": "watch", "id": session_id})
    except JanusError as err:
        await _quietly_close(handle)
        if err.code == NO_SUCH_MOUNTPOINT:
            raise HTTPException(
                503, f"session {session_id} is not on the SFU yet (its first frames are coming); try again", _RETRY
            ) from None
        raise HTTPException(503, f"the SFU refused the viewer ({err}); try again", _RETRY) from None
    await _within_seats(services, handle, session_id)
    return _sign(services, session_id, handle, f"o{int(time.time())}"), watched["jsep"]["sdp"]


async def _within_seats(services: Services, handle: Handle, session_id: str) -> None:
    limit = services.settings.sfu.max_viewers_per_session
    try:
        seats = await Mountpoints(handle, services.settings.sfu.mountpoint_secret(session_id)).viewers(session_id)
    except JanusError as err:
        await _quietly_close(handle)
        raise HTTPException(503, f"the SFU did not answer ({err}); try again", _RETRY) from None
    if seats > limit:
        await _quietly_close(handle)
        raise HTTPException(429, f"session {session_id} has {limit} viewers on the SFU, the most it may have")


async def answer(services: Services, session_id: str, viewer: Viewer, sdp: str) -> str:
    """The viewer's SDP answer to Janus's offer: media starts flowing. Returns the answered viewer's resource. 400
    when Janus cannot use the answer."""
    try:
        await viewer.handle.request({"request": "start"}, {"type": "answer", "sdp": sdp})
    except JanusError as err:
        if err.code == VIEWER_GONE:
            raise HTTPException(404, f"no viewer {viewer.resource} (it ended; offer again)") from None
        raise HTTPException(400, f"the SFU refused the SDP answer: {err}") from None
    return _sign(services, session_id, viewer.handle, ANSWERED)


async def alive(services: Services, viewer: Viewer) -> None:
    """Keep the viewer's Janus session; a viewer that has not answered within `answer_timeout_s` of its offer is ended
    instead (404): saying it is there must not keep a seat that carries no media."""
    window = services.settings.sfu.answer_timeout_s
    if viewer.state != ANSWERED and time.time() - int(viewer.state[1:]) > window:
        await _quietly_close(viewer.handle)
        raise HTTPException(404, f"viewer {viewer.resource} did not answer the SFU's offer within {window:g} s: ended")
    await _on_janus(viewer.handle.keepalive(), viewer.resource)


async def close(viewer: Viewer) -> None:
    await _on_janus(viewer.handle.close(), viewer.resource)


async def _on_janus(call: Awaitable[None], resource: str) -> None:
    try:
        await call
    except JanusError as err:
        if err.code == VIEWER_GONE:
            raise HTTPException(404, f"no viewer {resource} (it ended)") from None
        raise HTTPException(503, f"the SFU did not answer ({err}); try again", _RETRY) from None


@dataclass(frozen=True)
class Viewer:
    handle: Handle
    state: str  # ANSWERED, or "o<unix time of the offer>"
    resource: str


def _sign(services: Services, session_id: str, handle: Handle, state: str) -> str:
    named = f"{handle.resource}-{state}"
    return f"{PREFIX}{named}-{_mac(services, session_id, named)}"


def viewer(services: Services, janus: Janus, session_id: str, resource: str) -> Viewer:
    """The viewer a resource names; 404 for one that is not this session's (or not signed by this deployment)."""
    named, _, mac = resource.removeprefix(PREFIX).rpartition("-")
    ids, _, state = named.rpartition("-")
    handle = Handle.of(janus, ids)
    well_formed = state == ANSWERED or (state[:1] == "o" and state[1:].isdigit())
    if handle is None or not well_formed or not hmac.compare_digest(mac, _mac(services, session_id, named)):
        raise HTTPException(404, f"no viewer {resource} of session {session_id}")
    return Viewer(handle, state, resource)


def _mac(services: Services, session_id: str, ids: str) -> str:
    key = link_key(services.settings)
    return hmac.new(key, f"sfu-viewer:{session_id}:{ids}".encode(), hashlib.sha256).hexdigest()[:24]


async def _quietly_close(handle: Handle) -> None:
    with contextlib.suppress(JanusError):
        await handle.close()
