"""Signed playback links: what a viewer's player opens instead of sending the tenant's API key.

A link is `<public_url>/play/<token>/<file>`, the token `<session id>.<expiry>.<signature>`: HMAC-SHA256 under the
links' secret (MONOLOGUE_LINKS__SECRET, else `<home>/link-secret`) over its purpose, the session and the expiry.
The token is a path segment, not a query parameter, so the HLS playlist's relative links (`init.mp4`,
`seg-N00000.m4s`) resolve under the same signed path and any player (Safari, iOS, a TV, hls.js, a plain <video>)
plays without a header or a rewritten playlist. A token opens one session's stream, segments, video and events,
read-only, until it expires; nothing else. Expiries are rounded up to the minute, so a session asked for twice
in a minute gives the same links (players and caches see one URL)."""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from monologue.captions import PUBLISHED_CAPTIONS
from monologue.localfs import key_file
from monologue.schemas import CaptionLinks, PlaybackLinks
from monologue.settings import LinkSettings, Settings

from .origin import public_base

PLAY_PREFIX = "/play"
_PURPOSE = b"monologue-playback-v1"
# One spelling per token: an expiry without leading zeros (a signed `0…` variant would be another URL, another
# cache entry, for the same grant).
_TOKEN = re.compile(
    r"(?P<session>[0-9a-zA-Z_-]{1,64})\.(?P<expires>[1-9][0-9]{0,11})\.(?P<signature>[A-Za-z0-9_-]{43})"
)
_ROUND_S = 60


class LinkRefused(Exception):
    """A token that opens nothing: not one of ours, tampered with, or expired (→ 403; the message says which)."""


@dataclass(frozen=True)
class Grant:
    """What a valid token opens: one session, read-only, until `expires`."""

    session_id: str
    expires: int  # Unix seconds


def link_key(settings: Settings) -> bytes:
    """The HMAC key: the setting, else `<home>/link-secret` (made at first use, 0600, shared by the API processes
    of one machine; several machines must set MONOLOGUE_LINKS__SECRET to one value)."""
    if settings.links.secret is not None:
        return settings.links.secret.get_secret_value().encode()
    return _key_file(settings.home)


def unshared_key(settings: Settings, environ: Mapping[str, str]) -> str | None:
    """Why this process's links would not work on its sibling replicas, or None: in a Kubernetes pod (every pod has
    KUBERNETES_SERVICE_HOST) without MONOLOGUE_LINKS__SECRET, each replica makes a key of its own, and a link one of
    them signed is refused by the others."""
    if settings.links.secret is not None or "KUBERNETES_SERVICE_HOST" not in environ:
        return None
    return (
        "MONOLOGUE_LINKS__SECRET is not set: this pod made a link key of its own, so playback links and audio"
        " tickets it signs are refused by every other API replica; put one secret in monologue-secrets"
        " (infra/k8s/base/config.yaml)"
    )


@functools.cache
def _key_file(home: Path) -> bytes:
    return key_file(home, "link-secret", lambda: secrets.token_hex(32).encode())


def sign(key: bytes, session_id: str, expires: int) -> str:
    return f"{session_id}.{expires}.{_signature(key, session_id, expires)}"


def grant(settings: Settings, token: str) -> Grant:
    """What `token` opens under this process's link key and TTL; LinkRefused otherwise."""
    return verify(link_key(settings), token, max_ttl_s=settings.links.ttl_s)


def verify(key: bytes, token: str, *, max_ttl_s: float, now: float | None = None) -> Grant:
    """The grant of a valid, unexpired token that expires within `max_ttl_s` (rounded up to the minute, as links
    are made) from now; LinkRefused otherwise. A link made when the TTL was longer stops working early."""
    match = _TOKEN.fullmatch(token)
    if match is None:
        raise LinkRefused("this is not a playback link (ask the API for the session's links.playback)")
    session_id, expires = match["session"], int(match["expires"])
    if not hmac.compare_digest(match["signature"], _signature(key, session_id, expires)):
        raise LinkRefused("this playback link's signature is not valid (was it changed?)")
    moment = time.time() if now is None else now
    if moment >= expires:
        at = datetime.fromtimestamp(expires, UTC).isoformat()
        raise LinkRefused(f"this playback link expired at {at}; ask the API for the session again for fresh links")
    if expires > moment + max_ttl_s + _ROUND_S:
        raise LinkRefused(
            f"this playback link lasts longer than links may (MONOLOGUE_LINKS__TTL_S, {max_ttl_s:g} s); ask the API"
            " for the session again for fresh links"
        )
    return Grant(session_id, expires)


def expiry(links: LinkSettings, *, now: float | None = None) -> int:
    """When links made now expire: the TTL from now, rounded up to the minute."""
    moment = (time.time() if now is None else now) + links.ttl_s
    return math.ceil(moment / _ROUND_S) * _ROUND_S


def playback_links(
    settings: Settings, session_id: str, *, captioned: bool = False, webrtc: bool = False
) -> PlaybackLinks:
    """A session's signed links, built from public_url (never from the request's Host); `captioned`: the session has
    captions, so a multivariant playlist with its subtitle rendition too; `webrtc`: a live session delivered over
    WebRTC, so its player page and WHEP endpoint (api/routes/live.py) too."""
    expires = expiry(settings.links)
    token = sign(link_key(settings), session_id, expires)
    base = f"{public_base(settings.api)}{PLAY_PREFIX}/{token}"
    live = f"{public_base(settings.api)}/v1/live/{session_id}"
    return PlaybackLinks(
        stream=f"{base}/stream.m3u8",
        captioned_stream=f"{base}/main.m3u8" if captioned else None,
        video=f"{base}/video.mp4",
        progressive=f"{base}/video.mp4?layout=progressive",
        events=f"{base}/events",
        captions=caption_links(base) if captioned else None,
        player=f"{live}/player?link={token}" if webrtc else None,
        whep=f"{live}/whep" if webrtc else None,
        expires_at=datetime.fromtimestamp(expires, UTC),
    )


def caption_links(base: str) -> CaptionLinks:
    """The captions files under a session's folder of links (`base`: the signed playback path or /v1/renders/{id})."""
    return CaptionLinks(**{fmt.value: f"{base}/{fmt.file_name}" for fmt in PUBLISHED_CAPTIONS})


def _signature(key: bytes, session_id: str, expires: int) -> str:
    message = b"\n".join((_PURPOSE, session_id.encode(), str(expires).encode()))
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
