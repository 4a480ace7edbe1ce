"""Small helpers shared by the end-to-end tests."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import threading
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import httpx
import numpy as np
import pytest

from monologue.settings import Settings

if TYPE_CHECKING:
    from fastapi import FastAPI
    from websockets.sync.client import ClientConnection

    from cli.stack import Stack

# API keys by API base URL: every stack fixture registers its local key, and the wrappers below send it to
# URLs under that base only. Never to other servers: S3 refuses presigned URLs that carry an Authorization.
_API_KEYS: dict[str, str] = {}


def register_api(stack: Stack) -> str:
    """Send `stack`'s local key (tenant `local`, scope `ops`) with every request to its API; returns its URL."""
    url = str(stack.settings.api.public_url).rstrip("/")
    _API_KEYS[url] = stack.api_key
    return url


def api_key(url: str) -> str | None:
    """The registered key of the API that `url` (http or ws) points into, if any."""
    url = re.sub(r"^ws(s?)://", r"http\1://", url)
    return next((key for base, key in _API_KEYS.items() if url == base or url.startswith(base + "/")), None)


def api_headers(url: str) -> dict[str, str]:
    key = api_key(url)
    return {"Authorization": f"Bearer {key}"} if key else {}


def get(url: str, **kwargs: Any) -> httpx.Response:
    """`httpx.get`, with the API key when `url` is a registered API's."""
    return httpx.get(url, headers=api_headers(url) | kwargs.pop("headers", {}), **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, headers=api_headers(url) | kwargs.pop("headers", {}), **kwargs)


@contextmanager
def stream(method: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
    with httpx.stream(method, url, headers=api_headers(url) | kwargs.pop("headers", {}), **kwargs) as response:
        yield response


def ws_connect(url: str, **kwargs: Any) -> ClientConnection:
    """`websockets.sync.client.connect`, with the API key (an audio socket needs one too)."""
    from websockets.sync.client import connect

    return connect(url, additional_headers=api_headers(url) | kwargs.pop("additional_headers", {}), **kwargs)


def ffmpeg_options(url: str) -> dict[str, str]:
    """`av.open(url, options=...)` for FFmpeg's HTTP/HLS client: the key header, passed on to every segment."""
    return {"headers": "".join(f"{name}: {value}\r\n" for name, value in api_headers(url).items())}


def submit(api_url: str, portrait: bytes, audio: bytes, **options: Any) -> httpx.Response:
    files = {"portrait": ("portrait.jpg", portrait), "audio": ("speech.wav", audio)}
    return post(f"{api_url}/v1/renders", files=files, data={k: str(v) for k, v in options.items()}, timeout=60)


def wait_done(api_url: str, session_id: str, timeout_s: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        render: dict[str, Any] = get(f"{api_url}/v1/renders/{session_id}", timeout=10).json()
        if render["status"] in ("completed", "failed"):
            return render
        time.sleep(0.25)
    raise TimeoutError(f"render {session_id} not finished after {timeout_s} s")


def wav_bytes(samples: np.ndarray, rate: int = 16_000) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return buffer.getvalue()


def decode_video(data: bytes) -> tuple[np.ndarray, float, float]:
    """(frames (T, H, W, 3) uint8, video seconds, audio seconds) of an MP4."""
    with av.open(io.BytesIO(data)) as container:
        video = container.streams.video[0]
        frames = np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video)])
        video_seconds = float(video.duration * video.time_base)
        frame_rate = video.average_rate
    with av.open(io.BytesIO(data)) as container:
        audio = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(audio))
        audio_seconds = samples / audio.rate
    # The declared rate must agree with the timestamps, or players run the video at the wrong speed.
    if frame_rate is None or abs(len(frames) / float(frame_rate) - video_seconds) > 1.5 / float(frame_rate):
        raise AssertionError(
            f"declared frame rate {frame_rate} disagrees with {len(frames)} frames over {video_seconds:.3f} s"
        )
    return frames, video_seconds, audio_seconds


def workflow_count(settings: Settings) -> int:
    """Session workflows (RenderWorkflow) ever started: not the checks of uploads (ValidateInputsWorkflow) that
    every submit runs, bad input included."""
    from temporalio.client import Client

    async def count() -> int:
        client = await Client.connect(settings.temporal.address, namespace=settings.temporal.namespace)
        return (await client.count_workflows("WorkflowType = 'RenderWorkflow'")).count

    return asyncio.run(count())


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database on the test server; dropped afterwards. Yields its URL."""
    admin_url = os.environ.get("MONOLOGUE_TEST_POSTGRES_URL")
    if not admin_url:
        pytest.fail(
            "MONOLOGUE_TEST_POSTGRES_URL is not set: run the suite with `bash infra/test.sh`, which starts"
            " PostgreSQL (or point it at a server, e.g. postgresql+psycopg://postgres@127.0.0.1/postgres)"
        )
    from cli.cluster import fresh_database

    with fresh_database(admin_url) as url:
        yield url


def node_of(api_url: str, session_id: str, *, api_key: str | None = None) -> str | None:
    """The node that holds (or last held) a session, from the operator's view (`/ops/api`, the key needs the `ops`
    scope): a tenant's answers do not say."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else api_headers(api_url)
    answer = httpx.get(f"{api_url}/ops/api/sessions/{session_id}", headers=headers, timeout=10)
    answer.raise_for_status()
    node: str | None = answer.json()["session"]["node_id"]
    return node


def poll(
    api_url: str, session_id: str, until: Any, *, timeout_s: float = 60, api_key: str | None = None
) -> dict[str, Any]:
    """The session (as JSON) once `until(session_json)` holds, asked for twice a second (monologue.client)."""
    from monologue.client import Client

    with Client(api_url, api_key=api_key) as client:
        found = client.poll(session_id, lambda s: bool(until(s.model_dump(mode="json"))), timeout_s=timeout_s)
    return found.model_dump(mode="json")


async def eventually(check: Any, *, timeout_s: float = 30.0, what: str = "") -> None:
    """Wait, on the running event loop, until `check()` holds: tests wait for the state they need, never for a guess
    of how long it takes. Fails after `timeout_s` naming `what`."""
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"not within {timeout_s:g} s: {what or check}"
        await asyncio.sleep(0.02)


def skip_ready(socket: Any) -> dict[str, Any]:
    """Read an audio socket's first message, the server's `ready` (where the audio continues), and return it."""
    import json

    ready: dict[str, Any] = json.loads(socket.recv(timeout=30))
    if ready["type"] != "ready":
        raise AssertionError(f"expected the socket's 'ready' message first, got {ready}")
    return ready


@contextmanager
def serve_api(base: Settings, **changes: Any) -> Iterator[tuple[str, FastAPI]]:
    """The API in this process (uvicorn on a thread), on `base`'s database, Temporal and storage unless `changes`
    (top-level fields or whole groups: `api=`, `limits=`, `database_url=`…) say otherwise; a port of its own and
    no Temporal SDK metrics port (the shared stack's API holds that one). Yields its URL and the started app."""
    import uvicorn

    from api.app import create_app
    from cli.stack import free_port

    port = free_port()
    api = base.api.model_copy(
        update={"port": port, "public_url": f"http://127.0.0.1:{port}", "temporal_metrics_port": None}
        | (changes.pop("api", None) or {})
    )
    settings = base.model_copy(update={"api": api, **changes})
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """A filesystem of `size` (mount's `size=`, e.g. `300k`) of its own at `folder`: a small disk that fills up.
    Mounted as root, else with `sudo -n`; unmounted afterwards. Fails (never skips) where neither may mount."""
    folder.mkdir(parents=True, exist_ok=True)
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    _mount_command([*prefix, "mount", "-t", "tmpfs", "-o", f"size={size},mode=0777", "tmpfs", str(folder)])
    try:
        yield folder
    finally:
        _mount_command([*prefix, "umount", "--lazy", str(folder)])


def grow_tmpfs(folder: Path, size: str) -> None:
    """Give the tmpfs at `folder` (see `tmpfs`) a new size, keeping what it holds: room comes back."""
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    _mount_command([*prefix, "mount", "-o", f"remount,size={size}", str(folder)])


def _mount_command(command: list[str]) -> None:
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        pytest.fail(f"{' '.join(command)} failed ({detail.strip()}): these tests need root or passwordless sudo")


def stored_session(sessions: Any, store: Any, session_id: str = "s") -> None:
    """A render's row and its inputs in storage (the bundled portrait and speech, normalised as the API stores them):
    what a node's activities need to set the session up and make its chunks."""
    from monologue import SAMPLES, keys, repo
    from monologue.media import normalise_audio, normalise_portrait

    portrait = normalise_portrait((SAMPLES / "portrait.jpg").read_bytes())
    with sessions() as db:
        repo.create_session(
            db,
            session_id=session_id,
            tenant="local",
            options={},
            workflow_id="w",
            audio_seconds=2.0,
            width=portrait.width,
            height=portrait.height,
        )
    store.put(keys.portrait(session_id), portrait.png)
    store.put(keys.audio(session_id), normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav)


@contextmanager
def own_stack(home: Path, node_id: str, **sections: Any) -> Iterator[Stack]:
    """A stack of the test's own on free loopback ports (`sections`: Settings fields, e.g. ice=…, sfu=…), its API key
    registered; stopped when the block ends."""
    from cli.stack import Stack, free_port
    from monologue.settings import ApiSettings, NodeSettings, TemporalSettings

    settings = Settings(
        home=home,
        log_format="json",
        temporal=TemporalSettings(address=f"127.0.0.1:{free_port()}", ui_port=free_port()),
        api=ApiSettings(port=free_port()),
        node=NodeSettings(id=node_id),
        **sections,
    )
    stack = Stack(settings)
    stack.start()
    try:
        register_api(stack)
        yield stack
    finally:
        stack.stop()


def node_media_stats(stack: Stack) -> dict[str, int]:
    """The stack's node's WebRTC port's `/webrtc/stats`: open peer connections, loop tasks, SFU publishers."""
    from monologue.db import make_engine, make_sessionmaker
    from monologue.repo import nodes as repo_nodes

    with make_sessionmaker(make_engine(stack.settings.db_url))() as db:
        node = repo_nodes.get_node(db, node_id=stack.settings.node.id)
    assert node is not None and node.media_url is not None
    stats: dict[str, int] = httpx.get(f"{node.media_url}/webrtc/stats", timeout=10).json()
    return stats
