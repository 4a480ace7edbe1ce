"""A typed Python client for Monologue's API, on httpx: `Client` (blocking) and `AsyncClient` (asyncio).

    from monologue.client import Client

    with Client("http://127.0.0.1:8000", api_key=key) as client:
        session = client.create_render(portrait=Path("face.jpg"), audio_url="https://example.com/speech.wav")
        done = client.wait(session.id, on_progress=lambda s: print(s.progress.chunks_done))
        client.download(done.id, Path("out.mp4"), layout=Layout.PROGRESSIVE)

Answers are the API's own models (`monologue.schemas`: `RenderPublic`, …). Refusals raise `ApiError` (its
`status` and RFC 9457 `problem`); a session waited on that fails or is cancelled raises `SessionEnded`. Creates
carry an Idempotency-Key (one is made unless given) and are retried with it (tenacity) after a lost connection or a
429/503 (waiting as Retry-After says), so a retry never starts a second session.
`stream_audio` streams a live session's speech and reconnects after a drop.

Installed alone by clients/python (`monologue-client`): this package and the modules it imports must never import
the server's (settings, the database, storage, Temporal), directly or not; tests/test_client_dist.py checks it."""

from monologue.captions import CaptionFormat
from monologue.errors import ApiError, ClientError, SessionEnded

from ._common import Layout, auth
from .aio import AsyncClient
from .live import LiveStream
from .sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "CaptionFormat",
    "Client",
    "ClientError",
    "Layout",
    "LiveStream",
    "SessionEnded",
    "auth",
]
