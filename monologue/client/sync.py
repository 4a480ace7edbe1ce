"""`Client`: the API over httpx, blocking. Every call returns a typed model (`monologue.schemas`) or raises
`ApiError` with the API's problem details; `wait` follows the session's event stream (reconnecting with
`Last-Event-ID`); creates send an Idempotency-Key and are retried with it after a lost connection or a 429/503,
so a retry never makes a second session. `AsyncClient` (monologue/client/aio.py) has the same methods, awaited."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
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


class Client:
    """`with Client(url, api_key=key) as client: ...` (or call `close()`)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        create_attempts: int = CREATE_ATTEMPTS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """`create_attempts`: how often a create is sent in all (1: its first answer, whatever it is, as a probe
        that counts the API's answers wants); `transport`: httpx's (default: one that opens a connection that
        failed to open again, CONNECT_RETRIES times)."""
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self._create_retries = create_retries(create_attempts)
        transport = transport or httpx.HTTPTransport(retries=CONNECT_RETRIES)
        self._http = httpx.Client(base_url=self.base_url, headers=auth(api_key), timeout=timeout_s, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Sessions.

    def create_render(
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
        """Start a render from files (paths or bytes), URLs (https://, s3://) or uploaded assets; returns at once.
        Instead of audio, `options={"text": …, "voice": "espeak:en-us"}`: the speech is synthesised on a node.
        `metadata` (a small flat JSON object) comes back in the session, its events and webhooks; `callback_url` gets
        its endings, signed with the answer's `callback_secret`. `avatar` (from `create_avatar`, or its id) stands for
        the portrait."""
        inputs = {"portrait": (portrait, portrait_url), "audio": (audio, audio_url)}
        call = create_call(
            "/v1/renders", inputs, options, idempotency_key, metadata=metadata, callback_url=callback_url, avatar=avatar
        )
        return self._create(call)

    def create_live(
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
        """Start a live session; its `audio_ticket` opens the audio socket (`stream_audio` streams into it). From an
        `avatar` (instead of a portrait) nothing is left to check, and it starts sooner."""
        inputs = {"portrait": (portrait, portrait_url)}
        return self._create(
            create_call(
                "/v1/sessions",
                inputs,
                options,
                idempotency_key,
                metadata=metadata,
                callback_url=callback_url,
                avatar=avatar,
            )
        )

    def get(self, session_id: str) -> RenderPublic:
        return parse(self._send(Call("GET", f"/v1/renders/{session_id}")), RenderPublic)

    def list_sessions(self, *, status: str | None = None, limit: int = 50, offset: int = 0) -> list[RenderPublic]:
        """The key's sessions, newest first; `status` keeps only those in that status."""
        params: dict[str, Any] = {"limit": limit, "offset": offset} | ({"status": status} if status else {})
        return parse(self._send(Call("GET", "/v1/renders", params=params)), RenderList).items

    def cancel(self, session_id: str) -> RenderPublic:
        """Stop the session within a chunk (ApiError 409 if it has ended)."""
        return parse(self._send(Call("POST", f"/v1/renders/{session_id}/cancel")), RenderPublic)

    def resume(self, session_id: str) -> RenderPublic:
        """Start a failed or cancelled session again from its last checkpoint."""
        return parse(self._send(Call("POST", f"/v1/renders/{session_id}/resume")), RenderPublic)

    def ticket(self, session_id: str) -> AudioTicket:
        """A fresh single-use ticket for a live session's audio socket."""
        return parse(self._send(Call("POST", f"/v1/sessions/{session_id}/ticket")), AudioTicket)

    def events(
        self, session_id: str, *, last_event_id: str | None = None, timeout_s: float | None = None
    ) -> Iterator[RenderPublic]:
        """The session's progress events until it ends, reconnecting (with Last-Event-ID) when the stream drops or
        goes silent (no keep-alive within STREAM_READ_S); ClientError past `timeout_s`."""
        last = last_event_id
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise ClientError(f"session {session_id} did not end within {timeout_s:.0f} s")
            headers = {"Accept": "text/event-stream"} | ({"Last-Event-ID": last} if last else {})
            reader = EventReader()
            path = f"/v1/renders/{session_id}/events"
            try:
                with self._http.stream("GET", path, headers=headers, timeout=STREAM_TIMEOUT) as answer:
                    if answer.status_code == 204:  # ended, and nothing new since `last`
                        return
                    if answer.is_error:
                        answer.read()
                        raise_for(answer)
                    for line in answer.iter_lines():
                        for event in reader.feed(line):
                            session = progress_event(event)
                            if session is not None:
                                yield session
                                if ended(session):
                                    return
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ReadTimeout, httpx.ConnectError):
                time.sleep(0.5)  # the stream dropped: reconnect after the last event seen
            last = reader.last_id or last

    def wait(self, session_id: str, *, on_progress: Progress | None = None, timeout_s: float = 3600.0) -> RenderPublic:
        """Follow the session until it ends: returns it if it completed, SessionEnded if it failed or was cancelled."""
        last: RenderPublic | None = None
        for session in self.events(session_id, timeout_s=timeout_s):
            last = session
            if on_progress is not None:
                on_progress(session)
        return finished(last if last is not None and ended(last) else self.get(session_id))

    def poll(
        self, session_id: str, until: Callable[[RenderPublic], bool], *, poll_s: float = 0.5, timeout_s: float = 600.0
    ) -> RenderPublic:
        """GET the session every `poll_s` until `until(session)` holds; returns that session."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            session = self.get(session_id)
            if until(session):
                return session
            time.sleep(poll_s)
        raise ClientError(f"session {session_id} did not get there within {timeout_s:.0f} s")

    def download(
        self,
        session_id: str,
        output: Path,
        *,
        layout: Layout = Layout.FRAGMENTED,
        on_progress: DownloadProgress | None = None,
    ) -> int:
        """Stream the finished MP4 to `output` (`Layout.PROGRESSIVE`: its index first); returns its size.
        `on_progress(bytes_so_far, total_bytes)` is called after each block (total: None if the API sent none)."""
        output.parent.mkdir(parents=True, exist_ok=True)
        size = 0
        with self._http.stream("GET", f"/v1/renders/{session_id}/video.mp4", params={"layout": str(layout)}) as answer:
            if answer.is_error:
                answer.read()
                raise_for(answer)
            total = content_length(answer)
            with output.open("wb") as out:
                for block in answer.iter_bytes():
                    out.write(block)
                    size += len(block)
                    if on_progress is not None:
                        on_progress(size, total)
        return size

    def captions(self, session_id: str, fmt: CaptionFormat | str = CaptionFormat.VTT) -> str:
        """The session's captions (created with `captions=files` or `burn`) as WebVTT (`vtt`) or SRT (`srt`) text;
        ApiError 404 for a session without captions."""
        return captions_text(self._send(captions_call(session_id, fmt)))

    # Assets: files uploaded once, then given to creates (`portrait=asset`), which go as JSON.

    def upload_asset(self, file: Path | bytes, *, kind: AssetKind) -> AssetPublic:
        """Upload a portrait or speech for later creates; pass the answer as `portrait=` or `audio=`."""
        return parse(self._send(asset_call(file, kind)), AssetPublic)

    def delete_asset(self, asset_id: str) -> None:
        raise_for(self._send(Call("DELETE", f"/v1/assets/{asset_id}")))

    # Avatars: a portrait checked once, then named by creates (`avatar=`) instead of a portrait.

    def create_avatar(self, portrait: Input = None, *, portrait_url: str | None = None) -> AvatarPublic:
        """Check a portrait once (its face found, on a node) and keep it; pass the answer as `avatar=` to
        `create_render` or `create_live`. ApiError 422 naming `portrait` if it has no usable face."""
        return parse(self._send(avatar_call(portrait, portrait_url)), AvatarPublic)

    def avatars(self, *, limit: int = 50, offset: int = 0) -> list[AvatarPublic]:
        """The tenant's avatars, newest first."""
        call = Call("GET", "/v1/avatars", params={"limit": limit, "offset": offset})
        return parse(self._send(call), AvatarList).items

    def avatar(self, avatar_id: str) -> AvatarPublic:
        return parse(self._send(Call("GET", f"/v1/avatars/{avatar_id}")), AvatarPublic)

    def delete_avatar(self, avatar_id: str) -> None:
        """Remove the avatar; ApiError 409 while a session made from it has not ended."""
        raise_for(self._send(Call("DELETE", f"/v1/avatars/{avatar_id}")))

    # Webhooks.

    def create_webhook(self, url: str, *, events: list[WebhookEvent] | None = None) -> WebhookEndpointCreated:
        """Send this tenant's session events to `url`; the answer's `secret` is shown only here."""
        body: dict[str, Any] = {"url": url} | ({"events": [str(event) for event in events]} if events else {})
        return parse(self._send(Call("POST", "/v1/webhooks", json=body)), WebhookEndpointCreated)

    def list_webhooks(self) -> WebhookEndpointList:
        return parse(self._send(Call("GET", "/v1/webhooks")), WebhookEndpointList)

    def delete_webhook(self, endpoint_id: str) -> None:
        raise_for(self._send(Call("DELETE", f"/v1/webhooks/{endpoint_id}")))

    def webhook_deliveries(self, *, session_id: str | None = None) -> WebhookDeliveryList:
        params = {"session_id": session_id} if session_id else {}
        return parse(self._send(Call("GET", "/v1/webhooks/deliveries", params=params)), WebhookDeliveryList)

    # Live audio (monologue/client/live.py).

    def stream_audio(self, session: RenderPublic, pcm: bytes, **kwargs: Any) -> Any:
        """Stream 16 kHz mono s16le `pcm` into a live session, reconnecting after a drop (`live.stream_audio`)."""
        from .live import stream_audio

        return stream_audio(self, session, pcm, **kwargs)

    def _create(self, call: Call) -> RenderPublic:
        """Send a create, again after a lost connection or a refusal for now (`_common.retried`): the same
        Idempotency-Key gets the first session, if one was made, so the retries never make a second."""
        return tenacity.Retrying(**self._create_retries)(lambda: parse(self._send(call), RenderPublic))

    def _send(self, call: Call) -> httpx.Response:
        return self._http.request(call.method, call.path, **call.arguments())
