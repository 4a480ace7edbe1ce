"""WebRTC through a real TURN server (Debian's coturn on loopback, cli/turn.py): a node whose ICE policy is `relay`
offers only addresses the TURN server relays, with credentials it mints from the shared secret (monologue/ice.py),
and a viewer still gets the session's frames, over the relay; with a wrong secret coturn refuses the allocation and
the node offers no address at all. Without STUN/TURN settings a node asks no server (not aiortc's default, Google's
public STUN server)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from pydantic import SecretStr

from cli.turn import Turn, turn_server
from monologue.settings import IceSettings
from monologue.settings_services import IceTransportPolicy
from node.webrtc.hub import MediaHub
from node.webrtc.ice import rtc_configuration
from node.webrtc.peers import WhepPeers
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(120)
_CANDIDATE = re.compile(r"^a=candidate:\S+ \d \S+ \d+ (?P<ip>\S+) (?P<port>\d+) typ (?P<type>\w+)", re.MULTILINE)


@pytest.fixture(scope="module")
def turn() -> Iterator[Turn]:
    with turn_server() as running:
        yield running


def _candidates(sdp: str) -> list[str]:
    return [match["type"] for match in _CANDIDATE.finditer(sdp)]


async def _offer() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection(rtc_configuration(IceSettings(), "viewer"))
    for kind in ("video", "audio"):
        pc.addTransceiver(kind, direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def test_a_relay_only_node_reaches_its_viewer_through_the_turn_server(turn: Turn) -> None:
    async def main() -> None:
        hub = MediaHub(asyncio.get_running_loop())
        peers = WhepPeers(hub, max_viewers=4, ice_timeout_s=20.0, ice=turn.ice(IceTransportPolicy.RELAY))
        allocations = turn.allocations()
        client, offer = await _offer()
        resource, answer = await peers.answer("s1", offer, fps=25)
        assert _candidates(answer) and set(_candidates(answer)) == {"relay"}, answer  # no address of the node's own
        assert turn.allocations() > allocations  # coturn took the node's minted credentials
        frame: asyncio.Future[object] = asyncio.get_running_loop().create_future()

        @client.on("track")
        def on_track(track: object) -> None:
            if track.kind == "video":  # type: ignore[attr-defined]
                asyncio.ensure_future(track.recv()).add_done_callback(  # type: ignore[attr-defined]
                    lambda done: frame.done() or frame.set_result(done.result())
                )

        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await eventually(lambda: client.connectionState == "connected", timeout_s=60, what="connected via the relay")
        video = await asyncio.wait_for(_feed_until(hub, frame), 30)
        assert (video.width, video.height) == (48, 64)  # type: ignore[attr-defined]
        assert await peers.close(resource) and peers.count() == 0
        await client.close()

    asyncio.run(main())


async def _feed_until(hub: MediaHub, frame: asyncio.Future[object]) -> object:
    """Chunks at real time, as a session makes them, until the viewer has a frame (a receiver shows a frame once
    the next one's packets come; a viewer joins at the live edge)."""
    first = 0
    while not frame.done():
        hub.chunk_made("s1", first, np.full((8, 64, 48, 3), 90, np.uint8), np.zeros(640 * 8, np.float32), 25)
        first += 8
        await asyncio.wait([frame], timeout=8 / 25)
    return frame.result()


def test_with_a_wrong_secret_the_relay_only_node_offers_no_address(turn: Turn) -> None:
    async def main() -> None:
        wrong = IceSettings(
            turn_urls=[turn.url], turn_secret=SecretStr("not-" + turn.secret), transport_policy=IceTransportPolicy.RELAY
        )
        peers = WhepPeers(MediaHub(asyncio.get_running_loop()), max_viewers=4, ice_timeout_s=1.0, ice=wrong)
        client, offer = await _offer()
        _, answer = await peers.answer("s1", offer, fps=25)
        assert _candidates(answer) == []  # coturn refused the credentials: nothing to relay through
        await eventually(lambda: peers.count() == 0, what="the viewer dropped after the ICE timeout")
        await client.close()

    asyncio.run(main())


def test_without_settings_a_node_asks_no_stun_server() -> None:
    configuration = rtc_configuration(IceSettings(), "node")
    assert configuration.iceServers == [] and configuration.iceTransportPolicy.value == "all"
