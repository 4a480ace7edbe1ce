"""`monologue bench pipeline`: render minutes of real speech through the Pipeline and the segment
encoder on this machine, with no Temporal and no storage in the way, and print what it cost.

A benchmark, not a test: it prints figures (frames/s, realtime ratio, per-stage ms per chunk,
encode share, peak RSS) and asserts nothing about speed.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import asdict, dataclass

import numpy as np

from gpu_worker.models import build_family
from gpu_worker.pipeline import ChunkRequest, OutputSpec, Pipeline
from gpu_worker.publish import SegmentWriter, StreamFormat, init_segment
from monologue import SAMPLES
from monologue.contracts import Family, LipSync, Resolution
from monologue.media import AUDIO_RATE, decode_png, decode_wav, normalise_audio, normalise_portrait
from monologue.plan import frame_count, plan_chunks


class LoopedSpeech:
    """Real speech (the bundled sample) repeated to any length, read by range without materialising it,
    so a 15-minute benchmark holds no more audio in memory than a 1-minute one."""

    rate = AUDIO_RATE

    def __init__(self, speech: np.ndarray, total_samples: int) -> None:
        self.speech = speech
        self.total_samples: int | None = total_samples

    def read(self, start: int, end: int) -> np.ndarray:
        out = np.zeros(max(0, end - start), dtype=np.float32)
        lo, hi = max(start, 0), min(end, self.total_samples or 0)
        if hi > lo:
            positions = np.arange(lo, hi) % len(self.speech)
            out[lo - start : hi - start] = self.speech[positions]
        return out


@dataclass
class BenchReport:
    family: str
    lip_sync: str
    width: int
    height: int
    fps: int
    frames: int
    chunks: int
    wall_s: float
    frames_per_s: float
    realtime_ratio: float  # video seconds per wall second
    encode_share: float  # fraction of the wall time spent in the H.264/AAC encoder
    stage_ms_p50: dict[str, float]
    stage_ms_p95: dict[str, float]
    stage_ms_per_audio_s: dict[str, float]  # each stage's total ms over the session, per second of speech
    # CPU time, which a machine shared with other work inflates far less than wall time: the process's (all
    # threads), and the phone recogniser's alone (warp visemes; 0 otherwise), per second of speech.
    cpu_s: float
    video_s_per_cpu_s: float
    recognition_cpu_ms_per_audio_s: float
    peak_rss_mb: float

    def table(self) -> str:
        lines = [
            f"{self.family} ({self.lip_sync}) {self.width}x{self.height}@{self.fps}: {self.frames} frames in"
            f" {self.chunks} chunks, {self.wall_s:.1f} s",
            f"  frames/s          {self.frames_per_s:8.1f}",
            f"  realtime ratio    {self.realtime_ratio:8.2f}  (video seconds per wall second)",
            f"  video s per CPU s {self.video_s_per_cpu_s:8.2f}  ({self.cpu_s:.1f} CPU s, all threads)",
            f"  phone recognition {self.recognition_cpu_ms_per_audio_s:8.1f}  CPU ms per second of speech",
            f"  encode share      {100 * self.encode_share:7.1f} %",
            f"  peak RSS          {self.peak_rss_mb:8.1f} MB",
            "  per chunk (ms)        p50      p95   per audio s",
        ]
        lines += [
            f"    {name:<16} {self.stage_ms_p50[name]:8.1f} {self.stage_ms_p95[name]:8.1f}"
            f" {self.stage_ms_per_audio_s[name]:8.1f}"
            for name in self.stage_ms_p50
        ]
        return "\n".join(lines)


def bench_pipeline(
    *,
    minutes: float,
    resolution: Resolution = Resolution.HD_720,
    preview: bool = False,
    family: Family = Family.WARP,
    fps: int = 25,
    chunk_frames: int = 40,
    i_frames: int = 4,
    seed: int = 0,
    lip_sync: LipSync = LipSync.VISEMES,
) -> BenchReport:
    """Render `minutes` of speech in generation order, encoding every chunk's segment."""
    portrait = decode_png(normalise_portrait((SAMPLES / "portrait.jpg").read_bytes()).png)
    speech = decode_wav(normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav)
    audio = LoopedSpeech(speech, int(minutes * 60 * AUDIO_RATE))
    output = OutputSpec(fps=fps, resolution=resolution, preview=preview)
    pipeline = Pipeline(build_family(family))
    session = pipeline.start_session(portrait, output, audio)
    stream = StreamFormat(width=session.frame_width, height=session.frame_height, fps=fps)
    init_segment(stream)
    frames = frame_count(audio.total_samples or 0, rate=AUDIO_RATE, fps=fps)
    plan = plan_chunks(frames, n_frames=chunk_frames, i_frames=i_frames)
    per_stage: dict[str, list[float]] = {}
    encode_seconds = 0.0
    started, cpu_started = time.perf_counter(), _cpu_seconds()
    for spec in plan:
        writer = SegmentWriter(stream, first_frame=spec.first_frame, audio=audio)
        chunk = ChunkRequest(spec, seed, lip_sync=lip_sync)
        result = pipeline.run_chunk(session, chunk, writer)
        writer.finish()
        encode_seconds += writer.encode_seconds
        stage_ms = writer.stage_ms(result.stage_ms)
        for name, value in stage_ms.items():
            per_stage.setdefault(name, []).append(value)
    wall, cpu = time.perf_counter() - started, _cpu_seconds() - cpu_started
    recogniser = getattr(pipeline.models.context, "recogniser", None)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    audio_seconds = (audio.total_samples or 0) / AUDIO_RATE
    return BenchReport(
        family=family,
        lip_sync=lip_sync.value,
        width=session.frame_width,
        height=session.frame_height,
        fps=fps,
        frames=frames,
        chunks=len(plan),
        wall_s=wall,
        frames_per_s=frames / wall,
        realtime_ratio=frames / fps / wall,
        encode_share=encode_seconds / wall,
        stage_ms_p50={name: float(np.percentile(v, 50)) for name, v in per_stage.items()},
        stage_ms_p95={name: float(np.percentile(v, 95)) for name, v in per_stage.items()},
        stage_ms_per_audio_s={name: float(np.sum(v)) / audio_seconds for name, v in per_stage.items()},
        cpu_s=cpu,
        video_s_per_cpu_s=frames / fps / cpu,
        recognition_cpu_ms_per_audio_s=1000 * (recogniser.decode_cpu_s if recogniser else 0.0) / audio_seconds,
        peak_rss_mb=peak_kb / 1024,
    )


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def report_json(report: BenchReport) -> str:
    return json.dumps(asdict(report))
