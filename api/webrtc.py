"""The WebRTC signalling proxy shared by WHEP (viewers) and WHIP (a browser's microphone): the API checks the caller
and the SDP offer, then forwards it to the node holding the live session, whose peer connections carry the media
(node/webrtc/). The API never imports aiortc or PyAV: it only reads SDP text.

Checks, each a 4xx naming what is wrong and nothing created: the content type is `application/sdp` (415), the offer is
at most MAX_OFFER_BYTES (413), it is an SDP offer (`v=0`, m-lines) with the codecs the route needs (400: WHEP needs
video in H.264 or VP8 and audio in Opus; WHIP audio in Opus); a missing credential is 401, a wrong one 403; the
session must be a live one still running (404, 409); the node answers 429 when the session has its most viewers."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import httpx
from fastapi import HTTPException, Request
from sqlalchemy.orm import Session

from monologue import audio_tickets, contracts as c, repo
from monologue.db import NodeStatus
from monologue.repo import nodes as repo_nodes
from monologue.tls import tls_context

from . import links
from .deps import Services, principal_from_headers, with_db
from .errors import NodeFailed, TooManyViewers
from .submit import TERMINAL

MAX_OFFER_BYTES = 64 * 1024
SDP_TYPE = "application/sdp"
NODE_TIMEOUT_S = 30.0
# A node that was just lost may not refuse the connection but never answer it (its address gone): 503 soon, the
# page offers again (it reaches the session's new node once that holds it).
NODE_CONNECT_TIMEOUT_S = 2.0
_RETRY = {"Retry-After": "1"}  # a session between nodes has one again within a lease timeout
_MEDIA = re.compile(r"^m=(?P<kind>\w+) ", re.MULTILINE)
_RTPMAP = re.compile(r"^a=rtpmap:\d+ (?P<codec>[A-Za-z0-9-]+)/", re.MULTILINE)


class MediaNeed(StrEnum):
    """What an offer must carry: a WHEP viewer receives video and audio, a WHIP sender sends audio."""

    WHEP = "whep"
    WHIP = "whip"


_CODECS: dict[MediaNeed, dict[str, tuple[str, ...]]] = {
    MediaNeed.WHEP: {"video": ("H264", "VP8"), "audio": ("opus",)},
    MediaNeed.WHIP: {"audio": ("opus",)},
}


async def read_offer(request: Request, need: MediaNeed, what: str = "offer") -> str:
    """The request's SDP offer (or `what`: an answer), checked (415, 413, 400); the body is read no further than the
    limit."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != SDP_TYPE:
        raise HTTPException(415, f"Content-Type must be {SDP_TYPE} (an SDP {what}), got {content_type or 'none'}")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > MAX_OFFER_BYTES:
            raise HTTPException(413, f"the SDP {what} is over {MAX_OFFER_BYTES} bytes")
    try:
        sdp = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, f"the SDP {what} is not UTF-8 text") from None
    check_offer(sdp, need, what)
    return sdp


def empty_body(request: Request) -> bool:
    """A POST with nothing in it (no SDP): a viewer asking the SFU for its offer (api/sfu.py)."""
    return request.headers.get("content-length", "0") == "0" and "content-type" not in request.headers


def check_offer(offer: str, need: MediaNeed, what: str = "offer") -> None:
    """400 naming what an offer (or answer) lacks: the `v=0` line, a media section, a codec the route needs."""
    if not offer.lstrip().startswith("v=0"):
        raise HTTPException(400, f"the body is not an SDP {what} (it must start with v=0)")
    sections = _sections(offer)
    for kind, codecs in _CODECS[need].items():
        if kind not in sections:
            raise HTTPException(400, f"the SDP {what} has no {kind} section (m={kind}); {need.upper()} needs one")
        offered = {codec.lower() for codec in sections[kind]}
        if not offered & {codec.lower() for codec in codecs}:
            raise HTTPException(
                400,
                f"the SDP {what}'s {kind} codecs ({', '.join(sorted(sections[kind])) or 'none'}) include none of"
                f" {' or '.join(codecs)}",
            )


def _sections(offer: str) -> dict[str, list[str]]:
    """Each media kind's codecs (rtpmap names)."""
    out: dict[str, list[str]] = {}
    starts = list(_MEDIA.finditer(offer))
    for index, match in enumerate(starts):
        end = starts[index + 1].start() if index + 1 < len(starts) else len(offer)
        out.setdefault(match["kind"], []).extend(m["codec"] for m in _RTPMAP.finditer(offer, match.start(), end))
    return out


def bearer(request: Request, what: str) -> str:
    """The request's `Authorization: Bearer <credential>`; 401 naming `what` to send without one."""
    scheme, _, credential = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise HTTPException(401, f"send {what} as 'Authorization: Bearer <token>'")
    return credential.strip()


def playback_grant(services: Services, token: str, session_id: str) -> None:
    """403 unless `token` is a valid playback link of `session_id` (its links.playback)."""
    try:
        grant = links.grant(services.settings, token)
    except links.LinkRefused as err:
        raise HTTPException(403, str(err)) from None
    if grant.session_id != session_id:
        raise HTTPException(403, f"this playback link opens session {grant.session_id}, not {session_id}")


def audio_grant(services: Services, credential: str, session_id: str) -> None:
    """403 unless `credential` is an audio ticket of `session_id` (used up now, as the socket's `?ticket=` is) or an
    API key of the session's tenant (404 for another tenant's session, as everywhere). Blocking: the thread pool."""
    if credential.startswith("tk_"):
        with services.sessions() as db:
            if audio_tickets.redeem(db, ticket=credential, session_id=session_id) is None:
                raise HTTPException(
                    403,
                    "the audio ticket is not valid for this session (expired, used already, or another session's); ask"
                    f" POST /v1/sessions/{session_id}/ticket for a new one",
                )
        return
    try:
        principal = principal_from_headers(services, f"Bearer {credential}")
    except HTTPException as err:
        raise HTTPException(403, str(err.detail)) from None
    with services.sessions() as db:
        row = repo.get_session(db, session_id=session_id)
        if row is None or row.tenant != (principal.tenant or "local"):
            raise HTTPException(404, f"no session {session_id}")


@dataclass(frozen=True)
class Route:
    """Where a session's signalling goes: its node's media address, and the session's frame rate."""

    media_url: str
    fps: int


async def node_route(services: Services, session_id: str, *, webrtc_only: bool) -> Route:
    """The node holding live session `session_id` (404 no such session, 409 not live, ended or not WebRTC; 503
    while it has no node with a WebRTC port: starting or moving, try again)."""
    return await with_db(services, _route, session_id, webrtc_only)


def _route(db: Session, session_id: str, webrtc_only: bool) -> Route:
    options = _live_options(db, session_id, webrtc_only)
    row = repo.get_session(db, session_id=session_id)
    node = None if row is None or row.node_id is None else repo_nodes.get_node(db, node_id=row.node_id)
    if node is None or node.media_url is None or node.status != NodeStatus.UP:
        raise HTTPException(
            503, f"session {session_id} has no node yet (starting or moving); try again", {"Retry-After": "1"}
        )
    return Route(node.media_url, options.fps)


async def live_session(services: Services, session_id: str) -> None:
    """404 no such session, 409 not a running WebRTC live session (the SFU's viewers need no node: api/sfu.py)."""
    await with_db(services, _live_options, session_id, True)


def _live_options(db: Session, session_id: str, webrtc_only: bool) -> c.RenderOptions:
    row = repo.get_session(db, session_id=session_id)
    if row is None or row.deleted_at is not None:
        raise HTTPException(404, f"no session {session_id}")
    if row.kind != c.SessionKind.LIVE or row.status in TERMINAL:
        raise HTTPException(409, f"session {session_id} is a {row.kind} that is {row.status}: nothing to stream")
    options = c.render_options(row.options)
    if webrtc_only and options.delivery != c.Delivery.WEBRTC:
        raise HTTPException(
            409, f"session {session_id} delivers over {options.delivery}; create it with delivery=webrtc for WHEP"
        )
    return options


async def forward(method: str, url: str, *, body: str | None = None) -> httpx.Response:
    """One request to a node's signalling port; 503 when the node does not answer (it may have just been lost)."""
    try:
        timeout = httpx.Timeout(NODE_TIMEOUT_S, connect=NODE_CONNECT_TIMEOUT_S)
        async with httpx.AsyncClient(timeout=timeout, verify=tls_context()) as client:
            return await client.request(
                method, url, content=body, headers={"Content-Type": SDP_TYPE} if body is not None else None
            )
    except httpx.HTTPError as err:
        raise HTTPException(
            503, f"the session's node did not answer ({err}); try again", {"Retry-After": "1"}
        ) from None


def node_refusal(answer: httpx.Response) -> Exception:
    """A node's 4xx/5xx as the API's answer: its 400 (an offer it cannot answer) and 404 (no such viewer) as they are,
    its 429 as TooManyViewers, anything else as NodeFailed (502)."""
    detail = answer.text or f"the node answered {answer.status_code}"
    if answer.status_code == 400:
        return HTTPException(400, detail)
    if answer.status_code == 404:
        return HTTPException(404, detail)
    if answer.status_code == 429:
        return TooManyViewers(detail)
    return NodeFailed(f"the session's node answered {answer.status_code}: {detail}")
