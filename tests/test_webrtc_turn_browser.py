"""A live session watched in headless Chromium through a real TURN server (Debian's coturn on loopback): the node
offers only relayed addresses (`MONOLOGUE_ICE__TRANSPORT_POLICY=relay`, as where viewers cannot reach a node's pod),
the player page asks the API for its ICE servers and gets TURN credentials minted for it, and the mouth follows the
speech as without TURN. coturn's log names who allocated: the node (`whep-<session>`) and the page
(`viewer-<session>`), each with the credentials the shared secret made."""

from __future__ import annotations

import asyncio
import html
import json
import re
from collections.abc import Iterator
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from aiortc import RTCPeerConnection

from cli.stack import Stack
from cli.turn import Turn, turn_server
from monologue import SAMPLES
from monologue.client import Client
from monologue.settings_services import IceTransportPolicy
from tests.browser import watch_live
from tests.helpers import api_key, own_stack

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def turn() -> Iterator[Turn]:
    with turn_server() as running:
        yield running


@pytest.fixture(scope="module")
def relayed(tmp_path_factory: pytest.TempPathFactory, turn: Turn) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("webrtc-turn")
    with own_stack(home, "webrtc-turn", ice=turn.ice(IceTransportPolicy.RELAY)) as stack:
        yield stack


def _allocated_by(turn: Turn) -> set[str]:
    """The users (the part after `<expiry>:`) whose allocations coturn granted."""
    users = re.findall(r"user <\d+:([^>]+)>: incoming packet ALLOCATE processed, success", turn.log.read_text())
    return set(users)


def test_chromium_watches_a_live_session_through_the_turn_server(relayed: Stack, turn: Turn) -> None:
    figures = watch_live(relayed, bursts=2)
    assert figures.frames > 25 and len(figures.glass_ms) == 2 and min(figures.glass_ms) > 0, figures.lines()
    assert {f"whep-{figures.session_id}", f"viewer-{figures.session_id}"} <= _allocated_by(turn)


def test_the_ice_servers_need_the_sessions_playback_link(relayed: Stack, turn: Turn) -> None:
    url = str(relayed.settings.api.public_url)
    with Client(url, api_key=api_key(url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
        assert session.links.playback is not None
        token = urlsplit(session.links.playback.stream).path.split("/")[2]  # /play/<token>/…
        ice = f"{url}/v1/live/{session.id}/ice-servers"
        assert httpx.get(ice).status_code == 401
        assert httpx.get(ice, headers={"Authorization": "Bearer not-a-link"}).status_code == 403
        answer = httpx.get(ice, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
        (server,) = answer.json()["ice_servers"]
        assert server["urls"] == [turn.url] and server["username"].endswith(f":viewer-{session.id}")
        # The player page carries the servers for its first connection (credentials minted with the page).
        page = httpx.get(f"{url}/v1/live/{session.id}/player", params={"link": token})
        assert page.status_code == 200, page.text
        found = re.search(r'<body data-ice-servers="([^"]*)"', page.text)
        assert found is not None, page.text[:500]
        (inline,) = json.loads(html.unescape(found[1]))
        assert inline["urls"] == [turn.url] and inline["username"].endswith(f":viewer-{session.id}")
        offered = httpx.post(
            f"{url}/v1/live/{session.id}/whep",
            content=asyncio.run(_offer()),
            headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert offered.status_code == 201, offered.text
        (link,) = offered.headers.get_list("link")  # RFC 9725: the servers beside the answer
        assert link.startswith(f'<{turn.url}>; rel="ice-server"; username="') and 'credential-type="password"' in link
        stop = httpx.delete(urljoin(url, offered.headers["location"]), headers={"Authorization": f"Bearer {token}"})
        assert stop.status_code == 204
        client.cancel(session.id)


async def _offer() -> str:
    pc = RTCPeerConnection()
    for kind in ("video", "audio"):
        pc.addTransceiver(kind, direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    await pc.close()
    return str(pc.localDescription.sdp)
