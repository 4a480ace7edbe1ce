"""The node's WHEP viewers: one aiortc peer connection per viewer, on the node's event loop.

A viewer's offer gets an answer with the session's video (H.264, else VP8, as the offer prefers) and Opus speech; a
connection not up within `ice_timeout_s`, one that fails or closes, and one DELETEd are closed and forgotten, so a
viewer leaves no peer connection or task behind (`count()` says what is open). At most `max_viewers` per session."""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import structlog
from aiortc import RTCPeerConnection, RTCSessionDescription

from monologue.settings import IceSettings
from node.webrtc.hub import MediaHub
from node.webrtc.ice import rtc_configuration
from node.webrtc.tracks import SessionAudioTrack, SessionVideoTrack, ViewerClock

log = structlog.get_logger("webrtc")

UP = ("connected", "completed")


class OfferRefused(Exception):
    """An offer the node does not take; `status` is the HTTP answer (400: not an offer we can answer, 429: the
    session has its most viewers)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Viewer:
    session_id: str
    pc: RTCPeerConnection
    watchdog: asyncio.Task[None] | None = None


class WhepPeers:
    def __init__(
        self, hub: MediaHub, *, max_viewers: int, ice_timeout_s: float, ice: IceSettings | None = None
    ) -> None:
        self._hub = hub
        self._ice = ice or IceSettings()
        self._max_viewers = max_viewers
        self._ice_timeout_s = ice_timeout_s
        self._viewers: dict[str, Viewer] = {}
        self._closing: set[asyncio.Task[bool]] = set()
        hub.on_end.append(self._session_ended)

    def count(self, session_id: str | None = None) -> int:
        """Open peer connections (of one session, or all)."""
        return sum(1 for v in self._viewers.values() if session_id is None or v.session_id == session_id)

    async def answer(self, session_id: str, offer: str, *, fps: int) -> tuple[str, str]:
        """(resource id, SDP answer) for a viewer's offer."""
        if self.count(session_id) >= self._max_viewers:
            raise OfferRefused(429, f"session {session_id} has {self._max_viewers} viewers, the most it may have")
        pc = RTCPeerConnection(rtc_configuration(self._ice, f"whep-{session_id}"))
        resource = secrets.token_urlsafe(16)
        viewer = self._viewers[resource] = Viewer(session_id, pc)
        try:
            clock = ViewerClock(self._hub.session(session_id, fps=fps, rate=16_000))
            await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
            kinds = {t.kind for t in pc.getTransceivers()}
            if kinds != {"audio", "video"}:
                raise OfferRefused(400, f"the offer must receive audio and video, it has {sorted(kinds) or 'none'}")
            for transceiver in pc.getTransceivers():
                track = SessionVideoTrack(clock) if transceiver.kind == "video" else SessionAudioTrack(clock)
                pc.addTrack(track)
            await pc.setLocalDescription(await pc.createAnswer())
        except OfferRefused:
            await self.close(resource)
            raise
        except (ValueError, RuntimeError) as err:  # aiortc's words for an offer it cannot answer
            await self.close(resource)
            raise OfferRefused(400, f"the SDP offer cannot be answered: {err}") from None

        @pc.on("connectionstatechange")
        async def changed() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close(resource)

        viewer.watchdog = asyncio.create_task(self._drop_unless_up(resource))
        log.info("viewer joined", session_id=session_id, resource=resource, viewers=self.count(session_id))
        return resource, pc.localDescription.sdp

    async def close(self, resource: str) -> bool:
        """Close a viewer's connection; False if there was none."""
        viewer = self._viewers.pop(resource, None)
        if viewer is None:
            return False
        if viewer.watchdog is not None and viewer.watchdog is not asyncio.current_task():
            viewer.watchdog.cancel()
        await viewer.pc.close()
        log.info("viewer left", session_id=viewer.session_id, resource=resource)
        return True

    def session_of(self, resource: str) -> str | None:
        viewer = self._viewers.get(resource)
        return None if viewer is None else viewer.session_id

    def _session_ended(self, session_id: str, finished: bool) -> None:
        """The session completed on this node or went elsewhere: its viewers' connections close (their tracks have
        ended; a moved session's viewers offer again, to its new node)."""
        for resource in [r for r, v in self._viewers.items() if v.session_id == session_id]:
            task = asyncio.ensure_future(self.close(resource))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close_all(self) -> None:
        for resource in list(self._viewers):
            await self.close(resource)

    async def _drop_unless_up(self, resource: str) -> None:
        await asyncio.sleep(self._ice_timeout_s)
        viewer = self._viewers.get(resource)
        if viewer is not None and viewer.pc.iceConnectionState not in UP:
            log.info("viewer dropped: ICE never completed", resource=resource, after_s=self._ice_timeout_s)
            await self.close(resource)
