"""A live session published once to an SFU (Janus's Streaming plug-in, monologue/janus.py) for its viewers to watch
through it: the node encodes the session's frames and speech once, on the same tracks a direct viewer gets
(node/webrtc/tracks.py: the live edge, real-time pacing, video and speech in sync), and sends them as RTP (H.264 and
Opus, aiortc's encoders) to the session's mountpoint. Janus fans the stream out to any number of viewers.

The mountpoint is named by the session id and made by whichever node holds the session (`Mountpoints.ensure`): a
session that moves keeps its mountpoint, so its viewers' connections outlive the node loss (Janus takes the new
node's stream on the same ports). A keyframe comes every `keyframe_interval_s` and whenever a viewer asks: Janus
relays its viewers' keyframe requests to the source of the mountpoint's video RTCP, so the stream reports there and
reads what comes back (a joining viewer's first frame needs a keyframe). The mountpoint is destroyed once the
session has finished and its last frames are sent."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from aiortc.codecs.h264 import H264Encoder
from aiortc.codecs.opus import OpusEncoder
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RTCP_PSFB_FIR, RTCP_PSFB_PLI, RtcpPacket, RtcpPsfbPacket, RtcpRrPacket, RtpPacket

from monologue.janus import AUDIO_PT, VIDEO_PT, Janus, JanusError, Mountpoints, Ports
from monologue.settings import SfuSettings
from node.webrtc.hub import MediaHub, SessionMedia
from node.webrtc.tracks import SessionAudioTrack, SessionVideoTrack, ViewerClock

log = structlog.get_logger()
_SEQUENCE = 1 << 16
_TIMESTAMP = 1 << 32
T = TypeVar("T")
CHECK_EVERY_S = 5.0
STOP_GRACE_S = 12.0  # past a request's own timeout (monologue/janus.py: 10 s)


class SfuPublisher:
    """Publishes each live session the hub receives to the SFU, while its media lasts."""

    def __init__(self, hub: MediaHub, sfu: SfuSettings, *, check_every_s: float = CHECK_EVERY_S) -> None:
        """`check_every_s`: how often a session's mountpoint is looked for (made again, e.g. after Janus restarted)."""
        if not sfu.servers():
            raise ValueError("SfuPublisher needs MONOLOGUE_SFU__JANUS_URL")
        api_secret = sfu.api_secret.get_secret_value() if sfu.api_secret else None
        self._janus = {url: Janus(url, api_secret) for url in sfu.servers()}  # each session on one (janus_for)
        self._sfu, self._check_every_s = sfu, check_every_s
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._finished: set[str] = set()
        self.keyframe_requests = 0  # viewers' keyframe requests Janus relayed
        hub.on_start.append(self._started)
        hub.on_end.append(self._ended)

    def _heard(self) -> None:
        self.keyframe_requests += 1

    def publishing(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Stop publishing, leaving the mountpoints (a node that stops hands its sessions to others)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _started(self, session_id: str, media: SessionMedia) -> None:
        old = self._tasks.pop(session_id, None)
        if old is not None:
            old.cancel()
        self._finished.discard(session_id)
        self._tasks[session_id] = asyncio.get_running_loop().create_task(self._publish(session_id, media))

    def _ended(self, session_id: str, finished: bool) -> None:
        if finished:  # the publisher sends what was released, then removes the mountpoint
            self._finished.add(session_id)

    async def _publish(self, session_id: str, media: SessionMedia) -> None:
        try:
            ports = await self._ensure(session_id, media)
            if ports is None:
                return
            log.info("publishing to the SFU", session_id=session_id, video_port=ports.video, audio_port=ports.audio)
            address, interval = self._sfu.rtp_address(session_id), self._sfu.keyframe_interval_s
            stream = RtpStream(media, address, ports, interval, self._heard)
            done = asyncio.Event()
            watching = asyncio.ensure_future(self._watch(session_id, media, stream, done))
            try:
                await stream.run()
            finally:
                await _stop_between_requests(watching, done)
            if session_id in self._finished:
                await self._mountpoints(session_id, lambda mounts: mounts.destroy(session_id))
        except JanusError as err:
            log.warning("SFU publishing stopped", session_id=session_id, error=str(err))
        finally:
            if self._tasks.get(session_id) is asyncio.current_task():
                del self._tasks[session_id]
            self._finished.discard(session_id)

    async def _ensure(self, session_id: str, media: SessionMedia) -> Ports | None:
        """The session's mountpoint's ports, trying again every `check_every_s` while Janus does not answer; None
        once the session's media has ended."""
        while not media.ended:
            try:
                return await self._mountpoints(session_id, lambda mounts: mounts.ensure(session_id))
            except JanusError as err:
                log.warning("the SFU did not make the session's mountpoint", session_id=session_id, error=str(err))
            await asyncio.sleep(self._check_every_s)
        return None

    async def _watch(self, session_id: str, media: SessionMedia, stream: RtpStream, done: asyncio.Event) -> None:
        """Look for the mountpoint now and then: one that is gone (Janus restarted) is made again, and the stream
        sent to its new ports. Ends at the next check once `done` is set."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), self._check_every_s)
                return
            ports = await self._ensure(session_id, media)
            if ports is None:
                return
            if ports != stream.ports:
                log.info("the session's mountpoint was made again", session_id=session_id, video_port=ports.video)
                stream.retarget(ports)

    async def _mountpoints(self, session_id: str, act: Callable[[Mountpoints], Awaitable[T]]) -> T:
        handle = await self._janus[self._sfu.janus_for(session_id)].open()
        try:
            return await act(Mountpoints(handle, self._sfu.mountpoint_secret(session_id)))
        finally:
            await handle.close()


async def _stop_between_requests(task: asyncio.Task[None], done: asyncio.Event) -> None:
    """Let `task` end at its next check rather than cancel it inside a request to Janus (a request cancelled while
    it connects leaves a coroutine never awaited behind); cancelled after all when Janus keeps it waiting."""
    done.set()
    _, pending = await asyncio.wait([task], timeout=STOP_GRACE_S)
    for still in pending:
        still.cancel()


class RtpStream:
    """One session's tracks as RTP to a mountpoint's two ports, until the session's media ends."""

    def __init__(
        self, media: SessionMedia, host: str, ports: Ports, keyframe_interval_s: float, heard: Callable[[], None]
    ) -> None:
        self._clock = ViewerClock(media)
        self._video, self._audio = SessionVideoTrack(self._clock), SessionAudioTrack(self._clock)
        self._host, self.ports = host, ports
        self._keyframe_every = max(1, round(keyframe_interval_s * media.fps))
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self._video_packets = _Packets(VIDEO_PT, (host, ports.video), self._socket)
        self._audio_packets = _Packets(AUDIO_PT, (host, ports.audio), self._socket)
        self._feedback = _KeyframeRequests(self._socket, (host, ports.video_rtcp), self._video_packets.ssrc, heard)

    def retarget(self, ports: Ports) -> None:
        """Send to a mountpoint's new ports (made again): its viewers start from a keyframe."""
        self.ports = ports
        self._video_packets.to = (self._host, ports.video)
        self._audio_packets.to = (self._host, ports.audio)
        self._feedback.port = ports.video_rtcp
        self._feedback.ask()

    async def run(self) -> None:
        try:
            await asyncio.gather(self._send_video(), self._send_audio())
        finally:
            self._feedback.close()
            self._video.stop()
            self._audio.stop()
            self._socket.close()

    async def _send_video(self) -> None:
        encoder, packets, feedback = H264Encoder(), self._video_packets, self._feedback
        loop, since_keyframe = asyncio.get_running_loop(), self._keyframe_every
        while True:
            try:
                frame = await self._video.recv()
            except MediaStreamError:
                return
            keyframe = since_keyframe >= self._keyframe_every or feedback.wanted()
            payloads, timestamp = await loop.run_in_executor(None, encoder.encode, frame, keyframe)
            packets.send(payloads, timestamp, marks=True)
            since_keyframe = 1 if keyframe else since_keyframe + 1
            feedback.report()

    async def _send_audio(self) -> None:
        encoder, packets = OpusEncoder(), self._audio_packets
        while True:
            try:
                frame = await self._audio.recv()
            except MediaStreamError:
                return
            payloads, timestamp = encoder.encode(frame)
            if payloads:
                packets.send(payloads, timestamp, marks=False)


class _Packets:
    """RTP packets of one stream: its own SSRC, sequence numbers and timestamp origin (as an RTP sender picks). The
    node that takes a moved session over starts streams of its own: Janus stitches them onto its viewers' streams."""

    def __init__(self, payload_type: int, to: tuple[str, int], udp: socket.socket) -> None:
        self._type, self.to, self._socket = payload_type, to, udp
        self.ssrc = secrets.randbits(32)
        self._sequence = secrets.randbits(16)
        self._origin = secrets.randbits(32)

    def send(self, payloads: list[bytes], timestamp: int, *, marks: bool) -> None:
        """One media frame's payloads at `timestamp` (the stream's clock); `marks`: the marker bit on the last (a
        video frame's end)."""
        for index, payload in enumerate(payloads):
            packet = RtpPacket(
                payload_type=self._type,
                marker=int(marks and index == len(payloads) - 1),
                sequence_number=self._sequence,
                timestamp=(self._origin + timestamp) % _TIMESTAMP,
                ssrc=self.ssrc,
                payload=payload,
            )
            self._sequence = (self._sequence + 1) % _SEQUENCE
            try:
                self._socket.sendto(packet.serialize(), self.to)
            except (BlockingIOError, OSError) as err:  # a full send buffer or an unreachable SFU: RTP is lossy
                log.debug("RTP packet not sent", error=str(err))


class _KeyframeRequests:
    """A viewer's keyframe requests (RTCP PLI or FIR), which Janus relays to the source of the mountpoint's video
    RTCP: the stream sends a receiver report there once a second (so Janus knows where it is) and reads what comes
    back on the same socket. Without an RTCP port nothing is asked and the interval's keyframes serve alone."""

    def __init__(self, udp: socket.socket, to: tuple[str, int | None], ssrc: int, heard: Callable[[], None]) -> None:
        self._socket, self._host, self.port, self._ssrc = udp, to[0], to[1], ssrc
        self._asked = False
        self._heard = heard
        self._reported = 0.0
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(udp.fileno(), self._read)

    def ask(self) -> None:
        self._asked = True

    def wanted(self) -> bool:
        asked, self._asked = self._asked, False
        return asked

    def report(self) -> None:
        now = self._loop.time()
        if self.port is None or now - self._reported < 1.0:
            return
        self._reported = now
        with contextlib.suppress(OSError):
            self._socket.sendto(bytes(RtcpRrPacket(ssrc=self._ssrc)), (self._host, self.port))

    def close(self) -> None:
        self._loop.remove_reader(self._socket.fileno())

    def _read(self) -> None:
        try:
            data = self._socket.recv(2048)
            packets = RtcpPacket.parse(data)
        except (OSError, ValueError):
            return
        if any(isinstance(p, RtcpPsfbPacket) and p.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR) for p in packets):
            self._asked = True
            self._heard()
