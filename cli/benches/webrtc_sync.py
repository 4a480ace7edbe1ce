"""The A/V offset of a live WebRTC session as the page plays it, by content (cli/benches/webrtc.py's figures).

Each speech onset is found twice in the page: *heard* (the received audio's loudness as the audio output plays it)
and *seen* (the mouth opening in the presented frames, as glass-to-glass finds it). Their difference holds the model's
own lag (a mouth opens a frame or two after the sound starts), which the session's stored output shows without any
network: the same mouth measure on its HLS frames (frame n at n / fps of the session's timeline) against the onset
found the page's way in the speech sent (sample 0 = the session's first). The offset per onset = (seen − heard in
the page) − (the same on the session's timeline): positive when the browser shows the video later than the audio.

STATS_PROBE reads the same from the receiver's stats (`estimatedPlayoutTimestamp` of both tracks, on the sender's
clock), which aiortc's sender reports skew by the video's encoding time (a frame is stamped when it is sent)."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from monologue import keys

# Added to the player page: the received audio's loudness, a render quantum (128 samples) at a time, with the wall time
# it comes out of the audio output: an AudioWorklet sees each quantum with its context time, and the context's
# `getOutputTimestamp()` maps context time to when that sample is played (the output's latency included).
AUDIO_PROBE = """
window.__heard = [];
const TAP = `class Tap extends AudioWorkletProcessor {
  process(inputs) {
    const data = inputs[0][0];
    if (data) {
      let sum = 0;
      for (let i = 0; i < data.length; i++) sum += data[i] * data[i];
      this.port.postMessage([currentTime, Math.sqrt(sum / data.length)]);
    }
    return true;
  }
}
registerProcessor("tap", Tap);`;
let heardTrack = null;
const listen = async () => {
  const video = document.getElementById("video");
  const track = video && video.srcObject && video.srcObject.getAudioTracks()[0];
  if (track && track !== heardTrack) {  // the first connection's, then each reconnection's
    heardTrack = track;
    const context = new AudioContext();
    await context.audioWorklet.addModule(URL.createObjectURL(new Blob([TAP], { type: "text/javascript" })));
    const tap = new AudioWorkletNode(context, "tap");
    tap.port.onmessage = (event) => {
      const [at, level] = event.data;
      const played = context.getOutputTimestamp();
      if (!played.performanceTime) return;  // the output has not started
      window.__heard.push([performance.timeOrigin + played.performanceTime + 1000 * (at - played.contextTime), level]);
    };
    context.createMediaStreamSource(new MediaStream([track])).connect(tap);
    tap.connect(context.destination);
  }
  setTimeout(listen, 50);
};
document.addEventListener("DOMContentLoaded", listen);
"""


STATS_PROBE = """
// A/V sync as the browser plays: the sender-clock (NTP) time of the last video frame and audio sample played out,
// from the receiver's stats (RTCP sender reports map both tracks' RTP clocks onto the sender's wall clock).
window.__sync = [];
setInterval(async () => {
  const pc = window.monologuePlayer && window.monologuePlayer.pc;
  if (!pc || pc.connectionState !== "connected") return;
  const played = {};
  (await pc.getStats()).forEach((s) => {
    if (s.type === "inbound-rtp" && s.estimatedPlayoutTimestamp) played[s.kind] = s.estimatedPlayoutTimestamp;
  });
  if (played.audio && played.video) {
    window.__sync.push([performance.timeOrigin + performance.now(), played.video - played.audio]);
  }
}, 97);
"""


def onsets(times: np.ndarray, level: np.ndarray, *, threshold: float, quiet: float) -> list[float]:
    """Times where `level` rises above `threshold` after at least `quiet` (in the unit of `times`) below it (the
    first counts)."""
    loud = times[level > threshold]
    return [float(t) for i, t in enumerate(loud) if i == 0 or t - loud[i - 1] > quiet]


HEARD_THRESHOLD = 0.25  # of the loudest level: an onset, in the page and in the speech sent alike
QUANTUM_S = 128 / 48_000  # the page's level windows: one render quantum of its AudioContext


def heard_onsets_s(pcm: np.ndarray, rate: int, *, gap_s: float) -> list[float]:
    """The onsets of the speech sent (s from its sample 0) as the page finds them in what it hears: the level of each
    QUANTUM_S window past HEARD_THRESHOLD of the loudest (a sound's attack takes tens of ms to get there, so the
    samples where a burst starts would read as the page hearing it late)."""
    window = max(1, round(rate * QUANTUM_S))
    usable = len(pcm) // window * window
    windows = pcm[:usable].astype(np.float64).reshape(-1, window)
    level = np.sqrt((windows**2).mean(axis=1))
    times = np.arange(len(level)) * window / rate
    return onsets(times, level, threshold=HEARD_THRESHOLD * level.max(), quiet=gap_s / 2)


def stored_cells(root: Path, session_id: str) -> tuple[np.ndarray, float]:
    """`grid_cells` of the session's published frames in timeline order, from its stored HLS (init + segments),
    and their rate (a frame at a time: a whole session's frames would take hundreds of MB)."""
    import av

    folder = root / keys.output(session_id, "")
    names = [line for line in (folder / "stream.m3u8").read_text().splitlines() if line and not line.startswith("#")]
    data = (folder / "init.mp4").read_bytes() + b"".join((folder / name).read_bytes() for name in names)
    with av.open(io.BytesIO(data), mode="r") as container:
        fps = float(container.streams.video[0].average_rate or 25)
        cells = [grid_cells(frame.to_ndarray(format="rgb24")[None])[0] for frame in container.decode(video=0)]
    return np.stack(cells), fps


def grid_cells(frames: np.ndarray, grid: int = 32) -> np.ndarray:
    """(T, H, W, 3) → (T, grid²): each cell's share of near-black pixels, as the page's probe measures it."""
    _, h, w, _ = frames.shape
    rows = (np.arange(h) * grid // h)[:, None]
    cols = (np.arange(w) * grid // w)[None, :]
    cell = (rows * grid + cols).ravel()
    out = []
    for frame in frames:
        dark = (frame @ np.array([0.299, 0.587, 0.114])) < 50
        out.append(np.bincount(cell, weights=dark.ravel(), minlength=grid * grid) / (h * w / grid**2))
    return np.stack(out)


def mouth_openings(times: np.ndarray, mouth: np.ndarray, *, quiet: float) -> list[float] | None:
    """When each run of mouth openings starts after a closed spell of over `quiet` (the unit of `times`): open is
    past 40 % of the way from the mouth's 10th to its 98th percentile. None when the mouth never moved. Both the
    page's frames (glass-to-glass) and the stored output (the model's own lag) are read this way."""
    closed, opened = float(np.percentile(mouth, 10)), float(np.percentile(mouth, 98))
    if opened - closed < 0.05:
        return None
    return onsets(times, mouth, threshold=closed + 0.4 * (opened - closed), quiet=quiet)


def answered(onsets_ms: list[float], openings_ms: list[float]) -> list[float]:
    """Each onset's latency: the first mouth opening after it and before the next onset (none there: the onset was
    missed, e.g. spoken while no node sent frames, its frames skipped when the viewer caught up)."""
    out = []
    for onset, upto in zip(onsets_ms, [*onsets_ms[1:], float("inf")], strict=True):
        first = next((start for start in openings_ms if onset <= start < upto), None)
        if first is not None:
            out.append(float(first - onset))
    return out


@dataclass(frozen=True)
class Timeline:
    """The session's stored output: the mouth per frame, the frame rate, the onsets' times (s) in its speech."""

    mouth: np.ndarray
    fps: float
    onsets_s: list[float]

    def own_lags_s(self, gap_s: float) -> list[float]:
        """Per onset: the mouth's opening − the onset on the session's own timeline (the model's lag or lead)."""
        shown = mouth_openings(np.arange(len(self.mouth)) / self.fps, self.mouth, quiet=gap_s / 2) or []
        return [mouth_at - onset for mouth_at, onset in zip(shown, self.onsets_s, strict=False)]


def content_offsets(
    seen_ms: list[float], heard: list[list[float]], stored: Timeline, *, first_sent_ms: float, gap_s: float
) -> list[float]:
    """The A/V offsets (ms) from the page's mouth openings (`seen_ms`, wall ms per onset), its heard loudness
    samples ((wall ms, RMS) pairs) and the stored output."""
    times, levels = np.array([t for t, _ in heard]), np.array([v for _, v in heard])
    heard_at = onsets(times, levels, threshold=HEARD_THRESHOLD * levels.max(), quiet=500 * gap_s)
    heard_ms = [t for t in heard_at if t > first_sent_ms - 500]  # nothing heard before the first onset was sent
    return av_offsets(seen_ms, heard_ms, stored.own_lags_s(gap_s))


def av_offsets(
    seen_ms: list[float], heard_ms: list[float], own_lag_s: list[float], *, tolerance_ms: float = 400.0
) -> list[float]:
    """Per onset: (seen − heard in the page) − the model's own lag, in ms; onsets missing on either side, or whose
    page lag is far from any sense (a missed detection), are left out."""
    out = []
    for seen, heard, own in zip(seen_ms, heard_ms, own_lag_s, strict=False):
        if abs(seen - heard) < tolerance_ms:
            out.append(seen - heard - 1000 * own)
    return out
