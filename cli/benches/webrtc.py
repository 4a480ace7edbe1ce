"""`monologue bench live --webrtc` (and tests/test_webrtc_browser.py): a live session watched over WebRTC in headless
Chromium, its figures measured where a person sees them.

Speech with known onsets (bursts of the bundled speech between silences) goes in over the audio WebSocket in real
time; the page is the session's player (`/v1/live/{id}/player`), and a script added to it draws every video frame
the browser presents onto a canvas and records the share of near-black pixels (the open mouth's cavity, as the
repo's lip-sync checks read it) with the wall time. Glass-to-glass latency of an onset: the first presented frame
whose mouth has opened after the onset was sent, minus the time it was sent. TTFF: first audio sent → first frame
presented. Stall (with `kill`): the node killed → the first frame presented after it. Nothing here asserts."""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
from websockets.sync.client import connect

from cli.benches import webrtc_sync as sync
from cli.benches.webrtc_sync import AUDIO_PROBE, STATS_PROBE
from cli.chromium import CHROMIUM_ARGS
from monologue import keys
from monologue.client import Client
from monologue.media import normalise_audio
from monologue.settings import Settings

RATE = 16_000
MOUTH_CELLS = 6  # of the page's 32×32 grid: a 512² frame's mouth cavity spans a few 16-pixel cells
PIECE_S = 0.02  # audio sent 20 ms at a time, paced to real time
LEAD_S, BURST_S, GAP_S = 2.0, 1.0, 2.0  # silence first, then bursts of speech, each followed by silence
CHROMIUM_FLAGS = [
    "--use-fake-ui-for-media-stream",  # a microphone without a prompt (the player's WHIP side)
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--disable-features=WebRtcHideLocalIpsWithMdns",  # host candidates aiortc can reach (no .local names)
]
# Added to the player page before its own script: every presented frame's dark share with its wall time (ms). Only
# frames that came over WebRTC (they have a `receiveTime`): when a peer connection closes, Chromium shows the old frame
# again, without one.
FRAME_PROBE = """
window.__frames = [];
const GRID = 32;
const probe = () => {
  const video = document.getElementById("video");
  if (!video) { setTimeout(probe, 5); return; }
  const canvas = document.createElement("canvas");
  const context = canvas.getContext("2d", { willReadFrequently: true });
  const onFrame = (now, metadata) => {
    const width = video.videoWidth, height = video.videoHeight;
    if (width && height && metadata.receiveTime !== undefined) {
      canvas.width = width; canvas.height = height;
      context.drawImage(video, 0, 0);
      const pixels = context.getImageData(0, 0, width, height).data;
      const cells = new Array(GRID * GRID).fill(0);
      for (let y = 0; y < height; y++) {
        const row = Math.floor((y * GRID) / height) * GRID;
        for (let x = 0; x < width; x++) {
          const i = 4 * (y * width + x);
          const luma = 0.299 * pixels[i] + 0.587 * pixels[i + 1] + 0.114 * pixels[i + 2];
          if (luma < 50) cells[row + Math.floor((x * GRID) / width)]++;
        }
      }
      const area = (width * height) / (GRID * GRID);
      window.__frames.push([performance.timeOrigin + now, cells.map((n) => Math.round((1000 * n) / area) / 1000)]);
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
};
document.addEventListener("DOMContentLoaded", probe);
"""


@dataclass
class WebrtcFigures:
    """Milliseconds: time to first frame, each onset's glass-to-glass latency, stalls after a node kill."""

    ttff_ms: float | None = None
    glass_ms: list[float] = field(default_factory=list)
    missed: int = 0  # onsets after which no mouth motion was seen
    stalls_ms: list[float] = field(default_factory=list)
    sync_ms: list[float] = field(default_factory=list)  # video − audio played out, on the sender's clock (~10 Hz)
    av_ms: list[float] = field(default_factory=list)  # per onset, by content: video later than audio (webrtc_sync)
    frames: int = 0
    ttffs_ms: list[float] = field(default_factory=list)  # merged runs' TTFFs
    series: list[list[float]] = field(default_factory=list, repr=False)  # (wall ms, dark share) per shown frame
    onsets_ms: list[float] = field(default_factory=list, repr=False)
    session_id: str = ""  # the live session measured

    def merge(self, other: WebrtcFigures) -> None:
        """Add another run's figures (TTFF: every run's, reported as p50/p95)."""
        self.glass_ms += other.glass_ms
        self.missed += other.missed
        self.stalls_ms += other.stalls_ms
        self.frames += other.frames
        self.sync_ms += other.sync_ms
        self.av_ms += other.av_ms
        self.ttffs_ms += [other.ttff_ms] if other.ttff_ms is not None else []

    def lines(self) -> list[str]:
        if self.ttffs_ms:
            ttff = f"p50 {_percentile(self.ttffs_ms, 50):.0f} ms, p95 {_percentile(self.ttffs_ms, 95):.0f} ms"
        else:
            ttff = _ms(self.ttff_ms)
        out = [f"TTFF (first audio sent → first frame shown): {ttff}; frames shown: {self.frames}"]
        if self.glass_ms:
            p50, p95 = _percentile(self.glass_ms, 50), _percentile(self.glass_ms, 95)
            out.append(
                f"glass-to-glass (onset sent → mouth moving in the page): p50 {p50:.0f} ms, p95 {p95:.0f} ms"
                f" (n={len(self.glass_ms)}, missed {self.missed}; {', '.join(f'{v:.0f}' for v in self.glass_ms)})"
            )
        else:
            out.append(f"glass-to-glass: no onset seen (missed {self.missed})")
        if self.sync_ms:
            offsets = [abs(v) for v in self.sync_ms]
            out.append(
                f"A/V offset (video − audio played, sender's clock): median {statistics.median(self.sync_ms):+.0f} ms,"
                f" |offset| p50 {_percentile(offsets, 50):.0f} ms, p95 {_percentile(offsets, 95):.0f} ms"
                f" (n={len(offsets)} samples)"
            )
        if self.av_ms:
            out.append(
                f"A/V offset by content (mouth seen − speech heard, less the model's own lag): "
                f"{', '.join(f'{v:+.0f}' for v in self.av_ms)} ms (median {statistics.median(self.av_ms):+.0f})"
            )
        if self.stalls_ms:
            out.append(f"stall after the node kill: {', '.join(f'{v:.0f}' for v in self.stalls_ms)} ms")
        return out


def speech_with_onsets(speech: Path, *, bursts: int) -> tuple[np.ndarray, list[int]]:
    """16 kHz s16 PCM: LEAD_S of silence, then `bursts` × (BURST_S of the speech from its first loud sample, GAP_S
    of silence); and the sample where each burst starts."""
    pcm = np.frombuffer(normalise_audio(speech.read_bytes()).wav[44:], dtype="<i2")
    loud = int(np.flatnonzero(np.abs(pcm) > 0.1 * np.abs(pcm).max())[0])
    burst = pcm[loud : loud + int(BURST_S * RATE)]
    parts, onsets, at = [np.zeros(int(LEAD_S * RATE), np.int16)], [], int(LEAD_S * RATE)
    for _ in range(bursts):
        onsets.append(at)
        parts += [burst, np.zeros(int(GAP_S * RATE), np.int16)]
        at += len(burst) + int(GAP_S * RATE)
    return np.concatenate(parts), onsets


def measure(
    api_url: str,
    api_key: str | None,
    portrait: Path,
    speech: Path,
    *,
    bursts: int = 5,
    options: dict[str, Any] | None = None,
    kill: Callable[[str], None] | None = None,
    chromium: str = "chromium",
    store: Path | None = None,
    whip: bool = False,
) -> WebrtcFigures:
    """One live session watched in headless Chromium while `bursts` of speech go in: over the audio socket, or with
    `whip` through the page itself (its "Talk" button: Chromium's fake microphone plays the speech as a WAV, sent over
    WHIP with the session's audio ticket); `kill` (optional) is called with the session's id halfway through the
    speech (to kill the node holding it); `store`: the embedded stack's local store, where the session's reference
    says where the mouth is and its output gives the A/V offset (cli/benches/webrtc_sync.py; audio socket only)."""
    from playwright.sync_api import sync_playwright

    pcm, onsets = speech_with_onsets(speech, bursts=bursts)
    with Client(api_url, api_key=api_key) as client:
        session = client.create_live(portrait=portrait, options={"delivery": "webrtc", **(options or {})})
    if session.links.playback is None or session.audio_ticket is None:
        raise RuntimeError("the live session came without a playback link or an audio ticket")
    token = urlsplit(session.links.playback.stream).path.split("/")[2]
    url = f"{api_url}/v1/live/{session.id}/player?link={token}"
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        flags = [*CHROMIUM_ARGS, *CHROMIUM_FLAGS]
        if whip:
            flags.append(f"--use-file-for-fake-audio-capture={_wav(pcm, Path(folder) / 'speech.wav')}%noloop")
            url += f"&ticket={session.audio_ticket.ticket}"
        browser = playwright.chromium.launch(executable_path=chromium, args=flags, headless=True)
        try:
            page = browser.new_page()
            page.add_init_script(FRAME_PROBE + AUDIO_PROBE + STATS_PROBE)
            page.goto(url)
            speaker: Speaker = PageMicrophone(page) if whip else AudioSender(session.audio_ticket.url, pcm)
            killed_at = speaker.speak(len(pcm) / RATE, None if kill is None else lambda: kill(session.id))
            time.sleep(2.0)  # the last burst's frames
            if kill is not None:  # the moved session catches up after its stall: until its frames stop coming
                _until_frames_stop(page)
            series: list[list[float]] = page.evaluate("window.__frames")
            playout: list[list[float]] = page.evaluate("window.__sync")
            heard: list[list[float]] = page.evaluate("window.__heard")
        finally:
            browser.close()
    started = speaker.started_at * 1000
    onsets_ms = [started + 1000 * onset / RATE for onset in onsets]
    box = None if store is None else MouthBox.of_reference(store / keys.reference(session.id))
    out = figures(series, started, onsets_ms, killed_at, box)
    out.session_id = session.id
    out.sync_ms = [offset for _, offset in playout]
    if store is not None and not whip:  # the stored audio starts with the speech sent (not so over WHIP)
        out.av_ms = _content_offsets(out, heard, store, box, sync.heard_onsets_s(pcm, RATE, gap_s=GAP_S))
    return out


def _content_offsets(
    out: WebrtcFigures, heard: list[list[float]], store: Path, box: MouthBox | None, onsets_s: list[float]
) -> list[float]:
    """Each onset seen − heard in the page, less the same on the stored output (cli/benches/webrtc_sync.py)."""
    if not heard or not out.glass_ms:
        return []
    seen_ms = [glass + onset for glass, onset in zip(out.glass_ms, out.onsets_ms, strict=False)]
    cells, fps = sync.stored_cells(store, out.session_id)
    stored = sync.Timeline(mouth_signal(cells, box), fps, onsets_s)
    return sync.content_offsets(seen_ms, heard, stored, first_sent_ms=out.onsets_ms[0], gap_s=GAP_S)


def _until_frames_stop(page: Any, *, quiet_s: float = 1.5, limit_s: float = 30.0) -> None:
    count, changed, deadline = -1, time.time(), time.time() + limit_s
    while time.time() < deadline and time.time() - changed < quiet_s:
        now = page.evaluate("window.__frames.length")
        if now != count:
            count, changed = now, time.time()
        time.sleep(0.25)


def _wav(pcm: np.ndarray, path: Path) -> Path:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(pcm.tobytes())
    return path


def local_store(settings: Settings) -> Path | None:
    """The root of the embedded stack's local store, where the sessions' references and outputs lie; None for S3."""
    root = settings.storage.root
    return root if settings.storage.backend == "local" else None


def figures(
    series: list[list[Any]],
    first_sent_ms: float,
    onsets_ms: list[float],
    killed_at_ms: float | None,
    box: MouthBox | None = None,
) -> WebrtcFigures:
    """The figures from the page's frames ((wall ms, dark share of each GRID² cell) in presentation order)."""
    out = WebrtcFigures(frames=len(series), series=series, onsets_ms=onsets_ms)
    if not series:
        out.missed = len(onsets_ms)
        return out
    times = np.array([t for t, _ in series])
    out.ttff_ms = float(times[0] - first_sent_ms)
    mouth = mouth_signal(np.array([cells for _, cells in series], dtype=np.float64), box)
    # Each burst opens the mouth a few times; bursts are told apart by the silence between them (GAP_S): a run of
    # openings after a closed spell of over GAP_S / 2 answers the onset sent last before it.
    starts = sync.mouth_openings(times, mouth, quiet=500 * GAP_S)
    if starts is None:  # the mouth never moved
        out.missed = len(onsets_ms)
        return out
    out.glass_ms = sync.answered(onsets_ms, starts)
    out.missed = len(onsets_ms) - len(out.glass_ms)
    if killed_at_ms is not None:
        later = times[times > killed_at_ms]
        gaps = np.diff(np.concatenate([[killed_at_ms], later]))
        out.stalls_ms.append(float(gaps.max()) if len(gaps) else float("nan"))
    return out


def mouth_signal(cells: np.ndarray, box: MouthBox | None) -> np.ndarray:
    """(T, GRID²) dark shares → (T,): how much open mouth shows, over the cells of the mouth's `box` (the session's
    reference says where it is); without one, the MOUTH_CELLS inner cells whose darkness changes most."""
    grid = round(np.sqrt(cells.shape[1]))
    frames = cells.reshape(len(cells), grid, grid)
    if box is not None:
        rows = [r for r in range(grid) if box.top <= (r + 0.5) / grid <= box.bottom]
        columns = [c for c in range(grid) if box.left <= (c + 0.5) / grid <= box.right]
        mouth: np.ndarray = frames[:, rows][:, :, columns].sum(axis=(1, 2))
        return mouth
    inner = frames[:, 2:-2, 2:-2].reshape(len(cells), -1)  # the frame's edges flicker with the encoder
    busiest: np.ndarray = inner[:, np.argsort(inner.std(axis=0))[-MOUTH_CELLS:]].sum(axis=1)
    return busiest


@dataclass(frozen=True)
class MouthBox:
    """Where the mouth opens, in fractions of the frame (as tests/test_end_to_end.py reads it from the layout)."""

    left: float
    top: float
    right: float
    bottom: float

    @classmethod
    def of_reference(cls, path: Path) -> MouthBox:
        """From a session's stored reference (`ref/conditioning.safetensors`: warp's layout, in frame pixels)."""
        from safetensors.numpy import load_file

        reference = load_file(path)
        height, width = (int(v) for v in reference["portrait"].shape[:2])
        mouth_x, mouth_y, half = (float(v) for v in reference["layout"][9:12])
        left, right = (mouth_x - half) / width, (mouth_x + half) / width
        return cls(left, (mouth_y - half / 2) / height, right, (mouth_y + 1.5 * half) / height)


class Speaker(Protocol):
    started_at: float  # wall time (s) of the speech's sample 0

    def speak(self, seconds: float, kill: Callable[[], None] | None) -> float | None:
        """Speak the whole speech (`seconds` long), calling `kill` halfway; the kill's wall time (ms)."""
        ...


def _speak(
    alive: Callable[[], bool], started_at: Callable[[], float], half: float, kill: Callable[[], None] | None
) -> float | None:
    killed_at: float | None = None
    while alive():
        time.sleep(0.1)
        # (as before: the socket's `started_at` is 0 until it is ready, so the kill may come before the speech)
        if kill is not None and killed_at is None and time.time() - started_at() > half:
            killed_at = time.time() * 1000
            kill()
    return killed_at


class AudioSender(threading.Thread):
    """Streams PCM into the audio socket at real time, 20 ms at a time; `started_at` is when sample 0 went out."""

    def __init__(self, url: str, pcm: np.ndarray) -> None:
        super().__init__(daemon=True, name="audio-sender")
        self._url, self._pcm = url, pcm
        self.started_at = 0.0

    def speak(self, seconds: float, kill: Callable[[], None] | None) -> float | None:
        self.start()
        return _speak(self.is_alive, lambda: self.started_at, seconds / 2, kill)

    def run(self) -> None:
        piece = int(PIECE_S * RATE)
        with connect(self._url, max_size=None) as socket:
            json.loads(socket.recv())  # ready
            self.started_at = time.time()
            for index, start in enumerate(range(0, len(self._pcm), piece)):
                delay = self.started_at + index * PIECE_S - time.time()
                if delay > 0:
                    time.sleep(delay)
                socket.send(self._pcm[start : start + piece].tobytes())
            socket.send(json.dumps({"type": "end"}))
            try:
                for _ in socket:
                    pass
            except Exception:  # the server closes once the session's audio is over
                return


class PageMicrophone:
    """The player page's "Talk" button: Chromium's fake microphone (the speech's WAV, from its start when the page
    captures it) goes over WHIP; pressed again once the speech is over, which ends the session's audio.
    `started_at`: when the page had the microphone (the WAV's sample 0, to the capture's start-up)."""

    def __init__(self, page: Any) -> None:
        self._page = page
        self.started_at = 0.0

    def speak(self, seconds: float, kill: Callable[[], None] | None) -> float | None:
        self._page.click("#talk")
        self._page.wait_for_function("window.monologuePlayer.talkState !== 'ready'", timeout=30_000)
        state = self._page.evaluate("[window.monologuePlayer.talkState, window.monologuePlayer.talkingSince]")
        if state[0] != "talking":
            raise RuntimeError(f"the page could not talk: {self._page.inner_text('#state')}")
        self.started_at = state[1] / 1000
        end = self.started_at + seconds + 0.5  # the last audio through the jitter buffer and the decoder
        killed_at = _speak(lambda: time.time() < end, lambda: self.started_at, seconds / 2, kill)
        self._page.click("#talk")
        self._page.wait_for_function("window.monologuePlayer.talkState === 'stopped'", timeout=30_000)
        return killed_at


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) > 1 else float(statistics.mean(values))


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} ms"
