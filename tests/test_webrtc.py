"""WHEP on the real embedded stack: a viewer (an aiortc client) of a live WebRTC session gets its video and Opus
speech from the node holding it, through the API's signalling proxy; bad offers and links are refused with a 4xx
naming the problem, and nothing is left open on the node."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from cli.benches.webrtc import AudioSender, speech_with_onsets
from cli.stack import Stack
from monologue import SAMPLES
from monologue.client import Client
from tests.helpers import api_key, node_media_stats

pytestmark = pytest.mark.timeout(240)
SDP = {"Content-Type": "application/sdp"}


def _live(api_url: str, **options: Any) -> tuple[str, str, str]:
    """A live WebRTC session: (id, its playback token, its audio socket's URL)."""
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc", **options})
    assert session.links.playback is not None and session.audio_ticket is not None
    assert session.links.playback.player is not None and session.links.playback.whep is not None
    assert session.links.playback.whep == f"{api_url}/v1/live/{session.id}/whep"
    return session.id, urlsplit(session.links.playback.stream).path.split("/")[2], session.audio_ticket.url


async def _offer() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver("video", direction="recvonly")
    pc.addTransceiver("audio", direction="recvonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def test_whep_viewer_receives_video_and_speech_while_the_audio_streams(stack: Stack, api_url: str) -> None:
    session_id, token, audio_url = _live(api_url)
    pcm, _ = speech_with_onsets(SAMPLES / "speech.wav", bursts=2)
    sender = AudioSender(audio_url, pcm)
    sender.start()
    whep = f"{api_url}/v1/live/{session_id}/whep"

    async def watch() -> tuple[Any, Any, str]:
        pc, offer = await _offer()
        tracks: dict[str, asyncio.Future[Any]] = {
            k: asyncio.get_running_loop().create_future() for k in ("video", "audio")
        }

        pending: list[asyncio.Future[None]] = []

        @pc.on("track")
        def on_track(track: Any) -> None:
            async def first() -> None:
                tracks[track.kind].set_result(await track.recv())

            pending.append(asyncio.ensure_future(first()))

        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(120):  # 503 until a node holds the session
                answer = await http.post(whep, content=offer, headers={**SDP, "Authorization": f"Bearer {token}"})
                if answer.status_code != 503:
                    break
                await asyncio.sleep(0.5)
            assert answer.status_code == 201, answer.text
            location = answer.headers["Location"]
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            video = await asyncio.wait_for(tracks["video"], 60)
            audio = await asyncio.wait_for(tracks["audio"], 60)
            assert node_media_stats(stack)["peer_connections"] >= 1
            stopped = await http.delete(f"{api_url}{location}", headers={"Authorization": f"Bearer {token}"})
            assert stopped.status_code == 204
        await pc.close()
        return video, audio, location

    video, audio, _ = asyncio.run(watch())
    assert (video.width, video.height) == (512, 512)
    assert video.to_ndarray(format="rgb24").mean() > 10  # the portrait, not a black frame
    assert audio.sample_rate == 48_000
    assert node_media_stats(stack)["peer_connections"] == 0
    sender.join(timeout=60)


@pytest.fixture(scope="module")
def live_session(stack: Stack, api_url: str) -> tuple[str, str]:
    session_id, token, _ = _live(api_url)
    return session_id, token


def _offer_text() -> str:
    async def make() -> str:
        pc, offer = await _offer()
        await pc.close()
        return offer

    return asyncio.run(make())


@pytest.mark.parametrize(
    ("headers", "body", "status", "words"),
    [
        ({"Content-Type": "application/json"}, "OFFER", 415, "Content-Type must be application/sdp"),
        (SDP, "x" * (64 * 1024 + 1), 413, "over 65536 bytes"),
        (SDP, "hello", 400, "not an SDP offer"),
        (SDP, "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n", 400, "no video section"),
        (SDP, "NO_VP8", 400, "include none of H264 or VP8"),
    ],
)
def test_bad_offers_are_refused_naming_the_problem(
    api_url: str, live_session: tuple[str, str], headers: dict[str, str], body: str, status: int, words: str
) -> None:
    session_id, token = live_session
    if body == "OFFER":
        body = _offer_text()
    elif body == "NO_VP8":
        body = "\r\n".join(
            line.replace("VP8/", "VP9/").replace("H264/", "AV1X/") for line in _offer_text().split("\r\n")
        )
    answer = httpx.post(
        f"{api_url}/v1/live/{session_id}/whep",
        content=body,
        headers={**headers, "Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == status and words in answer.text, answer.text


def test_offers_without_a_valid_link_are_refused(api_url: str, live_session: tuple[str, str]) -> None:
    session_id, token = live_session
    other_id, other_token, _ = _live(api_url)
    url = f"{api_url}/v1/live/{session_id}/whep"
    offer = _offer_text()
    assert httpx.post(url, content=offer, headers=SDP, timeout=30).status_code == 401
    forged = token[:-3] + ("AAA" if not token.endswith("AAA") else "BBB")
    refused = httpx.post(url, content=offer, headers={**SDP, "Authorization": f"Bearer {forged}"}, timeout=30)
    assert refused.status_code == 403 and "signature" in refused.text
    other = httpx.post(url, content=offer, headers={**SDP, "Authorization": f"Bearer {other_token}"}, timeout=30)
    assert other.status_code == 403 and other_id in other.text
    assert httpx.get(f"{api_url}/v1/live/{session_id}/player", params={"link": forged}, timeout=30).status_code == 403
    page = httpx.get(f"{api_url}/v1/live/{session_id}/player", params={"link": token}, timeout=30)
    assert page.status_code == 200 and "/whep" in page.text


def test_an_hls_session_has_no_whep(api_url: str) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg")
    assert session.links.playback is not None and session.links.playback.player is None
    token = urlsplit(session.links.playback.stream).path.split("/")[2]
    answer = httpx.post(
        f"{api_url}/v1/live/{session.id}/whep",
        content=_offer_text(),
        headers={**SDP, "Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.status_code == 409 and "delivery=webrtc" in answer.text
