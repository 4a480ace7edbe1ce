"""The node's WebRTC signalling port (`MONOLOGUE_NODE__MEDIA_PORT`), which only the API talks to (it checks the
viewer's link and the offer first: api/webrtc.py):
- `POST /whep/<session id>?fps=<n>` (body: SDP offer) → 201, the SDP answer, `X-Resource: <id>`;
- `DELETE /whep/<session id>/<resource>` → 204 (404 if gone);
- `GET /webrtc/stats` → open peer connections, the loop's tasks (tests: nothing left behind) and the sessions it
  publishes to an SFU.
A stdlib server on its own threads; each request hops onto the node's event loop, where the peer connections live."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Coroutine
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from monologue.settings import IceSettings, NodeSettings, SfuSettings
from node.webrtc.hub import MediaHub
from node.webrtc.peers import OfferRefused, WhepPeers
from node.webrtc.sfu import SfuPublisher
from node.webrtc.whip import WhipIngress

MAX_OFFER_BYTES = 64 * 1024
_ANSWER_TIMEOUT_S = 30.0
_OFFER = re.compile(r"/(?P<kind>whep|whip)/(?P<session>[0-9a-zA-Z_-]{1,64})")
_RESOURCE = re.compile(r"/(?P<kind>whep|whip)/(?P<session>[0-9a-zA-Z_-]{1,64})/(?P<resource>[A-Za-z0-9_-]{1,64})")


class MediaServer:
    def __init__(
        self, peers: WhepPeers, loop: asyncio.AbstractEventLoop, host: str, port: int, whip: WhipIngress | None = None
    ) -> None:
        self.peers = peers
        self.whip = whip  # WHIP senders (node/webrtc/whip.py); None: the port answers WHEP only
        self.sfu: SfuPublisher | None = None  # the sessions published to an SFU (node/webrtc/sfu.py)
        self._loop = loop
        self._server = ThreadingHTTPServer((host, port), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="node-media", daemon=True).start()

    def url(self, host: str) -> str:
        return f"http://{host}:{self.port}"

    def call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(_ANSWER_TIMEOUT_S)

    def shutdown(self) -> None:
        self._server.shutdown()


def _handler(media: MediaServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            url = urlsplit(self.path)
            match = _OFFER.fullmatch(url.path)
            size = int(self.headers.get("Content-Length") or 0)
            if match is None or not 0 < size <= MAX_OFFER_BYTES:
                self._send(400, b"POST /whep/<session>?fps=<n> with an SDP offer of at most 64 KiB", "text/plain")
                return
            offer = self.rfile.read(size).decode("utf-8", "replace")
            fps = int(parse_qs(url.query).get("fps", ["25"])[0])
            if match["kind"] == "whip" and media.whip is None:
                self._send(404, b"this node takes no WHIP audio", "text/plain")
                return
            try:
                if match["kind"] == "whip" and media.whip is not None:
                    resource, answer = media.call(media.whip.answer(match["session"], offer))
                else:
                    resource, answer = media.call(media.peers.answer(match["session"], offer, fps=fps))
            except OfferRefused as refused:
                self._send(refused.status, str(refused).encode(), "text/plain")
                return
            self._send(201, answer.encode(), "application/sdp", {"X-Resource": resource})

        def do_DELETE(self) -> None:
            match = _RESOURCE.fullmatch(urlsplit(self.path).path)
            whip = media.whip if match is not None and match["kind"] == "whip" else None
            owner = whip if whip is not None else media.peers
            if match is None or owner.session_of(match["resource"]) != match["session"]:
                self._send(404, b"no such viewer or sender", "text/plain")
                return
            if whip is not None:
                media.call(whip.close(match["resource"], end=True))  # a sender's DELETE ends the session's audio
            else:
                media.call(media.peers.close(match["resource"]))
            self._send(204, b"", "text/plain")

        def do_GET(self) -> None:
            if urlsplit(self.path).path != "/webrtc/stats":
                self._send(404, b"try /webrtc/stats", "text/plain")
                return

            async def stats() -> dict[str, int]:
                senders = 0 if media.whip is None else media.whip.count()
                return {
                    "peer_connections": media.peers.count() + senders,
                    "tasks": len(asyncio.all_tasks()),
                    "sfu_publishing": 0 if media.sfu is None else media.sfu.publishing(),
                }

            self._send(200, json.dumps(media.call(stats())).encode(), "application/json")

        def _send(self, status: int, data: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


def start(
    settings: NodeSettings,
    loop: asyncio.AbstractEventLoop,
    whip: WhipIngress | None = None,
    ice: IceSettings | None = None,
    sfu: SfuSettings | None = None,
) -> tuple[MediaServer, MediaHub]:
    """The node's media hub and its signalling port, listening (with `whip`, WHIP audio too; `ice`: STUN/TURN;
    `sfu` with a Janus URL: each live session published to it as well, node/webrtc/sfu.py)."""
    hub = MediaHub(loop, max_sessions=2 * settings.capacity + 2)
    peers = WhepPeers(hub, max_viewers=settings.max_viewers_per_session, ice_timeout_s=settings.ice_timeout_s, ice=ice)
    server = MediaServer(peers, loop, settings.http_host, settings.media_port, whip)
    if sfu is not None and sfu.servers():
        server.sfu = SfuPublisher(hub, sfu)
    return server, hub
