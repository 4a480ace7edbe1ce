"""The init segment shared by a session, and SegmentWriter, which turns one chunk into one fMP4 fragment."""

from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from .audio import audio_specific_config, encode_packets
from .mp4 import (
    AUDIO_TRACK,
    NON_SYNC_SAMPLE_FLAGS,
    SYNC_SAMPLE_FLAGS,
    VIDEO_TRACK,
    TrackRun,
    build_fragment,
    build_init,
)
from .resample import FACTOR, AudioSource
from .stream_format import AAC_PACKET_SAMPLES, AUDIO_BIT_RATE, StreamFormat, audio_packet_range
from .video import ChunkEncoder, parameter_sets


@lru_cache(maxsize=16)
def _cached_init(fmt: StreamFormat) -> tuple[bytes, tuple[bytes, bytes]]:
    sps, pps = parameter_sets(fmt)
    init = build_init(
        width=fmt.width,
        height=fmt.height,
        video_timescale=fmt.video_timescale,
        sps=sps,
        pps=pps,
        audio_rate=fmt.audio_rate,
        audio_config=audio_specific_config(fmt.audio_rate),
        audio_bit_rate=AUDIO_BIT_RATE,
    )
    return init, (sps, pps)


def init_segment(fmt: StreamFormat) -> bytes:
    """ftyp + moov (with mvex) for one H.264 track and one AAC-LC mono track.

    The bytes depend only on `fmt` (no dates, no tool names): every chunk of a session shares them.
    """
    return _cached_init(fmt)[0]


def sequence_number(first_frame: int) -> int:
    """The mfhd sequence number of the fragment starting at `first_frame`: first_frame + 1.

    It grows along the timeline, as ISO 14496-12 asks, without any segment knowing its neighbours.
    """
    return first_frame + 1


class SegmentWriter:
    """A FrameSink: encodes one chunk's frames incrementally into one fMP4 fragment (moof + mdat).

    The fragment depends only on (fmt, first_frame, the frames, the session's audio): a chunk can be produced in any
    order, on any machine, and again after a crash, and always yields the same bytes (see StreamFormat on threads).
    Video: frame f has decode and presentation time f / fps. Audio: the grid packets starting inside the chunk's
    span (see audio_packet_range), so the segments' audio tiles the timeline; the last segment's last packet may
    end up to 1024 samples (21 ms at 48 kHz) after the video.
    """

    def __init__(self, fmt: StreamFormat, *, first_frame: int, audio: AudioSource) -> None:
        if first_frame < 0:
            raise ValueError(f"first_frame must be >= 0, got first_frame={first_frame}")
        if fmt.audio_rate != FACTOR * audio.rate:
            raise ValueError(f"fmt.audio_rate={fmt.audio_rate} must be 3 × the source rate audio.rate={audio.rate}")
        self._fmt = fmt
        self._first_frame = first_frame
        self._audio = audio
        self._video = ChunkEncoder(fmt, first_frame)
        if self._video.parameter_sets != _cached_init(fmt)[1]:
            raise RuntimeError("libx264 chose other SPS/PPS than the init segment's: check the encoder build")
        self._frame_count = 0
        self._finished = False
        self.write_seconds = 0.0  # time spent encoding inside write() (the pipeline's decode stage calls it)
        self.encode_seconds = 0.0  # all encoding time: write() and finish()

    def stage_ms(self, pipeline_stage_ms: dict[str, float]) -> dict[str, float]:
        """The pipeline's per-stage milliseconds with the encoder's time split out of decode_publish as `encode`."""
        stage_ms = dict(pipeline_stage_ms)
        if "decode_publish" in stage_ms:
            stage_ms["decode_publish"] -= self.write_seconds * 1000
        stage_ms["encode"] = self.encode_seconds * 1000
        return stage_ms

    def write(self, frames: np.ndarray) -> None:
        """Encode frames (T, H, W, 3) uint8 RGB, the chunk's next T frames."""
        if self._finished:
            raise RuntimeError("SegmentWriter.write after finish")
        expected = (self._fmt.height, self._fmt.width, 3)
        if frames.ndim != 4 or frames.shape[1:] != expected or frames.dtype != np.uint8:
            raise ValueError(
                f"frames must be (T, {expected[0]}, {expected[1]}, 3) uint8, got shape {frames.shape} {frames.dtype}"
            )
        started = time.perf_counter()
        self._video.encode(frames)
        self._frame_count += frames.shape[0]
        elapsed = time.perf_counter() - started
        self.write_seconds += elapsed
        self.encode_seconds += elapsed

    def finish(self) -> bytes:
        """The fragment (moof + mdat, no styp) for every frame written and the audio packets of their span."""
        if self._finished:
            raise RuntimeError("SegmentWriter.finish called twice")
        if self._frame_count == 0:
            raise ValueError("SegmentWriter.finish: a segment needs at least one frame, got 0")
        self._finished = True
        started = time.perf_counter()
        video_samples = self._video.finish()
        fmt = self._fmt
        first_packet, end_packet = audio_packet_range(self._first_frame, self._frame_count, fmt.fps, fmt.audio_rate)
        audio_samples = encode_packets(self._audio, fmt.audio_rate, first_packet, end_packet)
        video = TrackRun(
            track_id=VIDEO_TRACK,
            base_time=self._first_frame * fmt.frame_ticks,
            sample_duration=fmt.frame_ticks,
            samples=video_samples,
            first_sample_flags=SYNC_SAMPLE_FLAGS,
            default_flags=NON_SYNC_SAMPLE_FLAGS,
        )
        audio = TrackRun(
            track_id=AUDIO_TRACK,
            base_time=first_packet * AAC_PACKET_SAMPLES,
            sample_duration=AAC_PACKET_SAMPLES,
            samples=audio_samples,
            first_sample_flags=SYNC_SAMPLE_FLAGS,
            default_flags=SYNC_SAMPLE_FLAGS,
        )
        fragment = build_fragment(sequence_number(self._first_frame), [video, audio])
        self.encode_seconds += time.perf_counter() - started
        return fragment
