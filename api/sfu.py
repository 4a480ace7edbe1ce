"""Viewers through the SFU (`MONOLOGUE_SFU__JANUS_URL`): the API signals a viewer to Janus's Streaming plug-in,
where the session's node publishes it (node/webrtc/sfu.py; with several Janus servers, the session's own). Janus
1.1.2 (Debian 12) offers to its viewers itself, so this is the server-offer flow of the first WHEP drafts
(draft-murillo-whep-00), not a viewer's offer:
- `POST /v1/live/{id}/whep` with an empty body → 201, Janus's SDP offer, `Location: …/whep/sfu-<id>`;
- `PATCH <Location>` with the viewer's SDP answer (`application/sdp`) → 204;
- `POST <Location>/alive` → 204: the viewer is still there (Janus ends a viewer's session after its
  session_timeout, 60 s, without one: a page that closed without a DELETE leaves nothing behind); 404 once gone;
- `DELETE <Location>` → 204.
A viewer takes a seat on the mountpoint with the offer; past `max_viewers_per_session` seats the POST answers 429.
Seats are not left behind: Janus hangs up a viewer whose ICE fails (5-15 s after it does) and ends the Janus session,
seat and all, of a viewer that stops saying it is there (never answered, page closed) after its session_timeout.
The resource names the viewer's Janus session and handle, signed with the links' key over the live session's id: a
playback link of one session cannot touch another session's viewers."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Awaitable

from fastapi import HTTPException

from monologue.janus import NO_SUCH_MOUNTPOINT, Handle, Janus, JanusError, Mountpoints

from .deps import Services
from .links import link_key

PREFIX = "sfu-"
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
    return _sign(services, session_id, handle), watched["jsep"]["sdp"]


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


async def answer(handle: Handle, resource: str, sdp: str) -> None:
    """The viewer's SDP answer to Janus's offer: media starts flowing. 400 when Janus cannot use it."""
    try:
        await handle.request({"request": "start"}, {"type": "answer", "sdp": sdp})
    except JanusError as err:
        if err.code == VIEWER_GONE:
            raise HTTPException(404, f"no viewer {resource} (it ended; offer again)") from None
        raise HTTPException(400, f"the SFU refused the SDP answer: {err}") from None


async def alive(handle: Handle, resource: str) -> None:
    await _on_janus(handle.keepalive(), resource)


async def close(handle: Handle, resource: str) -> None:
    await _on_janus(handle.close(), resource)


async def _on_janus(call: Awaitable[None], resource: str) -> None:
    try:
        await call
    except JanusError as err:
        if err.code == VIEWER_GONE:
            raise HTTPException(404, f"no viewer {resource} (it ended)") from None
        raise HTTPException(503, f"the SFU did not answer ({err}); try again", _RETRY) from None


def _sign(services: Services, session_id: str, handle: Handle) -> str:
    ids = handle.resource
    return f"{PREFIX}{ids}-{_mac(services, session_id, ids)}"


def viewer(services: Services, janus: Janus, session_id: str, resource: str) -> Handle:
    """The viewer a resource names; 404 for one that is not this session's (or not signed by this deployment)."""
    ids, _, mac = resource.removeprefix(PREFIX).rpartition("-")
    handle = Handle.of(janus, ids)
    if handle is None or not hmac.compare_digest(mac, _mac(services, session_id, ids)):
        raise HTTPException(404, f"no viewer {resource} of session {session_id}")
    return handle


def _mac(services: Services, session_id: str, ids: str) -> str:
    key = link_key(services.settings)
    return hmac.new(key, f"sfu-viewer:{session_id}:{ids}".encode(), hashlib.sha256).hexdigest()[:24]


async def _quietly_close(handle: Handle) -> None:
    with contextlib.suppress(JanusError):
        await handle.close()
