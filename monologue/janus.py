"""A small client of Janus's HTTP API (https://janus.conf.meetecho.com/docs/rest.html) for the one SFU Monologue
can put between a live session's node and its viewers: Janus's Streaming plug-in. Two users:
- a node publishes each WebRTC live session once: it makes an RTP mountpoint (`Mountpoints.ensure`) and sends H.264
  and Opus to its ports (node/webrtc/sfu.py); the mountpoint outlives a node loss, so viewers stay connected while
  the session moves and another node sends to the same ports;
- the API signals a viewer (api/sfu.py): `watch` gives Janus's SDP offer, `start` takes the viewer's answer.

Janus 1.1.2 (Debian 12's package) offers to a viewer itself: it takes a viewer's offer (the WHEP way) only from
1.1.4 on (its PR 3199), hence the server-offer flow. Plain httpx, no torch or aiortc: the API imports it."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import httpx

from monologue.tls import tls_context

STREAMING = "janus.plugin.streaming"
VIDEO_PT, AUDIO_PT = 96, 111
H264_FMTP = "profile-level-id=42e01f;packetization-mode=1"  # constrained baseline, what aiortc's encoder makes
NO_SUCH_MOUNTPOINT = 455  # the Streaming plug-in's JANUS_STREAMING_ERROR_NO_SUCH_MOUNTPOINT
MOUNTPOINT_EXISTS = 456  # JANUS_STREAMING_ERROR_CANT_CREATE (an id already taken)
_TIMEOUT_S = 10.0
_EVENT_WAIT_S = 15


class JanusError(Exception):
    """Janus refused a request (`code`: Janus's or the plug-in's error code) or did not answer (`code` 0)."""

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Janus:
    """Where Janus's HTTP API is (e.g. http://127.0.0.1:8088/janus) and its API secret (`janus -a`), if it has one."""

    url: str
    api_secret: str | None = None

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """One request; its answer when Janus says `success` or `ack`, else JanusError."""
        message = {**body, "transaction": secrets.token_hex(8)}
        if self.api_secret:
            message["apisecret"] = self.api_secret
        try:
            async with httpx.AsyncClient(timeout=_TIMEOUT_S, verify=tls_context()) as client:
                answer = (await client.post(f"{self.url}{path}", json=message)).json()
        except (httpx.HTTPError, ValueError) as err:
            raise JanusError(f"Janus at {self.url} did not answer: {err}") from None
        return _checked(answer)

    async def next_event(self, session: int) -> dict[str, Any]:
        """The session's next event (a long poll of up to `_EVENT_WAIT_S`); JanusError when none comes."""
        query = f"?maxev=1&rid={secrets.randbelow(2**31)}"
        if self.api_secret:
            query += f"&apisecret={self.api_secret}"
        try:
            async with httpx.AsyncClient(timeout=_EVENT_WAIT_S + 5, verify=tls_context()) as client:
                answer = (await client.get(f"{self.url}/{session}{query}")).json()
        except (httpx.HTTPError, ValueError) as err:
            raise JanusError(f"Janus at {self.url} sent no event: {err}") from None
        if answer.get("janus") == "keepalive":
            raise JanusError(f"Janus sent no event within {_EVENT_WAIT_S} s")
        return _checked(answer)

    async def open(self) -> Handle:
        """A new Janus session with a handle on the Streaming plug-in."""
        session = (await self.call("", {"janus": "create"}))["data"]["id"]
        try:
            handle = (await self.call(f"/{session}", {"janus": "attach", "plugin": STREAMING}))["data"]["id"]
        except JanusError:
            await self.call(f"/{session}", {"janus": "destroy"})
            raise
        return Handle(self, int(session), int(handle))


@dataclass(frozen=True)
class Handle:
    """A Janus session and its Streaming plug-in handle; `resource` names both (what the API gives a viewer)."""

    janus: Janus
    session: int
    handle: int

    @property
    def resource(self) -> str:
        return f"{self.session}-{self.handle}"

    @classmethod
    def of(cls, janus: Janus, resource: str) -> Handle | None:
        session, _, handle = resource.partition("-")
        return cls(janus, int(session), int(handle)) if session.isdigit() and handle.isdigit() else None

    async def request(self, body: dict[str, Any], jsep: dict[str, str] | None = None) -> dict[str, Any]:
        """A plug-in request: a synchronous one's data; for an asynchronous one (watch, start) its event, with its
        `jsep` where Janus sends one. JanusError carries the plug-in's own error code."""
        message: dict[str, Any] = {"janus": "message", "body": body}
        if jsep is not None:
            message["jsep"] = jsep
        answer = await self.janus.call(f"/{self.session}/{self.handle}", message)
        if answer["janus"] == "ack":
            answer = await self._event()
        data = answer.get("plugindata", {}).get("data", {})
        if "error_code" in data:
            raise JanusError(f"Janus's Streaming plug-in: {data.get('error')}", int(data["error_code"]))
        return {**data, **({"jsep": answer["jsep"]} if "jsep" in answer else {})}

    async def _event(self) -> dict[str, Any]:
        while True:
            event = await self.janus.next_event(self.session)
            if event.get("sender") == self.handle and "plugindata" in event:
                return event

    async def keepalive(self) -> None:
        """Keep the Janus session (a viewer's seat) from timing out."""
        await self.janus.call(f"/{self.session}", {"janus": "keepalive"})

    async def close(self) -> None:
        """Hang up and destroy the session (its handle and peer connection with it)."""
        await self.janus.call(f"/{self.session}", {"janus": "destroy"})


@dataclass(frozen=True)
class Ports:
    """Where a mountpoint takes RTP: video (H.264, pt 96) and audio (Opus, pt 111); `video_rtcp`: where it takes the
    video's RTCP, and from whose sender it learns where to send its viewers' keyframe requests."""

    video: int
    audio: int
    video_rtcp: int | None = None


class Mountpoints:
    """Create, find and destroy a session's RTP mountpoint, through one handle."""

    def __init__(self, handle: Handle, secret: str) -> None:
        self._handle = handle
        self._secret = secret  # each mountpoint's own secret: the ports are shown only to whoever holds it

    async def ensure(self, session_id: str) -> Ports:
        """The session's mountpoint's ports, made now unless it exists (a moved session keeps its viewers)."""
        try:
            return await self._ports_of(session_id)
        except JanusError as err:
            if err.code != NO_SUCH_MOUNTPOINT:
                raise
        try:
            created = await self._handle.request(self._create(session_id))
            return _ports(created["stream"]["ports"])
        except JanusError as err:
            if err.code != MOUNTPOINT_EXISTS:  # made meanwhile by another node
                raise
        return await self._ports_of(session_id)

    async def _ports_of(self, session_id: str) -> Ports:
        info = await self._handle.request({"request": "info", "id": session_id, "secret": self._secret})
        return _ports(info["info"]["media"])

    async def viewers(self, session_id: str) -> int:
        """Viewers of the session's mountpoint now (JanusError 455 once it is gone)."""
        info = await self._handle.request({"request": "info", "id": session_id, "secret": self._secret})
        return int(info["info"].get("viewers", 0))

    async def destroy(self, session_id: str) -> None:
        """Remove the mountpoint (its viewers are hung up); nothing when it is gone already."""
        try:
            await self._handle.request({"request": "destroy", "id": session_id, "secret": self._secret})
        except JanusError as err:
            if err.code != NO_SUCH_MOUNTPOINT:
                raise

    def _create(self, session_id: str) -> dict[str, Any]:
        return {
            "request": "create",
            "type": "rtp",
            "id": session_id,
            "description": f"live session {session_id}",
            "secret": self._secret,
            "is_private": True,
            "media": [
                {
                    "type": "video",
                    "mid": "v",
                    "port": 0,
                    "rtcpport": 0,
                    "pt": VIDEO_PT,
                    "codec": "h264",
                    "fmtp": H264_FMTP,
                },
                {"type": "audio", "mid": "a", "port": 0, "pt": AUDIO_PT, "codec": "opus"},
            ],
        }


def _ports(media: list[dict[str, Any]]) -> Ports:
    """From a create answer (`rtcp_port`) or an info answer (`rtcpport`)."""
    ports = {item["type"]: item for item in media if "port" in item}
    if set(ports) != {"video", "audio"}:
        raise JanusError(f"Janus showed no video and audio ports for the mountpoint: {media}")
    rtcp = ports["video"].get("rtcp_port", ports["video"].get("rtcpport"))
    return Ports(int(ports["video"]["port"]), int(ports["audio"]["port"]), None if rtcp is None else int(rtcp))


def _checked(answer: dict[str, Any]) -> dict[str, Any]:
    if answer.get("janus") == "error":
        error = answer.get("error", {})
        raise JanusError(f"Janus: {error.get('reason', answer)}", int(error.get("code", 0)))
    return answer
