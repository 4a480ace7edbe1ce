"""`monologue bench live --webrtc --calibrate`: the A/V measure of cli/benches/webrtc_sync.py read on a stream whose
sync is known, so that its own bias shows.

A page in headless Chromium sends itself a WebRTC stream from one peer connection to another: a canvas that turns
dark for 300 ms and, at the same instants, a 440-Hz tone (WebAudio), both captured and stamped by Chromium's own
sender (the capture clock the receiver's A/V sync relies on). The receiving side is set up as the player page's (the
`<video id="video">`, the smallest jitter buffer asked for) and read by the same probes: each presented frame's dark
share (FRAME_PROBE: the frame callback's time), the audio output's loudness (AUDIO_PROBE), the receiver's stats
(STATS_PROBE). Per event, seen − heard is what the measure reads for a stream Chromium itself keeps in sync; a live
session's offset by content is to be read against it. The flash is drawn at the first animation frame after the
tone's audio clock passed its start (up to a frame at 60 Hz late: the figure printed carries that, ≤ +17 ms, on the
video's side). Nothing here asserts."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from cli.benches.webrtc_sync import AUDIO_PROBE, HEARD_THRESHOLD, STATS_PROBE, onsets

EVENT_S, ON_S = 1.5, 0.3  # a flash and tone every EVENT_S, each ON_S long
URL = "http://localhost/calibrate"  # served by the page's route (localhost: a secure context, as AudioWorklet needs)

PAGE = """<!doctype html><html><body>
<video id="video" autoplay playsinline></video>
<script>
const canvas = document.createElement("canvas");
canvas.width = 256; canvas.height = 256;
const draw = canvas.getContext("2d");
const audio = new AudioContext();
const tone = audio.createOscillator();
const gain = audio.createGain();
const out = audio.createMediaStreamDestination();
gain.gain.value = 0;
tone.frequency.value = 440;
tone.connect(gain).connect(out);
tone.start();
const events = [];  // audio-clock start of each event
window.__drawn = [];  // wall ms when each flash was drawn
const source = new MediaStream([...canvas.captureStream().getVideoTracks(), ...out.stream.getAudioTracks()]);
const EVENT_S = %(event)s, ON_S = %(on)s;

function schedule() {
  const at = audio.currentTime + 0.2;
  gain.gain.setValueAtTime(0.5, at);
  gain.gain.setValueAtTime(0, at + ON_S);
  events.push(at);
  setTimeout(schedule, EVENT_S * 1000);
}

function paint() {
  const now = audio.currentTime;
  const on = events.some((at) => now >= at && now < at + ON_S);
  if (on && !paint.on) window.__drawn.push(performance.timeOrigin + performance.now());
  paint.on = on;
  draw.fillStyle = on ? "#000" : "#ddd";
  draw.fillRect(0, 0, 256, 256);
  requestAnimationFrame(paint);
}

async function connect() {
  const sender = new RTCPeerConnection(), receiver = new RTCPeerConnection();
  window.monologuePlayer = { pc: receiver };
  sender.onicecandidate = (e) => e.candidate && receiver.addIceCandidate(e.candidate);
  receiver.onicecandidate = (e) => e.candidate && sender.addIceCandidate(e.candidate);
  const shown = new MediaStream();
  receiver.ontrack = (event) => {
    if ("jitterBufferTarget" in event.receiver) event.receiver.jitterBufferTarget = 0;  // as the player page asks
    shown.addTrack(event.track);
    document.getElementById("video").srcObject = shown;
  };
  source.getTracks().forEach((track) => sender.addTrack(track, source));
  await sender.setLocalDescription();
  await receiver.setRemoteDescription(sender.localDescription);
  await receiver.setLocalDescription();
  await sender.setRemoteDescription(receiver.localDescription);
}

paint();
connect().then(() => setTimeout(schedule, 2000));
</script></body></html>
"""


@dataclass
class Calibration:
    """Per event, seen − heard in the page (ms), for a stream Chromium's own sender keeps in sync."""

    offsets_ms: list[float] = field(default_factory=list)
    events: int = 0
    sync_ms: list[float] = field(default_factory=list)  # STATS_PROBE's video − audio played out (sender's clock)

    def line(self) -> str:
        if not self.offsets_ms:
            return f"calibration: no event read ({self.events} sent)"
        values = " ".join(f"{v:+.0f}" for v in self.offsets_ms)
        median = statistics.median(self.offsets_ms)
        return (
            f"calibration (Chromium → Chromium, the same probes): seen − heard median {median:+.0f} ms"
            f" over {len(self.offsets_ms)} of {self.events} events ({values}); by the receiver's stats"
            f" {statistics.median(self.sync_ms) if self.sync_ms else float('nan'):+.0f} ms"
        )


def calibrate(*, events: int = 12, chromium: str = "chromium") -> Calibration:
    """Run the page for `events` flashes and read them back."""
    from playwright.sync_api import sync_playwright

    from cli.benches.webrtc import CHROMIUM_FLAGS, FRAME_PROBE
    from cli.chromium import CHROMIUM_ARGS

    page_html = PAGE % {"event": EVENT_S, "on": ON_S}
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium, args=[*CHROMIUM_ARGS, *CHROMIUM_FLAGS], headless=True
        )
        try:
            page = browser.new_page()
            page.route(URL, lambda route: route.fulfill(body=page_html, content_type="text/html"))
            page.add_init_script(FRAME_PROBE + AUDIO_PROBE + STATS_PROBE)
            page.goto(URL)
            time.sleep(3.0 + events * EVENT_S)
            series: list[list[float]] = page.evaluate("window.__frames")
            heard: list[list[float]] = page.evaluate("window.__heard")
            drawn: list[float] = page.evaluate("window.__drawn")
            playout: list[list[float]] = page.evaluate("window.__sync")
        finally:
            browser.close()
    return Calibration(read_offsets(series, heard), len(drawn), [offset for _, offset in playout])


def read_offsets(series: list[list[float]], heard: list[list[float]]) -> list[float]:
    """Each flash seen (the frames' dark share past half way) − the nearest tone heard before or after it."""
    if not series or not heard:
        return []
    times = np.array([t for t, _ in series])
    dark = np.array([float(np.mean(cells)) for _, cells in series])
    seen = onsets(times, dark, threshold=(dark.min() + dark.max()) / 2, quiet=500 * EVENT_S)
    heard_t, levels = np.array([t for t, _ in heard]), np.array([v for _, v in heard])
    tones = onsets(heard_t, levels, threshold=HEARD_THRESHOLD * levels.max(), quiet=500 * EVENT_S)
    out = []
    for flash in seen:
        nearest = min(tones, key=lambda tone: abs(tone - flash), default=None)
        if nearest is not None and abs(flash - nearest) < 500 * ON_S:
            out.append(flash - nearest)
    return out
