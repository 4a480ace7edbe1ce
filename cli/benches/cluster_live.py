"""A live client for the cluster bench: streams speech into a live session in real time through one API
process, and if that process is killed under it, reconnects through another and continues after the last sample
the server stored (an API crash loses no acknowledged second)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from http import HTTPStatus
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


RETRY_PAUSE_S = 0.5  # after a 503 (see `LiveRun.refusals`), before asking again
RECONNECTS = 8  # sockets a live client opens for one session's audio (its API killed under it, refused for now)


@dataclass
class LiveRun:
    api_url: str
    api_key: str = ""  # the tenant's key; empty: the cluster's local key
    session_id: str | None = None
    audio_link: str = ""
    sent_s: float = 0.0
    cut: bool = False  # the API went away mid-stream
    error: str | None = None
    requested_at: float | None = None  # the first create's start (epoch s), refused attempts included
    admitted_at: float | None = None  # when a create was accepted (a node holds the session)
    # Creates answered 503, each its problem's detail: no node took the session within the live start timeout, or
    # no node checked the uploads in time.
    refusals: list[str] = field(default_factory=list)

    def key(self, cluster: Cluster) -> str:
        return self.api_key or cluster.api_key


def start_live_session(cluster: Cluster, run: LiveRun, portrait: Path, *, retry_for_s: float = 0.0) -> None:
    """Create the live session through `run.api_url` (before any kill: its audio then streams under them). A
    create refused with 503 (no node in time: it is admitted only once a node holds it) is asked again, as a client
    would, for up to `retry_for_s` seconds; each refusal's reason is kept."""
    run.requested_at = time.time()
    deadline = time.monotonic() + retry_for_s
    while True:
        try:
            # One attempt per call: the client's own retries would hide the refusals counted here.
            session = start_session(run.api_url, portrait, options=OPTIONS, api_key=run.key(cluster), probe=True)
            break
        except ApiError as err:
            if err.status == HTTPStatus.SERVICE_UNAVAILABLE and time.monotonic() < deadline:
                run.refusals.append(str(err.problem.get("detail", err)))
                time.sleep(RETRY_PAUSE_S)
                continue
            run.error = f"could not start ({len(run.refusals)} refusals before): {err}"
            return
        except httpx.HTTPError as err:
            run.error = f"could not start: {err}"
            return
    run.admitted_at = time.time()
    run.session_id, run.audio_link = str(session["id"]), str(session["links"]["audio"])


def stream_live_session(cluster: Cluster, run: LiveRun, audio: Path) -> None:
    """Stream `audio` (a 16 kHz mono WAV) into the started session in real time. If its API process goes away, the
    client reconnects through one that answers (as behind a load balancer) and continues after the last sample the
    server stored (its `ready` message), for up to RECONNECTS sockets."""
    if run.session_id is None:
        return
    pcm = np.frombuffer(audio.read_bytes()[44:], dtype="<i2")
    started, url = time.monotonic(), run.audio_link
    for _ in range(RECONNECTS):
        try:
            if _one_socket(cluster, run, url, pcm, started):
                return
        except (WebSocketException, OSError):
            pass
        run.cut = True
        path = "/v1/" + run.audio_link.split("/v1/", 1)[1]  # the same socket, through an API that answers
        url = cluster.alive_api().replace("http", "ws", 1) + path


def _one_socket(cluster: Cluster, run: LiveRun, url: str, pcm: np.ndarray, started: float) -> bool:
    """One socket's share of the audio, paced from `started`; True once the server said the audio ended."""
    with connect(url, max_size=None, additional_headers=auth(run.key(cluster))) as socket:
        ready = json.loads(socket.recv(timeout=30))
        if ready.get("type") != "ready":  # refused for now (the old socket still holds the session): try again
            time.sleep(float(ready.get("retry_after_s") or RETRY_PAUSE_S))
            return False
        for offset in range(int(ready["samples"]), len(pcm), MESSAGE_SAMPLES):
            time.sleep(max(0.0, started + offset / AUDIO_RATE - time.monotonic()))
            socket.send(pcm[offset : offset + MESSAGE_SAMPLES].tobytes())
            run.sent_s = (offset + MESSAGE_SAMPLES) / AUDIO_RATE
        socket.send(json.dumps({"type": "end"}))
        for message in socket:  # until the server says the audio ended (then it closes)
            if json.loads(message).get("type") == "ended":
                return True
    return False
