"""A live client for the cluster bench: streams speech into a live session in real time through one API
process, and carries on if that process is killed under it (the session then ends with the audio it stored, by
its workflow's idle timeout: an API crash loses no acknowledged second)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from cli.cluster import Cluster
from cli.live_stream import start_session
from monologue.client import auth
from monologue.client.live import MESSAGE_SAMPLES
from monologue.errors import ApiError
from monologue.media import AUDIO_RATE

OPTIONS = {"resolution": "512", "preview": "true", "chunk_frames": 16, "i_frames": 4, "seed": 11}


@dataclass
class LiveRun:
    api_url: str
    session_id: str | None = None
    audio_link: str = ""
    sent_s: float = 0.0
    cut: bool = False  # the API went away mid-stream
    error: str | None = None


def start_live_session(cluster: Cluster, run: LiveRun, portrait: Path) -> None:
    """Create the live session through `run.api_url` (before any kill: its audio then streams under them)."""
    try:
        session = start_session(run.api_url, portrait, options=OPTIONS, api_key=cluster.api_key)
    except (ApiError, httpx.HTTPError) as err:
        run.error = f"could not start: {err}"
        return
    run.session_id, run.audio_link = str(session["id"]), str(session["links"]["audio"])


def stream_live_session(cluster: Cluster, run: LiveRun, audio: Path) -> None:
    """Stream `audio` (a 16 kHz mono WAV) into the started session in real time."""
    if run.session_id is None:
        return
    pcm = np.frombuffer(audio.read_bytes()[44:], dtype="<i2")
    try:
        with connect(run.audio_link, max_size=None, additional_headers=auth(cluster.api_key)) as socket:
            started = time.monotonic()
            for offset in range(0, len(pcm), MESSAGE_SAMPLES):
                time.sleep(max(0.0, started + offset / AUDIO_RATE - time.monotonic()))
                socket.send(pcm[offset : offset + MESSAGE_SAMPLES].tobytes())
                run.sent_s = (offset + MESSAGE_SAMPLES) / AUDIO_RATE
            socket.send(json.dumps({"type": "end"}))
            for message in socket:  # until the server says the audio ended (then it closes)
                if json.loads(message).get("type") == "ended":
                    break
    except (WebSocketException, OSError):
        run.cut = True
