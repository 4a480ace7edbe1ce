"""The ICE servers of a WebRTC connection (STUN, TURN) from `IceSettings`, with TURN credentials minted per connection
as the TURN REST API has them (draft-uberti-behave-turn-rest; coturn's `use-auth-secret`): the username is
`<expiry unix time>:<who>`, the credential base64(HMAC-SHA1(secret, username)); the TURN server checks it with the
same secret and refuses it after its expiry. Nothing is stored. Used by the API (the player's servers, the `Link`
headers of WHEP/WHIP answers) and the nodes (their peer connections)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Any

from monologue.settings_services import IceSettings

_WHO = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class IceServer:
    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def as_json(self) -> dict[str, Any]:
        """As a browser's RTCIceServer dictionary."""
        out: dict[str, Any] = {"urls": list(self.urls)}
        if self.username is not None:
            out["username"], out["credential"] = self.username, self.credential
        return out

    def link_headers(self) -> list[str]:
        """RFC 9725 (WHIP) `Link` header values, one per URL (rel="ice-server")."""
        extra = ""
        if self.username is not None:
            extra = f'; username="{self.username}"; credential="{self.credential}"; credential-type="password"'
        return [f'<{url}>; rel="ice-server"{extra}' for url in self.urls]


def turn_credential(secret: str, who: str, expires_at: int) -> tuple[str, str]:
    """(username, credential) that a TURN server sharing `secret` accepts until `expires_at` (unix seconds)."""
    username = f"{expires_at}:{_WHO.sub('_', who)}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def ice_servers(settings: IceSettings, who: str, *, now: float) -> list[IceServer]:
    """The servers a connection of `who` (a session's viewer, a node) uses, credentials valid from `now` for the
    settings' TTL. Empty without STUN or TURN configured (loopback and LAN need neither)."""
    servers = [IceServer(tuple(settings.stun_urls))] if settings.stun_urls else []
    if settings.turn_urls and settings.turn_secret is not None:
        expires_at = int(now + settings.credential_ttl_s)
        username, credential = turn_credential(settings.turn_secret.get_secret_value(), who, expires_at)
        servers.append(IceServer(tuple(settings.turn_urls), username, credential))
    return servers
