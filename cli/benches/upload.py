"""`monologue bench upload`: what one small, hostile upload costs the process that decodes it.

An hour of digital silence compresses to about half a megabyte of FLAC and decodes to 115 MB of 44.1 kHz
stereo. Uploads are decoded when a session is submitted (on a node, which checks them for the API), so this
is the figure that says whether a tiny request can run a process out of memory. Prints the upload's size,
the outcome and how much the peak RSS grew (figures for docs/benchmarks.md; nothing here asserts)."""

from __future__ import annotations

import io
import resource
import time
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from monologue.media import normalise_audio


def silence_flac(seconds: int = 3600, rate: int = 44_100) -> bytes:
    """`seconds` of digital silence as stereo FLAC, encoded one second at a time (never held whole)."""
    second = np.zeros((2, rate), np.int16)  # planar s16
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="stereo")
        for index in range(seconds):
            frame = av.AudioFrame.from_ndarray(second, format="s16p", layout="stereo")
            frame.rate, frame.pts, frame.time_base = rate, index * rate, Fraction(1, rate)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


@dataclass(frozen=True)
class UploadReport:
    upload_mb: float
    outcome: str
    peak_rss_growth_mb: float
    seconds: float

    def line(self) -> str:
        return (
            f"upload {self.upload_mb:.2f} MB: {self.outcome}; peak RSS grew {self.peak_rss_growth_mb:.0f} MB"
            f" in {self.seconds:.1f} s"
        )


def bench_upload(*, max_seconds: float | None, seconds: int = 3600) -> UploadReport:
    """Decode `seconds` of FLAC silence as a node does when it checks an upload, with the audio limit `max_seconds`."""
    data = silence_flac(seconds)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    started = time.perf_counter()
    try:
        outcome = f"accepted, {normalise_audio(data, max_seconds=max_seconds).seconds:.0f} s"
    except Exception as err:  # an InputError is the expected refusal; report any error as the outcome
        outcome = f"refused ({str(err).split(';')[0]})"
    elapsed = time.perf_counter() - started
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return UploadReport(len(data) / 1e6, outcome, grown / 1024, elapsed)
