"""`/v1/live/{id}`: a live session over WebRTC, for viewers who hold its signed playback link (no key).
- `POST /v1/live/{id}/whep` (WHEP): body an SDP offer (`application/sdp`), `Authorization: Bearer <token>` with the
  token of the session's playback link (`links.playback`: `/play/<token>/…`); answers 201 with the SDP answer and a
  `Location` to `DELETE` when done. The session must have been created with `delivery=webrtc`.
- `DELETE /v1/live/{id}/whep/{resource}`: stop watching.
- `POST /v1/live/{id}/whip` (WHIP): a browser's microphone into the session, as the audio socket takes it (stored in
  the same 0.1 s pieces, the workflow told the same way; `DELETE` ends the session's audio as `end` does): body an SDP
  offer sending Opus audio, `Authorization: Bearer <audio ticket>` (`audio_ticket` of the session, or a fresh one from
  `POST /v1/sessions/{id}/ticket`) or an API key of its tenant; 201 with the answer and a `Location` to `DELETE`. One
  sender at a time, socket or WHIP (409). The session must have been created with `delivery=webrtc`.
- `GET /v1/live/{id}/ice-servers` (the playback link's token as Bearer): the STUN/TURN servers a viewer's or a
  sender's peer connection uses, TURN credentials minted for it (monologue/ice.py; `[]` where none are configured).
  WHEP and WHIP answers carry the same servers as `Link: <url>; rel="ice-server"` headers (RFC 9725).
- `GET /v1/live/{id}/player?link=<token>[&ticket=<audio ticket>]`: a page that plays the session (WHEP) and re-offers
  through the same URL when the connection drops (the session moved to another node); with `ticket` it shows a
  "Talk" button that sends the browser's microphone over WHIP (the page reads `ticket` itself).
- With an SFU (`MONOLOGUE_SFU__JANUS_URL`): an empty `POST …/whep` gets the SFU's offer, `PATCH <Location>` takes the
  viewer's answer and gives the answered viewer's `Location`, `POST <Location>/alive` keeps the viewer's seat (one
  that never answered loses it: api/sfu.py).
Checks and forwarding are api/webrtc.py's; the peer connections live on the session's node (node/webrtc/) or, through
an SFU, on Janus, where the node publishes the session once."""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from monologue.ice import IceServer, ice_servers

from .. import sfu, webrtc
from ..deps import Services, ServicesDep
from .renders import operation_id

router = APIRouter(prefix="/v1/live", tags=["webrtc"], generate_unique_id_function=operation_id)
PLAYER_PAGE = Path(__file__).resolve().parent.parent / "player" / "player.html"
_LINK = "the token of the session's playback link (links.playback: /play/<token>/…)"


@router.post("/{session_id}/whep", status_code=201, response_class=Response)
async def whep_offer(session_id: str, request: Request, services: ServicesDep) -> Response:
    """Start watching a live session: an SDP offer in, the SDP answer out (WHEP). Where the deployment has an SFU, an
    empty POST gets the SFU's offer instead (answer it with PATCH: api/sfu.py)."""
    webrtc.playback_grant(services, webrtc.bearer(request, _LINK), session_id)
    janus = sfu.janus_of(services, session_id)
    if janus is not None and webrtc.empty_body(request):
        await webrtc.live_session(services, session_id)
        resource, offer_sdp = await sfu.offer(services, janus, session_id)
        return _created(offer_sdp, f"/v1/live/{session_id}/whep/{resource}", _servers(services, session_id))
    offer = await webrtc.read_offer(request, webrtc.MediaNeed.WHEP)
    route = await webrtc.node_route(services, session_id, webrtc_only=True)
    return await _offer_to_node(
        route.media_url, session_id, webrtc.MediaNeed.WHEP, offer, _servers(services, session_id), f"?fps={route.fps}"
    )


@router.delete("/{session_id}/whep/{resource}", status_code=204, response_class=Response)
async def whep_stop(session_id: str, resource: str, request: Request, services: ServicesDep) -> Response:
    """Stop watching (the resource from the offer's `Location`)."""
    webrtc.playback_grant(services, webrtc.bearer(request, _LINK), session_id)
    if sfu.is_sfu_resource(resource):
        await sfu.close(_viewer(services, session_id, resource))
        return Response(status_code=204)
    return await _stop_on_node(services, session_id, f"whep/{session_id}/{resource}")


@router.patch("/{session_id}/whep/{resource}", status_code=204, response_class=Response)
async def whep_answer(session_id: str, resource: str, request: Request, services: ServicesDep) -> Response:
    """A viewer's SDP answer to the SFU's offer (from an empty POST): its media starts. `Location` names the answered
    viewer: its resource from then on."""
    webrtc.playback_grant(services, webrtc.bearer(request, _LINK), session_id)
    viewer = _viewer(services, session_id, resource)
    answered = await sfu.answer(
        services, session_id, viewer, await webrtc.read_offer(request, webrtc.MediaNeed.WHEP, "answer")
    )
    return Response(status_code=204, headers={"Location": f"/v1/live/{session_id}/whep/{answered}"})


@router.post("/{session_id}/whep/{resource}/alive", status_code=204, response_class=Response)
async def whep_alive(session_id: str, resource: str, request: Request, services: ServicesDep) -> Response:
    """An SFU viewer is still there (its page says so every 20 s; Janus ends a silent viewer after 60 s). 404 once it
    has ended, also for one that did not answer the offer within `MONOLOGUE_SFU__ANSWER_TIMEOUT_S`."""
    webrtc.playback_grant(services, webrtc.bearer(request, _LINK), session_id)
    await sfu.alive(services, _viewer(services, session_id, resource))
    return Response(status_code=204)


def _viewer(services: Services, session_id: str, resource: str) -> sfu.Viewer:
    """The SFU viewer `resource` names (404 without an SFU, or for a resource not of this session)."""
    janus = sfu.janus_of(services, session_id)
    if janus is None:
        raise HTTPException(404, "this deployment has no SFU (MONOLOGUE_SFU__JANUS_URL): viewers offer to the node")
    return sfu.viewer(services, janus, session_id, resource)


_TICKET = "an audio ticket of the session (POST /v1/sessions/{id}/ticket) or an API key"


@router.post("/{session_id}/whip", status_code=201, response_class=Response)
async def whip_offer(session_id: str, request: Request, services: ServicesDep) -> Response:
    """Send a microphone's audio into a live session: an SDP offer in (Opus), the SDP answer out (WHIP)."""
    await run_in_threadpool(webrtc.audio_grant, services, webrtc.bearer(request, _TICKET), session_id)
    offer = await webrtc.read_offer(request, webrtc.MediaNeed.WHIP)
    route = await webrtc.node_route(services, session_id, webrtc_only=True)
    return await _offer_to_node(
        route.media_url, session_id, webrtc.MediaNeed.WHIP, offer, _servers(services, session_id)
    )


@router.get("/{session_id}/ice-servers")
def ice_servers_of(session_id: str, request: Request, services: ServicesDep) -> dict[str, Any]:
    """The STUN/TURN servers for a peer connection to this live session (TURN credentials minted now; the player
    page comes with its first ones and asks before each later offer). `ice_servers` is what a browser's
    `RTCPeerConnection({iceServers})` takes."""
    webrtc.playback_grant(services, webrtc.bearer(request, _LINK), session_id)
    return {"ice_servers": _viewer_servers(services, session_id)}


def _servers(services: Services, session_id: str) -> list[IceServer]:
    return ice_servers(services.settings.ice, f"viewer-{session_id}", now=time.time())


def _viewer_servers(services: Services, session_id: str) -> list[dict[str, Any]]:
    """A viewer's servers as a browser takes them (the /ice-servers answer, and what the player page comes with)."""
    return [server.as_json() for server in _servers(services, session_id)]


@router.delete("/{session_id}/whip/{resource}", status_code=204, response_class=Response)
async def whip_stop(session_id: str, resource: str, request: Request, services: ServicesDep) -> Response:
    """Stop sending: the session's audio ends with what was stored (as `end` on the audio socket). The resource id
    from the offer's `Location` is the sender's credential here (a ticket is single-use)."""
    return await _stop_on_node(services, session_id, f"whip/{session_id}/{resource}")


async def _offer_to_node(
    media_url: str, session_id: str, kind: webrtc.MediaNeed, offer: str, servers: list[IceServer], query: str = ""
) -> Response:
    """Forward an offer to the node (`<kind>/<session id>` there): its SDP answer, with the connection's URL on this
    API (`Location`: `/v1/live/<session id>/<kind>/<resource>`) for the DELETE that ends it and the ICE servers as
    `Link` headers."""
    answer = await webrtc.forward("POST", f"{media_url}/{kind}/{session_id}{query}", body=offer)
    if answer.status_code != 201:
        raise webrtc.node_refusal(answer)
    return _created(answer.text, f"/v1/live/{session_id}/{kind}/{answer.headers['X-Resource']}", servers)


def _created(sdp: str, location: str, servers: list[IceServer]) -> Response:
    """201 with an SDP, the connection's URL on this API and the ICE servers as `Link` headers."""
    response = Response(sdp, status_code=201, media_type=webrtc.SDP_TYPE)
    response.headers["Location"] = location
    for server in servers:
        for link in server.link_headers():
            response.headers.append("Link", link)
    return response


async def _stop_on_node(services: Services, session_id: str, path: str) -> Response:
    """End a connection on the node holding the session (`path`: `whep|whip/<id>/<resource>`)."""
    route = await webrtc.node_route(services, session_id, webrtc_only=True)
    answer = await webrtc.forward("DELETE", f"{route.media_url}/{path}")
    if answer.status_code != 204:
        raise webrtc.node_refusal(answer)
    return Response(status_code=204)


@router.get("/{session_id}/player", response_class=HTMLResponse)
def player(session_id: str, services: ServicesDep, link: Annotated[str, Query(max_length=200)]) -> HTMLResponse:
    """A page that plays the live session over WebRTC (`link`: the playback link's token)."""
    webrtc.playback_grant(services, link, session_id)
    # The page's first connection needs no request before its offer: the ICE servers come with it (as
    # /ice-servers gives them, TURN credentials minted now; later connections ask again, credentials expire).
    attributes = f' data-ice-servers="{html.escape(json.dumps(_viewer_servers(services, session_id)))}"'
    if services.settings.sfu.servers():  # the page asks the SFU for its offer and answers it
        attributes += ' data-sfu="1"'
    page = PLAYER_PAGE.read_text().replace("<body>", f"<body{attributes}>", 1)
    return HTMLResponse(page, headers={"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"})
