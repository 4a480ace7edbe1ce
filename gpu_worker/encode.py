"""Encode rendered chunks to H.264 segments, and stitch the segments plus the speech into the final MP4.

Segments are encoded once and then only remuxed: every segment starts with an IDR frame and is encoded with
identical options (hence identical SPS/PPS), so their packets concatenate into one valid stream.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
import numpy as np

_VIDEO_CODEC = "libx264"
# Fixed for every segment: any difference here could change SPS/PPS and break the stitched stream.
# bframes=0 keeps decode order = display order; keyint=infinite with scenecut=0 makes each segment one GOP.
_X264_OPTIONS = {
    "crf": "20",
    "preset": "veryfast",
    "x264-params": "keyint=infinite:min-keyint=1:scenecut=0:bframes=0:open-gop=0:repeat-headers=0",
}
_AUDIO_RATE = 48000
_AUDIO_BIT_RATE = 96_000
_AUDIO_FRAME = 1024  # AAC frame size in samples
# Source audio is fed to the resampler in blocks of this many seconds, so memory does not grow with length.
_AUDIO_BLOCK_SECONDS = 10


def encode_video_segment(frames: np.ndarray, *, fps: int, path: Path) -> None:
    """Encode frames (T, H, W, 3) uint8 RGB to an MP4 holding one H.264 stream of one GOP."""
    if frames.ndim != 4 or frames.shape[3] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be (T, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    count, height, width = frames.shape[:3]
    if count == 0:
        raise ValueError("frames: a segment needs at least one frame")
    if height % 2 or width % 2:
        raise ValueError(f"frames: yuv420p needs even sizes, got {width}x{height}")
    time_base = Fraction(1, fps)
    with av.open(str(path), mode="w", format="mp4") as container:
        stream = cast(av.VideoStream, container.add_stream(_VIDEO_CODEC, rate=fps, options=dict(_X264_OPTIONS)))
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.time_base = time_base
        stream.codec_context.time_base = time_base
        for index in range(count):
            frame = av.VideoFrame.from_ndarray(frames[index], format="rgb24")
            frame.pts = index
            frame.time_base = time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def _segment_frame_count(path: Path) -> int:
    """Frames in one segment: the container's count when it has one, else counted from packets."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.frames > 0:
            return int(stream.frames)
        return sum(1 for packet in container.demux(stream) if packet.size > 0)


def _video_packets(segment_paths: Sequence[Path], fps: int) -> Iterator[tuple[Fraction, av.Packet[Any]]]:
    """Every segment's packets in order, in frames (time_base 1/fps), shifted past the earlier segments."""
    frame_base = Fraction(1, fps)
    offset = 0
    for path in segment_paths:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            source_base = stream.time_base
            if source_base is None:
                raise ValueError(f"segment {path} has no video time base")
            count = 0
            for packet in container.demux(stream):
                if packet.size == 0:
                    continue  # the demuxer's end-of-stream marker
                if packet.pts is None:
                    raise ValueError(f"segment {path} has a video packet without a timestamp")
                # No B-frames, so dts == pts and each packet is one frame.
                index = offset + round(packet.pts * source_base * fps)
                packet.pts = index
                packet.dts = index
                packet.duration = 1
                packet.time_base = frame_base
                count += 1
                yield index * frame_base, packet
            offset += count


def _stamped(samples: np.ndarray, pts: int) -> av.AudioFrame:
    """A 48 kHz mono frame from (1, n) float32 samples, timed in samples so the encoder keeps them gapless."""
    contiguous = np.ascontiguousarray(samples, dtype=np.float32)  # (1, n)
    frame = av.AudioFrame.from_ndarray(contiguous, format="fltp", layout="mono")
    frame.pts = pts
    frame.sample_rate = _AUDIO_RATE
    frame.time_base = Fraction(1, _AUDIO_RATE)
    return frame


def _audio_frames(audio: np.ndarray, rate: int, total: int) -> Iterator[av.AudioFrame]:
    """`audio` at 48 kHz in 1024-sample frames, trimmed or padded with silence to exactly `total` samples."""
    resampler = av.AudioResampler(format="fltp", layout="mono", rate=_AUDIO_RATE, frame_size=_AUDIO_FRAME)
    block = _AUDIO_BLOCK_SECONDS * rate

    def resampled() -> Iterator[av.AudioFrame]:
        for start in range(0, audio.shape[0], block):
            chunk = np.ascontiguousarray(audio[start : start + block], dtype=np.float32)[None, :]  # (1, n)
            frame = av.AudioFrame.from_ndarray(chunk, format="flt", layout="mono")
            frame.sample_rate = rate
            yield from resampler.resample(frame)
        yield from resampler.resample(None)

    emitted = 0
    for frame in resampled():
        keep = min(frame.samples, total - emitted)
        if keep <= 0:
            break  # speech longer than the video: the rest is dropped
        yield _stamped(frame.to_ndarray()[:, :keep], emitted)  # (1, keep)
        emitted += keep
    while emitted < total:  # speech shorter than the video: pad with silence
        keep = min(_AUDIO_FRAME, total - emitted)
        yield _stamped(np.zeros((1, keep), dtype=np.float32), emitted)
        emitted += keep


def _audio_packets(
    stream: av.AudioStream, frames: Iterator[av.AudioFrame]
) -> Iterator[tuple[Fraction, av.Packet[Any]]]:
    """Encoded AAC packets with their decode time in seconds, for interleaving with the video."""
    for frame in frames:
        for packet in stream.encode(frame):
            yield _packet_time(packet), packet
    for packet in stream.encode(None):
        yield _packet_time(packet), packet


def _packet_time(packet: av.Packet[Any]) -> Fraction:
    if packet.dts is None or packet.time_base is None:
        return Fraction(0)
    return packet.dts * packet.time_base


def mux_final(
    segment_paths: Sequence[Path], audio: np.ndarray, *, rate: int, fps: int, n_frames: int, path: Path
) -> None:
    """Concatenate H.264 segments without re-encoding and add the speech as AAC, durations matched exactly.

    `audio` is float32 mono at `rate` Hz; it is padded with silence or trimmed to n_frames / fps seconds.
    """
    if not segment_paths:
        raise ValueError("mux_final needs at least one segment")
    if audio.ndim != 1:
        raise ValueError(f"audio must be mono (N,), got shape {audio.shape}")
    if rate <= 0 or fps <= 0 or n_frames <= 0:
        raise ValueError(f"bad timing: rate={rate} fps={fps} n_frames={n_frames}")
    counted = sum(_segment_frame_count(segment) for segment in segment_paths)
    if counted != n_frames:
        raise ValueError(f"segments hold {counted} frames but the video needs n_frames={n_frames}")
    with av.open(str(segment_paths[0])) as first:
        template_stream = first.streams.video[0]
        extradata = template_stream.codec_context.extradata
        for segment in segment_paths[1:]:
            with av.open(str(segment)) as other:
                if other.streams.video[0].codec_context.extradata != extradata:
                    raise ValueError(f"segment {segment} was encoded with other settings (SPS/PPS differ)")

        total_samples = round(n_frames * _AUDIO_RATE / fps)
        with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as output:
            video = output.add_stream_from_template(template_stream)
            video.time_base = Fraction(1, fps)
            audio_stream = output.add_stream("aac", rate=_AUDIO_RATE, layout="mono")
            audio_stream.bit_rate = _AUDIO_BIT_RATE
            audio_stream.time_base = Fraction(1, _AUDIO_RATE)

            video_packets = ((time, 0, packet) for time, packet in _video_packets(segment_paths, fps))
            audio_frames = _audio_frames(audio, rate, total_samples)
            audio_packets = ((time, 1, packet) for time, packet in _audio_packets(audio_stream, audio_frames))
            # Interleave by time so players can start before the whole file is read (with faststart).
            for _, kind, packet in heapq.merge(video_packets, audio_packets, key=lambda item: item[:2]):
                packet.stream = video if kind == 0 else audio_stream
                output.mux(packet)
