"""A live session published once to a real SFU (Debian's Janus on loopback, cli/janus.py) and watched through it: two
aiortc viewers receive the session's frames, in the order made, while the node holds no peer connection; when the
session moves (one node's publisher stops, another's starts on the same mountpoint) the viewers' connections stay up
and show the new node's frames; once the session finishes its mountpoint is gone. Janus's own refusals (no such
mountpoint) come back as JanusError with the plug-in's code; a mountpoint lost behind the node's back (Janus
restarted) is made again and watched."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

from cli.janus import JanusServer, janus_server
from monologue.janus import NO_SUCH_MOUNTPOINT, Handle, Janus, JanusError, Mountpoints
from node.webrtc.hub import MediaHub
from node.webrtc.sfu import SfuPublisher
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(120)
CHUNK = 8


@pytest.fixture(scope="module")
def janus() -> Iterator[JanusServer]:
    with janus_server() as running:
        yield running


class Viewer:
    """An aiortc client watching a mountpoint through Janus (Janus offers, the viewer answers), keeping each
    frame's mean brightness."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.levels: list[float] = []
        self.audio_frames = 0
        self._readers: list[asyncio.Task[None]] = []
        self.pc.on("track", self._track)

    async def watch(self, janus: Janus, session_id: str) -> Handle:
        handle = await janus.open()
        offer = await handle.request({"request": "watch", "id": session_id})
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer["jsep"]["sdp"], type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        started = await handle.request({"request": "start"}, {"type": "answer", "sdp": self.pc.localDescription.sdp})
        assert started["result"]["status"] == "starting"
        return handle

    def _track(self, track: object) -> None:
        async def read() -> None:
            while True:
                try:
                    frame = await track.recv()  # type: ignore[attr-defined]
                except MediaStreamError:  # the connection closed
                    return
                if track.kind == "video":  # type: ignore[attr-defined]
                    self.levels.append(float(frame.to_ndarray(format="gray").mean()))
                else:
                    self.audio_frames += 1

        self._readers.append(asyncio.ensure_future(read()))

    async def close(self) -> None:
        for reader in self._readers:
            reader.cancel()
        await self.pc.close()


async def _feed(hub: MediaHub, session_id: str, level: int, stop: asyncio.Event, first: int = 0) -> int:
    """Chunks of flat frames at `level` (and a tone), at the session's pace, until `stop`; the next frame number."""
    speech = (np.sin(np.arange(640 * CHUNK) / 7) * 0.3).astype(np.float32)
    frame = first
    while not stop.is_set():
        hub.chunk_made(session_id, frame, np.full((CHUNK, 64, 64, 3), level, np.uint8), speech, 25)
        frame += CHUNK
        await asyncio.sleep(CHUNK / 25)
    return frame


def test_viewers_watch_through_janus_and_stay_connected_when_the_session_moves(janus: JanusServer) -> None:
    async def main() -> None:
        # Keyframes only when asked: a viewer's first frame then shows that Janus relayed its keyframe request.
        settings, sid = janus.sfu().model_copy(update={"keyframe_interval_s": 10.0}), "live-sfu-1"
        client = Janus(janus.url, janus.api_secret)
        first_node = MediaHub(asyncio.get_running_loop())
        publisher = SfuPublisher(first_node, settings)
        stop_first = asyncio.Event()
        feeding = asyncio.ensure_future(_feed(first_node, sid, 60, stop_first))
        await eventually(lambda: publisher.publishing() == 1, what="the node publishing")
        mounts = Mountpoints(await client.open(), settings.mountpoint_secret(sid))
        await eventually_async(lambda: _exists(mounts, sid), what="the session's mountpoint")
        viewers = [Viewer(), Viewer()]
        handles = [await viewer.watch(client, sid) for viewer in viewers]
        assert await mounts.viewers(sid) == 2
        await eventually(lambda: all(len(v.levels) >= 10 and v.audio_frames >= 10 for v in viewers), what="frames")
        assert all(abs(level - 60) < 8 for viewer in viewers for level in viewer.levels)
        assert publisher.keyframe_requests >= 1

        # The session moves: the first node is lost, another node publishes to the same mountpoint.
        stop_first.set()
        next_frame = await feeding
        await publisher.close()
        second_node = MediaHub(asyncio.get_running_loop())
        second = SfuPublisher(second_node, settings)
        stop_second = asyncio.Event()
        feeding = asyncio.ensure_future(_feed(second_node, sid, 200, stop_second, first=next_frame))
        await eventually(
            lambda: all(sum(abs(level - 200) < 8 for level in v.levels) >= 10 for v in viewers),
            what="the second node's frames on the same connections",
        )
        assert all(viewer.pc.connectionState == "connected" for viewer in viewers)
        assert await mounts.viewers(sid) == 2

        stop_second.set()
        await feeding
        second_node.session_ended(sid)  # the session finished: the mountpoint goes once its frames are sent
        await eventually_async(lambda: _gone(mounts, sid), what="the mountpoint destroyed")
        await eventually(lambda: second.publishing() == 0, what="the publisher done")
        for viewer, handle in zip(viewers, handles, strict=True):
            await viewer.close()
            await handle.close()

    asyncio.run(main())


def test_a_mountpoint_that_is_gone_is_made_again_and_watched(janus: JanusServer) -> None:
    """Janus restarted (here: the mountpoint destroyed behind the node's back): the publisher makes it again within
    its check interval and sends there; a new viewer watches and gets frames."""

    async def main() -> None:
        settings, sid = janus.sfu(), "live-sfu-again"
        client = Janus(janus.url, janus.api_secret)
        hub = MediaHub(asyncio.get_running_loop())
        publisher = SfuPublisher(hub, settings, check_every_s=0.2)
        stop = asyncio.Event()
        feeding = asyncio.ensure_future(_feed(hub, sid, 120, stop))
        mounts = Mountpoints(await client.open(), settings.mountpoint_secret(sid))
        await eventually_async(lambda: _exists(mounts, sid), what="the session's mountpoint")
        await mounts.destroy(sid)
        await eventually_async(lambda: _exists(mounts, sid), what="the mountpoint made again")
        viewer = Viewer()
        handle = await viewer.watch(client, sid)
        await eventually(lambda: len(viewer.levels) >= 5, what="frames from the mountpoint made again")
        assert all(abs(level - 120) < 8 for level in viewer.levels)
        stop.set()
        await feeding
        hub.session_ended(sid)
        await eventually_async(lambda: _gone(mounts, sid), what="the mountpoint destroyed")
        await eventually(lambda: publisher.publishing() == 0, what="the publisher done")
        await viewer.close()
        await handle.close()

    asyncio.run(main())


def test_with_two_janus_servers_each_session_is_published_to_its_own(janus: JanusServer) -> None:
    """Sessions spread over the servers listed (`SfuSettings.janus_for`): each one's mountpoint is made on its own
    server only, and a viewer there gets its frames."""

    async def main(other: JanusServer) -> None:
        settings = janus.sfu(janus_url=f"{janus.url},{other.url}")
        by_server = {settings.janus_for(f"live-spread-{n}"): f"live-spread-{n}" for n in range(20)}
        assert set(by_server) == {janus.url, other.url}  # 20 sessions land on both
        hub = MediaHub(asyncio.get_running_loop())
        publisher = SfuPublisher(hub, settings, check_every_s=0.2)
        stop = asyncio.Event()
        feeding = [
            asyncio.ensure_future(_feed(hub, sid, 60 + 100 * n, stop)) for n, sid in enumerate(by_server.values())
        ]
        for n, (url, sid) in enumerate(by_server.items()):
            elsewhere = other.url if url == janus.url else janus.url
            secret = settings.mountpoint_secret(sid)
            levels = await _published_on_only(
                Janus(url, janus.api_secret), Janus(elsewhere, janus.api_secret), sid, secret
            )
            assert all(abs(value - (60 + 100 * n)) < 8 for value in levels)
        stop.set()
        await asyncio.gather(*feeding)
        for sid in by_server.values():  # the sessions end: their publishers stop between checks, not mid-request
            hub.session_ended(sid)
        await eventually(lambda: publisher.publishing() == 0, what="the publishers done")

    with janus_server(api_secret=janus.api_secret) as other:  # one API secret for all a deployment's servers
        asyncio.run(main(other))


def test_viewers_that_go_silent_leave_no_seat_behind() -> None:
    """A viewer takes a seat on the mountpoint with Janus's offer. One that never answers and one whose connection
    never comes up (its peer closed before ICE) both lose it once they stop saying they are there: Janus ends their
    sessions after its session_timeout (here 2 s), seat, handle and all."""

    async def main(janus: JanusServer) -> None:
        settings, sid = janus.sfu(), "live-sfu-seats"
        client = Janus(janus.url, janus.api_secret)

        async def seats() -> int:
            handle = await client.open()  # a session of its own each time: the test's would time out as well
            try:
                return await Mountpoints(handle, settings.mountpoint_secret(sid)).viewers(sid)
            finally:
                await handle.close()

        owner = await client.open()
        await Mountpoints(owner, settings.mountpoint_secret(sid)).ensure(sid)
        await owner.close()
        silent = await client.open()
        await silent.request({"request": "watch", "id": sid})  # Janus's offer, never answered
        never_up = Viewer()
        await never_up.watch(client, sid)  # answered, then the peer goes before ICE completes
        assert await seats() == 2
        await never_up.close()
        await eventually_async(lambda: _zero(seats), timeout_s=30, what="both seats given back")

    with janus_server(viewer_timeout_s=2) as janus:
        asyncio.run(main(janus))


async def _published_on_only(owner: Janus, stranger: Janus, sid: str, secret: str) -> list[float]:
    """The session's mountpoint is on `owner` and not on `stranger`; a viewer through `owner` gets its frames (their
    levels are returned)."""
    ours, theirs = await owner.open(), await stranger.open()
    mounts = Mountpoints(ours, secret)
    await eventually_async(lambda: _exists(mounts, sid), what=f"{sid}'s mountpoint on its server")
    assert await _gone(Mountpoints(theirs, secret), sid)
    viewer = Viewer()
    handle = await viewer.watch(owner, sid)
    await eventually(lambda: len(viewer.levels) >= 3, what=f"{sid}'s frames through its server")
    await viewer.close()
    for opened in (handle, ours, theirs):
        await opened.close()
    return viewer.levels


async def _zero(count: Callable[[], Awaitable[int]]) -> bool:
    return await count() == 0


def test_janus_refusals_carry_the_plugin_error_code(janus: JanusServer) -> None:
    async def main() -> None:
        handle = await Janus(janus.url, janus.api_secret).open()
        with pytest.raises(JanusError) as refused:
            await handle.request({"request": "watch", "id": "no-such-session"})
        assert refused.value.code == NO_SUCH_MOUNTPOINT
        await handle.close()
        with pytest.raises(JanusError, match="Unauthorized"):
            await Janus(janus.url, "wrong secret").open()

    asyncio.run(main())


async def _exists(mounts: Mountpoints, session_id: str) -> bool:
    try:
        await mounts.viewers(session_id)
    except JanusError as err:
        if err.code == NO_SUCH_MOUNTPOINT:
            return False
        raise
    return True


async def _gone(mounts: Mountpoints, session_id: str) -> bool:
    return not await _exists(mounts, session_id)


async def eventually_async(check, *, timeout_s: float = 30.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(0.05)
