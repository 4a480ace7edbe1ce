"""Streaming speech into a live session, as a client would: `monologue live PORTRAIT AUDIO` and the tests.

The audio file is decoded to 16 kHz mono s16le (monologue.media) and sent in 20 ms messages at the pace
of real time (or faster: `speed`), while a reader thread collects the server's acknowledgements and a
poller watches the playlist grow, so the report shows segments published while audio still arrives.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from websockets.sync.client import connect

from monologue.client import auth, create, poll
from monologue.contracts import TERMINAL
from monologue.media import AUDIO_RATE, normalise_audio

MESSAGE_SAMPLES = AUDIO_RATE // 50  # 20 ms per message, like a telephony/WebRTC frame


@dataclass
class LiveReport:
    session_id: str
    audio_seconds: float
    send_seconds: float  # wall time spent streaming the audio in
    session: dict[str, Any]  # the session as the API reports it at the end
    acks: int = 0
    segments_while_streaming: int = 0  # segments in the playlist before the last audio was sent
    errors: list[str] = field(default_factory=list)


def start_session(
    api_url: str, portrait: Path, *, options: dict[str, Any] | None = None, api_key: str | None = None
) -> dict[str, Any]:
    """POST the portrait; returns the live session with its audio WebSocket and stream links."""
    return create(f"{api_url}/v1/sessions", {"portrait": portrait}, options, api_key, 60.0, "live session")


def stream_live(
    api_url: str,
    portrait: Path,
    audio: Path,
    *,
    options: dict[str, Any] | None = None,
    speed: float = 1.0,
    wait_s: float = 600.0,
    api_key: str | None = None,
) -> LiveReport:
    """Start a live session, stream `audio` into it at `speed` × real time, end it and wait for the end."""
    pcm = np.frombuffer(normalise_audio(audio.read_bytes()).wav[44:], dtype="<i2")
    session = start_session(api_url, portrait, options=options, api_key=api_key)
    session_id = session["id"]
    report = LiveReport(session_id, len(pcm) / AUDIO_RATE, 0.0, session)
    segments = _PlaylistWatcher(session["links"]["stream"], auth(api_key))
    segments.start()
    try:
        with connect(session["links"]["audio"], max_size=None, additional_headers=auth(api_key)) as socket:
            reader = threading.Thread(target=_read_acks, args=(socket, report), daemon=True)
            reader.start()
            started = time.monotonic()
            for offset in range(0, len(pcm), MESSAGE_SAMPLES):
                due = started + offset / AUDIO_RATE / speed
                time.sleep(max(0.0, due - time.monotonic()))
                socket.send(pcm[offset : offset + MESSAGE_SAMPLES].tobytes())
            report.segments_while_streaming = segments.count
            report.send_seconds = time.monotonic() - started
            socket.send(json.dumps({"type": "end"}))
            reader.join(timeout=60)
    finally:
        segments.stop()
    report.session = poll(
        api_url,
        session_id,
        lambda s: s["status"] in TERMINAL,
        timeout_s=wait_s,
        api_key=api_key,
    )
    return report


def _read_acks(socket: Any, report: LiveReport) -> None:
    for message in socket:
        event = json.loads(message)
        if event["type"] == "ack":
            report.acks += 1
        elif event["type"] == "error":
            report.errors.append(event["message"])
        elif event["type"] == "ended":
            return


class _PlaylistWatcher(threading.Thread):
    """Counts the segments in the session's playlist twice a second."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._headers = headers
        self._halt = threading.Event()
        self.count = 0

    def run(self) -> None:
        with httpx.Client(timeout=10, headers=self._headers) as http:
            while not self._halt.wait(0.5):
                response = http.get(self._url)
                if response.status_code == 200:
                    self.count = sum(1 for line in response.text.splitlines() if line.startswith("seg-"))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
