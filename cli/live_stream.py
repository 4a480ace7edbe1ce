"""Streaming a speech file into a live session, as a client would: `monologue live PORTRAIT AUDIO` and the tests.

The file is decoded to 16 kHz mono s16le (monologue.media, so this needs the `node` extra) and streamed by
`monologue.client`'s live helper (20 ms messages at `speed` × real time, reconnecting after a drop), while a poller
watches the playlist grow, so the report shows segments published while audio still arrives."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from monologue.client import Client, auth
from monologue.contracts import TERMINAL
from monologue.media import normalise_audio


@dataclass
class LiveReport:
    session_id: str
    audio_seconds: float
    send_seconds: float  # wall time spent streaming the audio in
    session: dict[str, Any]  # the session as the API reports it at the end (JSON)
    acks: int = 0
    reconnects: int = 0
    segments_while_streaming: int = 0  # segments in the playlist before the last audio was sent
    interrupted: dict[str, Any] | None = None  # the server's `interrupted` message (`interrupt_at_s`)
    errors: list[str] = field(default_factory=list)


def start_session(
    api_url: str,
    portrait: Path,
    *,
    options: dict[str, Any] | None = None,
    api_key: str | None = None,
    probe: bool = False,
) -> dict[str, Any]:
    """POST the portrait; returns the live session (JSON) with its audio WebSocket, ticket and stream links.
    `probe`: one attempt (a refusal is raised at once, for a caller that counts them; else the client's retries)."""
    client = Client(api_url, api_key=api_key, create_attempts=1) if probe else Client(api_url, api_key=api_key)
    with client:
        return client.create_live(portrait=portrait, options=options).model_dump(mode="json")


def stream_live(
    api_url: str,
    portrait: Path | None,
    audio: Path,
    *,
    options: dict[str, Any] | None = None,
    speed: float = 1.0,
    wait_s: float = 600.0,
    api_key: str | None = None,
    avatar: str | None = None,
    interrupt_at_s: float | None = None,
) -> LiveReport:
    """Start a live session (of `portrait`, or of the avatar of that id), stream `audio` into it at `speed` × real
    time (with `interrupt_at_s`, up to there, then `interrupt`), end it and wait for the end."""
    wav = normalise_audio(audio.read_bytes()).wav
    pcm = wav[44:]
    with Client(api_url, api_key=api_key) as client:
        session = client.create_live(portrait=portrait, options=options, avatar=avatar)
        segments = _PlaylistWatcher(session.links.stream, auth(api_key))
        segments.start()
        try:
            streamed = client.stream_audio(session, pcm, speed=speed, interrupt_at_s=interrupt_at_s)
            segments.stop_counting()
        finally:
            segments.stop()
        final = client.poll(session.id, lambda s: s.status in TERMINAL, timeout_s=wait_s)
    return LiveReport(
        session_id=session.id,
        audio_seconds=len(pcm) / 2 / 16_000,
        send_seconds=streamed.send_seconds,
        session=final.model_dump(mode="json"),
        acks=streamed.acks,
        reconnects=streamed.reconnects,
        segments_while_streaming=segments.count_while_streaming,
        errors=streamed.errors,
        interrupted=streamed.interrupted,
    )


class _PlaylistWatcher(threading.Thread):
    """Counts the segments in the session's playlist twice a second."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self._url = url
        self._headers = headers
        self._halt = threading.Event()
        self.count = 0
        self.count_while_streaming = 0

    def run(self) -> None:
        with httpx.Client(timeout=10, headers=self._headers) as http:
            while not self._halt.wait(0.5):
                response = http.get(self._url)
                if response.status_code == 200:
                    self.count = sum(1 for line in response.text.splitlines() if line.startswith("seg-"))

    def stop_counting(self) -> None:
        self.count_while_streaming = self.count

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
