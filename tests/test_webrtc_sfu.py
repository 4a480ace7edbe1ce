"""Live sessions watched through a real SFU (Debian's Janus on loopback, cli/janus.py) on the embedded stack: the node
publishes each WebRTC session once to its own mountpoint, headless Chromium plays the session's player page through
Janus (the page answers Janus's offer) and the mouth follows the speech, while the node holds no viewer's peer
connection; an aiortc viewer through the API's server-offer flow gets frames, holds one seat on the mountpoint and
gives it back on DELETE, a viewer past the session's seats gets 429, one that never answers loses its seat at its
next `/alive` past the answer timeout; bad answers and forged viewer resources get a 4xx naming the problem; once the
session ends, its mountpoint and the node's publisher are gone."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription

from cli.benches.webrtc import AudioSender, speech_with_onsets
from cli.janus import JanusServer, janus_server
from cli.stack import Stack
from monologue import SAMPLES
from monologue.client import Client
from monologue.janus import NO_SUCH_MOUNTPOINT, Janus, JanusError, Mountpoints
from tests.browser import watch_live
from tests.helpers import api_key, node_media_stats, own_stack

pytestmark = pytest.mark.timeout(300)
SDP = {"Content-Type": "application/sdp"}


@pytest.fixture(scope="module")
def janus() -> Iterator[JanusServer]:
    with janus_server() as running:
        yield running


@pytest.fixture(scope="module")
def sfu_stack(tmp_path_factory: pytest.TempPathFactory, janus: JanusServer) -> Iterator[Stack]:
    sfu = janus.sfu(max_viewers_per_session=2, answer_timeout_s=2)
    with own_stack(tmp_path_factory.mktemp("webrtc-sfu"), "webrtc-sfu", sfu=sfu) as stack:
        yield stack


def _mountpoint_viewers(stack: Stack, janus: JanusServer, session_id: str) -> int | None:
    """Viewers of the session's mountpoint, None once it is gone."""

    async def ask() -> int | None:
        handle = await Janus(janus.url, janus.api_secret).open()
        try:
            return await Mountpoints(handle, stack.settings.sfu.mountpoint_secret(session_id)).viewers(session_id)
        except JanusError as err:
            if err.code == NO_SUCH_MOUNTPOINT:
                return None
            raise
        finally:
            await handle.close()

    return asyncio.run(ask())


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.1)


def test_chromium_watches_a_live_session_through_janus(sfu_stack: Stack, janus: JanusServer) -> None:
    figures = watch_live(sfu_stack, bursts=2)
    assert figures.frames > 25 and len(figures.glass_ms) == 2 and min(figures.glass_ms) > 0, figures.lines()
    assert node_media_stats(sfu_stack)["peer_connections"] == 0  # every frame went through Janus
    _wait(lambda: node_media_stats(sfu_stack)["sfu_publishing"] == 0, "the publisher done")
    assert _mountpoint_viewers(sfu_stack, janus, figures.session_id) is None  # the ended session's mountpoint


def test_sfu_viewers_answer_with_patch_and_bad_answers_are_refused(sfu_stack: Stack, janus: JanusServer) -> None:
    url = str(sfu_stack.settings.api.public_url)
    with Client(url, api_key=api_key(url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
    assert session.links.playback is not None and session.links.playback.player is not None
    token = urlsplit(session.links.playback.stream).path.split("/")[2]
    auth = {"Authorization": f"Bearer {token}"}
    whep = f"{url}/v1/live/{session.id}/whep"
    assert 'data-sfu="1"' in httpx.get(session.links.playback.player, timeout=10).text
    assert session.audio_ticket is not None
    pcm, _ = speech_with_onsets(SAMPLES / "speech.wav", bursts=3)  # a live session fails without audio
    sender = AudioSender(session.audio_ticket.url, pcm)
    sender.start()

    async def main() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(240):  # 503 until the session's first chunk is on the SFU
                offer = await http.post(whep, headers=auth)
                if offer.status_code != 503:
                    break
                await asyncio.sleep(0.25)
            assert offer.status_code == 201 and offer.headers["content-type"] == "application/sdp", offer.text
            assert "m=video" in offer.text and "H264" in offer.text and "opus" in offer.text
            viewer = f"{url}{offer.headers['location']}"
            second = await http.post(whep, headers=auth)  # the last seat (2 here), its offer never answered
            assert second.status_code == 201, second.text
            refused = await http.post(whep, headers=auth)
            assert refused.status_code == 429 and "2 viewers on the SFU" in refused.text, refused.text
            # The unanswered viewer says it is there, but past the answer timeout that ends it and frees its seat
            unanswered = f"{url}{second.headers['location']}/alive"
            deadline = time.monotonic() + 60
            while (ended := await http.post(unanswered, headers=auth)).status_code == 204:
                assert time.monotonic() < deadline, "an unanswered viewer kept its seat past the answer timeout"
                await asyncio.sleep(0.2)
            assert ended.status_code == 404 and "did not answer the SFU's offer within 2 s" in ended.text, ended.text
            assert await asyncio.to_thread(_mountpoint_viewers, sfu_stack, janus, session.id) == 1
            forged = viewer[:-2] + ("00" if not viewer.endswith("00") else "11")
            for method, target in (("PATCH", forged), ("POST", f"{forged}/alive"), ("DELETE", forged)):
                refused = await http.request(method, target, headers={**auth, **SDP}, content="v=0\r\n")
                assert refused.status_code == 404 and "no viewer" in refused.text, (method, refused.text)
            refused = await http.patch(viewer, headers={**auth, **SDP}, content="hello")
            assert refused.status_code == 400 and "not an SDP answer" in refused.text
            refused = await http.patch(viewer, headers={**auth, "Content-Type": "text/plain"}, content="v=0")
            assert refused.status_code == 415
            refused = await http.patch(viewer, headers=SDP, content="v=0")
            assert refused.status_code == 401
            refused = await http.post(f"{viewer}/alive", headers={"Authorization": "Bearer not-a-link"})
            assert refused.status_code == 403

            pc = RTCPeerConnection()
            frame: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            readers: list[asyncio.Future[None]] = []

            @pc.on("track")
            def on_track(track: object) -> None:
                async def first() -> None:
                    while track.kind == "video" and not frame.done():  # type: ignore[attr-defined]
                        try:
                            frame.set_result(await track.recv())  # type: ignore[attr-defined]
                        except Exception:  # frames before the first keyframe do not decode
                            continue

                readers.append(asyncio.ensure_future(first()))

            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer.text, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            answered = await http.patch(viewer, headers={**auth, **SDP}, content=pc.localDescription.sdp)
            assert answered.status_code == 204, answered.text
            offered, viewer = viewer, f"{url}{answered.headers['location']}"  # the answered viewer's resource
            assert viewer != offered and viewer.startswith(f"{whep}/sfu-")
            await asyncio.wait_for(frame, 60)
            assert (await http.post(f"{viewer}/alive", headers=auth)).status_code == 204  # answered: past the 2 s
            assert await asyncio.to_thread(_mountpoint_viewers, sfu_stack, janus, session.id) == 1
            assert (await http.delete(viewer, headers=auth)).status_code == 204
            assert await asyncio.to_thread(_mountpoint_viewers, sfu_stack, janus, session.id) == 0
            assert (await http.post(f"{viewer}/alive", headers=auth)).status_code == 404
            await pc.close()

    asyncio.run(main())
    assert node_media_stats(sfu_stack)["peer_connections"] == 0
    sender.join(120)  # the speech ends, then the session
    _wait(lambda: _mountpoint_viewers(sfu_stack, janus, session.id) is None, "the ended session's mountpoint gone")
