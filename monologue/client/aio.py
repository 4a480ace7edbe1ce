"""`AsyncClient`: `Client`'s methods on httpx.AsyncClient, awaited (the same requests and models: `_common.py`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import tenacity

from monologue.captions import CaptionFormat
from monologue.errors import ClientError
from monologue.schemas import (
    AssetKind,
    AssetPublic,
    AudioTicket,
    AvatarList,
    AvatarPublic,
    RenderList,
    RenderPublic,
    WebhookDeliveryList,
    WebhookEndpointCreated,
    WebhookEndpointList,
    WebhookEvent,
)

from ._common import (
    CONNECT_RETRIES,
    CREATE_ATTEMPTS,
    STREAM_TIMEOUT,
    Call,
    DownloadProgress,
    EventReader,
    Input,
    Layout,
    Progress,
    asset_call,
    auth,
    avatar_call,
    captions_call,
    captions_text,
    content_length,
    create_call,
    create_retries,
    ended,
    finished,
    parse,
    progress_event,
    raise_for,
)


class AsyncClient:
    """`async with AsyncClient(url, api_key=key) as client: ...` (or `await client.close()`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        create_attempts: int = CREATE_ATTEMPTS,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._create_retries = create_retries(create_attempts)
        transport = transport or httpx.AsyncHTTPTransport(retries=CONNECT_RETRIES)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=auth(api_key), timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def create_render(
        self,
        *,
        portrait: Input = None,
        audio: Input = None,
        portrait_url: str | None = None,
        audio_url: str | None = None,
        options: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        callback_url: str | None = None,
        avatar: AvatarPublic | str | None = None,
    ) -> RenderPublic:
        inputs = {"portrait": (portrait, portrait_url), "audio": (audio, audio_url)}
        call = create_call(
            "/v1/renders", inputs, options, idempotency_key, metadata=metadata, callback_url=callback_url, avatar=avatar
        )
        return await self._create(call)

    async def create_live(
        self,
        *,
        portrait: Input = None,
        portrait_url: str | None = None,
        options: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        metadata: dict[str, Any] | None = None,
        callback_url: str | None = None,
        avatar: AvatarPublic | str | None = None,
    ) -> RenderPublic:
        inputs = {"portrait": (portrait, portrait_url)}
        call = create_call(
            "/v1/sessions",
            inputs,
            options,
            idempotency_key,
            metadata=metadata,
            callback_url=callback_url,
            avatar=avatar,
        )
        return await self._create(call)

    async def get(self, session_id: str) -> RenderPublic:
        return parse(await self._send(Call("GET", f"/v1/renders/{session_id}")), RenderPublic)

    async def list_sessions(self, *, status: str | None = None, limit: int = 50, offset: int = 0) -> list[RenderPublic]:
        params: dict[str, Any] = {"limit": limit, "offset": offset} | ({"status": status} if status else {})
        return parse(await self._send(Call("GET", "/v1/renders", params=params)), RenderList).items

    async def cancel(self, session_id: str) -> RenderPublic:
        return parse(await self._send(Call("POST", f"/v1/renders/{session_id}/cancel")), RenderPublic)

    async def resume(self, session_id: str) -> RenderPublic:
        return parse(await self._send(Call("POST", f"/v1/renders/{session_id}/resume")), RenderPublic)

    async def ticket(self, session_id: str) -> AudioTicket:
        return parse(await self._send(Call("POST", f"/v1/sessions/{session_id}/ticket")), AudioTicket)

    async def events(
        self, session_id: str, *, last_event_id: str | None = None, timeout_s: float | None = None
    ) -> AsyncIterator[RenderPublic]:
        last = last_event_id
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise ClientError(f"session {session_id} did not end within {timeout_s:.0f} s")
            headers = {"Accept": "text/event-stream"} | ({"Last-Event-ID": last} if last else {})
            reader = EventReader()
            path = f"/v1/renders/{session_id}/events"
            try:
                async with self._http.stream("GET", path, headers=headers, timeout=STREAM_TIMEOUT) as answer:
                    if answer.status_code == 204:
                        return
                    if answer.is_error:
                        await answer.aread()
                        raise_for(answer)
                    async for line in answer.aiter_lines():
                        for event in reader.feed(line):
                            session = progress_event(event)
                            if session is not None:
                                yield session
                                if ended(session):
                                    return
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout, httpx.ConnectError):
                await asyncio.sleep(0.5)
            last = reader.last_id or last

    async def wait(
        self, session_id: str, *, on_progress: Progress | None = None, timeout_s: float = 3600.0
    ) -> RenderPublic:
        last: RenderPublic | None = None
        async for session in self.events(session_id, timeout_s=timeout_s):
            last = session
            if on_progress is not None:
                on_progress(session)
        return finished(last if last is not None and ended(last) else await self.get(session_id))

    async def poll(
        self, session_id: str, until: Callable[[RenderPublic], bool], *, poll_s: float = 0.5, timeout_s: float = 600.0
    ) -> RenderPublic:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            session = await self.get(session_id)
            if until(session):
                return session
            await asyncio.sleep(poll_s)
        raise ClientError(f"session {session_id} did not get there within {timeout_s:.0f} s")

    async def download(
        self,
        session_id: str,
        output: Path,
        *,
        layout: Layout = Layout.FRAGMENTED,
        on_progress: DownloadProgress | None = None,
    ) -> int:
        output.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        path = f"/v1/renders/{session_id}/video.mp4"
        async with self._http.stream("GET", path, params={"layout": str(layout)}) as answer:
            if answer.is_error:
                await answer.aread()
                raise_for(answer)
            total = content_length(answer)
            with output.open("wb") as out:
                async for block in answer.aiter_bytes():
                    out.write(block)
                    size += len(block)
                    if on_progress is not None:
                        on_progress(size, total)
        return size

    async def captions(self, session_id: str, fmt: CaptionFormat | str = CaptionFormat.VTT) -> str:
        """The session's captions (created with `captions=files` or `burn`) as WebVTT (`vtt`) or SRT (`srt`) text;
        ApiError 404 for a session without captions."""
        return captions_text(await self._send(captions_call(session_id, fmt)))

    async def upload_asset(self, file: Path | bytes, *, kind: AssetKind) -> AssetPublic:
        """Upload a portrait or speech for later creates; pass the answer as `portrait=` or `audio=`."""
        return parse(await self._send(asset_call(file, kind)), AssetPublic)

    async def delete_asset(self, asset_id: str) -> None:
        raise_for(await self._send(Call("DELETE", f"/v1/assets/{asset_id}")))

    # Avatars: a portrait checked once, then named by creates (`avatar=`) instead of a portrait.

    async def create_avatar(self, portrait: Input = None, *, portrait_url: str | None = None) -> AvatarPublic:
        """Check a portrait once (its face found, on a node) and keep it; pass the answer as `avatar=` to
        `create_render` or `create_live`. ApiError 422 naming `portrait` if it has no usable face."""
        return parse(await self._send(avatar_call(portrait, portrait_url)), AvatarPublic)

    async def avatars(self, *, limit: int = 50, offset: int = 0) -> list[AvatarPublic]:
        """The tenant's avatars, newest first."""
        call = Call("GET", "/v1/avatars", params={"limit": limit, "offset": offset})
        return parse(await self._send(call), AvatarList).items

    async def avatar(self, avatar_id: str) -> AvatarPublic:
        return parse(await self._send(Call("GET", f"/v1/avatars/{avatar_id}")), AvatarPublic)

    async def delete_avatar(self, avatar_id: str) -> None:
        """Remove the avatar; ApiError 409 while a session made from it has not ended."""
        raise_for(await self._send(Call("DELETE", f"/v1/avatars/{avatar_id}")))

    async def create_webhook(self, url: str, *, events: list[WebhookEvent] | None = None) -> WebhookEndpointCreated:
        body: dict[str, Any] = {"url": url} | ({"events": [str(event) for event in events]} if events else {})
        return parse(await self._send(Call("POST", "/v1/webhooks", json=body)), WebhookEndpointCreated)

    async def list_webhooks(self) -> WebhookEndpointList:
        return parse(await self._send(Call("GET", "/v1/webhooks")), WebhookEndpointList)

    async def delete_webhook(self, endpoint_id: str) -> None:
        raise_for(await self._send(Call("DELETE", f"/v1/webhooks/{endpoint_id}")))

    async def webhook_deliveries(self, *, session_id: str | None = None) -> WebhookDeliveryList:
        params = {"session_id": session_id} if session_id else {}
        return parse(await self._send(Call("GET", "/v1/webhooks/deliveries", params=params)), WebhookDeliveryList)

    async def stream_audio(self, session: RenderPublic, pcm: bytes, **kwargs: Any) -> Any:
        """`Client.stream_audio`, awaited (`live.stream_audio_async`)."""
        from .live import stream_audio_async

        return await stream_audio_async(self, session, pcm, **kwargs)

    async def _create(self, call: Call) -> RenderPublic:
        async def once() -> RenderPublic:
            return parse(await self._send(call), RenderPublic)

        return await tenacity.AsyncRetrying(**self._create_retries)(once)

    async def _send(self, call: Call) -> httpx.Response:
        return await self._http.request(call.method, call.path, **call.arguments())
