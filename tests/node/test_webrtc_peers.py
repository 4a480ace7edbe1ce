"""The node's WHEP peers without the stack: a viewer that never completes ICE is dropped after the timeout, a session
at its most viewers answers 429, an offer without video is refused; none leaves a peer connection or task behind;
and a viewer that does connect (an aiortc client on loopback) receives the session's frames and speech in sync."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from node.webrtc.hub import MediaHub
from node.webrtc.peers import OfferRefused, WhepPeers
from node.webrtc.tracks import ViewerClock
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(60)


async def _offer(*kinds: str) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    for kind in kinds:
        pc.addTransceiver(kind, direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def test_viewer_that_never_completes_ice_is_dropped_and_leaves_nothing() -> None:
    async def main() -> None:
        peers = WhepPeers(MediaHub(asyncio.get_running_loop()), max_viewers=1, ice_timeout_s=1.0)
        tasks_before = len(asyncio.all_tasks())
        client, offer = await _offer("video", "audio")
        await peers.answer("s1", offer, fps=25)  # the answer is never applied: ICE never starts
        assert peers.count("s1") == 1
        with pytest.raises(OfferRefused) as refused:
            await peers.answer("s1", offer, fps=25)
        assert refused.value.status == 429 and "1 viewers" in str(refused.value)
        await eventually(lambda: peers.count() == 0, what="the viewer dropped after the ICE timeout")
        await client.close()
        await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before, what="its tasks gone")

    asyncio.run(main())


def test_offer_without_video_is_refused_and_leaves_nothing() -> None:
    async def main() -> None:
        peers = WhepPeers(MediaHub(asyncio.get_running_loop()), max_viewers=4, ice_timeout_s=5.0)
        client, offer = await _offer("audio")
        with pytest.raises(OfferRefused) as refused:
            await peers.answer("s1", offer, fps=25)
        assert refused.value.status == 400 and "audio and video" in str(refused.value)
        assert peers.count() == 0
        await client.close()

    asyncio.run(main())


def test_connected_viewer_receives_frames_and_speech_in_display_order() -> None:
    """Chunks handed over out of display order (N0 N1 I0) reach the viewer in order, speech alongside."""

    async def main() -> None:
        hub = MediaHub(asyncio.get_running_loop())
        peers = WhepPeers(hub, max_viewers=4, ice_timeout_s=10.0)
        client, offer = await _offer("video", "audio")
        received: dict[str, asyncio.Future[object]] = {
            kind: asyncio.get_running_loop().create_future() for kind in ("video", "audio")
        }

        pending: list[asyncio.Future[None]] = []

        @client.on("track")
        def on_track(track: object) -> None:
            async def first() -> None:
                received[track.kind].set_result(await track.recv())  # type: ignore[attr-defined]

            pending.append(asyncio.ensure_future(first()))

        resource, answer = await peers.answer("s1", offer, fps=25)
        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        await eventually(lambda: client.connectionState == "connected", what="the viewer connected")
        speech = np.sin(np.arange(640 * 8) / 10).astype(np.float32) * 0.5
        frames = np.zeros((8, 64, 48, 3), np.uint8)
        hub.chunk_made("s1", 0, frames, speech, 25)  # N0: frames 0-7
        hub.chunk_made("s1", 16, frames + 200, speech, 25)  # N1 before I0: held back until I0
        await eventually(lambda: hub.session("s1", fps=25, rate=16_000).ready_until == 8, what="N0 released")
        hub.chunk_made("s1", 8, frames + 100, speech, 25)  # I0
        await eventually(lambda: hub.session("s1", fps=25, rate=16_000).ready_until == 24, what="I0 and N1 released")
        video = await asyncio.wait_for(received["video"], 20)
        audio = await asyncio.wait_for(received["audio"], 20)
        assert (video.width, video.height) == (48, 64)  # type: ignore[attr-defined]
        assert audio.sample_rate == 48_000  # type: ignore[attr-defined]
        assert await peers.close(resource) and peers.count() == 0
        await client.close()

    asyncio.run(main())


def test_a_viewer_that_trails_the_edge_by_more_than_a_chunk_skips_ahead_video_and_speech_together() -> None:
    async def main() -> None:
        media = MediaHub(asyncio.get_running_loop()).session("s1", fps=25, rate=16_000)
        media.add(0, np.zeros((8, 4, 4, 3), np.uint8), np.zeros(640 * 8, np.int16))
        clock = ViewerClock(media)
        assert await clock.start() == 7  # joins at the live edge
        assert clock.catch_up(7) == 7
        for first in range(8, 48, 8):  # the chunks came late, then all at once
            media.add(first, np.zeros((8, 4, 4, 3), np.uint8), np.zeros(640 * 8, np.int16))
        assert clock.catch_up(8) == 8 + (47 - 8 - 10)  # within a chunk (and 2 frames) of the edge again
        assert clock.skipped_frames == 29

    asyncio.run(main())


def test_viewers_of_a_session_that_ended_are_closed() -> None:
    async def main() -> None:
        hub = MediaHub(asyncio.get_running_loop())
        peers = WhepPeers(hub, max_viewers=4, ice_timeout_s=30.0)
        client, offer = await _offer("video", "audio")
        await peers.answer("s1", offer, fps=25)
        hub.session_ended("s1")
        await eventually(lambda: peers.count() == 0, what="the ended session's viewers closed")
        await client.close()

    asyncio.run(main())


def test_a_session_that_moved_away_gives_its_buffer_up_when_a_new_one_needs_room() -> None:
    """A session that moved to another node sends no `session_ended` here: the buffer whose last chunk is oldest ends
    when the hub is full, so a node's memory stays bounded however many sessions pass through it."""

    async def main() -> None:
        hub = MediaHub(asyncio.get_running_loop(), max_sessions=2)
        ended: list[tuple[str, bool]] = []
        hub.on_end.append(lambda session, finished: ended.append((session, finished)))
        frames, speech = np.zeros((8, 16, 16, 3), np.uint8), np.zeros(640 * 8, np.float32)
        for session in ("moved", "stays"):
            hub.chunk_made(session, 0, frames, speech, 25)
        hub.chunk_made("stays", 8, frames, speech, 25)  # "moved" makes no more chunks here
        await eventually(lambda: hub.session("stays", fps=25, rate=16_000).ready_until == 16, what="stays' chunks")
        hub.chunk_made("new", 0, frames, speech, 25)
        await eventually(lambda: ended == [("moved", False)], what="the moved session's buffer ended")
        assert hub.session("stays", fps=25, rate=16_000).ready_until == 16  # still served

    asyncio.run(main())
