from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gpu_worker.publish import (
    SegmentWriter,
    StreamFormat,
    audio_packet_range,
    concat,
    init_segment,
    playlist,
    probe_warnings,
    upsample,
)
from gpu_worker.publish.mp4 import AUDIO_TRACK, VIDEO_TRACK, fragment_timing
from gpu_worker.publish.segment import _cached_init

SOURCE_RATE = 16_000
OUTPUT_RATE = 48_000
FPS = 25
WIDTH, HEIGHT = 128, 96
INDEX_BITS = 8
BLOCK = 16  # the frame index is drawn as INDEX_BITS black/white 16×16 blocks along the top


class MemoryAudio:
    """An in-memory AudioSource."""

    rate = SOURCE_RATE

    def __init__(self, samples: np.ndarray) -> None:
        self.samples = samples.astype(np.float32)  # (N,)
        self.total_samples: int | None = samples.shape[0]

    def read(self, start: int, end: int) -> np.ndarray:
        output = np.zeros(end - start, dtype=np.float32)
        low, high = max(start, 0), min(end, self.samples.shape[0])
        if high > low:
            output[low - start : high - start] = self.samples[low:high]
        return output


def indexed_frames(first: int, count: int, width: int = WIDTH, height: int = HEIGHT) -> np.ndarray:
    """Smooth moving gradients with each frame's absolute index written as bits in the top blocks."""
    rows = np.arange(height, dtype=np.float32)[:, None]
    columns = np.arange(width, dtype=np.float32)[None, :]
    frames = np.empty((count, height, width, 3), dtype=np.uint8)  # (T, H, W, 3)
    for offset in range(count):
        index = first + offset
        for channel in range(3):
            wave = 128 + 90 * np.sin(rows / 17 + columns / (11 + 4 * channel) + index / 5)
            frames[offset, :, :, channel] = wave.astype(np.uint8)
        if height >= BLOCK and width >= BLOCK * INDEX_BITS:
            for bit in range(INDEX_BITS):
                value = 235 if (index >> bit) & 1 else 16
                frames[offset, :BLOCK, bit * BLOCK : (bit + 1) * BLOCK] = value
    return frames


def read_index(image: np.ndarray) -> int:
    """The frame index drawn by indexed_frames, read from a decoded (H, W, 3) image."""
    index = 0
    for bit in range(INDEX_BITS):
        center = image[4 : BLOCK - 4, bit * BLOCK + 4 : (bit + 1) * BLOCK - 4]
        if center.mean() > 128:
            index |= 1 << bit
    return index


def speech_like(seconds: float) -> np.ndarray:
    """Three partials under a slow syllable-rate envelope: tonal, but never stationary."""
    time = np.arange(round(seconds * SOURCE_RATE)) / SOURCE_RATE
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 3.1 * time)
    tone = sum(weight * np.sin(2 * np.pi * hertz * time) for weight, hertz in ((1.0, 220), (0.5, 1130), (0.25, 2870)))
    return (0.2 * envelope * tone).astype(np.float32)


def write_segment(fmt: StreamFormat, audio: MemoryAudio, first: int, count: int, path: Path) -> Path:
    writer = SegmentWriter(fmt, first_frame=first, audio=audio)
    writer.write(indexed_frames(first, count, fmt.width, fmt.height))
    path.write_bytes(writer.finish())
    return path


def starts(lengths: Sequence[int]) -> list[int]:
    return [sum(lengths[:index]) for index in range(len(lengths))]


def decoded_audio(path: Path) -> tuple[np.ndarray, int]:
    """The audio track decoded, placed by its timestamps: (samples, first sample position)."""
    pieces = []
    first = None
    expected = None
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            if frame.pts is None:
                raise AssertionError("decoded audio frame without timestamp")
            if first is None:
                first = expected = frame.pts
            assert frame.pts == expected, f"audio gap or overlap at {frame.pts}, expected {expected}"
            samples = frame.to_ndarray()[0]  # (1024,)
            expected += samples.shape[0]
            pieces.append(samples)
    return np.concatenate(pieces), int(first or 0)


FORMAT = StreamFormat(width=WIDTH, height=HEIGHT, fps=FPS)


def test_init_segment_is_the_same_for_every_chunk_of_a_session() -> None:
    first = init_segment(StreamFormat(width=WIDTH, height=HEIGHT, fps=FPS))
    _cached_init.cache_clear()  # rebuild from fresh encoders, not from the cache
    second = init_segment(StreamFormat(width=WIDTH, height=HEIGHT, fps=FPS))
    assert first == second
    assert first[4:8] == b"ftyp" and b"moov" in first and b"mvex" in first
    assert b"x264" not in first and b"Lavf" not in first and b"Lavc" not in first
    assert init_segment(StreamFormat(width=WIDTH + 2, height=HEIGHT, fps=FPS)) != first


def test_a_retried_segment_is_byte_identical(tmp_path: Path) -> None:
    audio = MemoryAudio(speech_like(3.0))
    once = write_segment(FORMAT, audio, 17, 23, tmp_path / "once.m4s").read_bytes()
    again = write_segment(FORMAT, audio, 17, 23, tmp_path / "again.m4s").read_bytes()
    assert once == again
    # Written in pieces, the chunk still encodes to the same bytes.
    writer = SegmentWriter(FORMAT, first_frame=17, audio=audio)
    frames = indexed_frames(17, 23)
    writer.write(frames[:5])
    writer.write(frames[5:])
    assert writer.finish() == once
    timing = fragment_timing(once)
    assert timing[VIDEO_TRACK].base_time == 17 * FORMAT.frame_ticks
    assert timing[VIDEO_TRACK].sample_count == 23
    first_packet, end_packet = audio_packet_range(17, 23, FPS, OUTPUT_RATE)
    assert timing[AUDIO_TRACK].base_time == first_packet * 1024
    assert timing[AUDIO_TRACK].sample_count == end_packet - first_packet


def test_segments_made_out_of_order_concatenate_to_the_whole_timeline(tmp_path: Path) -> None:
    lengths = [40, 3, 38]
    total = sum(lengths)
    audio = MemoryAudio(speech_like(total / FPS))
    paths = [tmp_path / f"segment-{index}.m4s" for index in range(len(lengths))]
    for index in (2, 0, 1):
        write_segment(FORMAT, audio, starts(lengths)[index], lengths[index], paths[index])
    (tmp_path / "init.mp4").write_bytes(init_segment(FORMAT))
    final = tmp_path / "final.mp4"
    concat(tmp_path / "init.mp4", paths, final)

    indices: list[int] = []
    with av.open(str(final)) as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            assert frame.pts is not None and stream.time_base is not None
            assert frame.pts * stream.time_base * FPS == len(indices)  # pts = frame index
            indices.append(read_index(frame.to_ndarray(format="rgb24")))
    assert indices == list(range(total))
    assert probe_warnings(final) == []

    samples, first = decoded_audio(final)
    assert first == 0
    video_seconds = total / FPS
    audio_seconds = samples.shape[0] / OUTPUT_RATE
    assert video_seconds <= audio_seconds < video_seconds + 1024 / OUTPUT_RATE


def test_probe_warnings_reports_a_damaged_file(tmp_path: Path) -> None:
    audio = MemoryAudio(speech_like(1.0))
    (tmp_path / "init.mp4").write_bytes(init_segment(FORMAT))
    segment = write_segment(FORMAT, audio, 0, 20, tmp_path / "a.m4s")
    final = tmp_path / "final.mp4"
    concat(tmp_path / "init.mp4", [segment], final)
    assert probe_warnings(final) == []
    final.write_bytes(final.read_bytes()[:-3000])  # cut into the last audio packets
    assert probe_warnings(final) != []


def test_concat_refuses_missing_or_misordered_segments(tmp_path: Path) -> None:
    audio = MemoryAudio(speech_like(2.0))
    init = tmp_path / "init.mp4"
    init.write_bytes(init_segment(FORMAT))
    first = write_segment(FORMAT, audio, 0, 10, tmp_path / "a.m4s")
    second = write_segment(FORMAT, audio, 10, 10, tmp_path / "b.m4s")
    output = tmp_path / "final.mp4"
    with pytest.raises(ValueError, match="out of timeline order"):
        concat(init, [second, first], output)
    with pytest.raises(ValueError, match="out of timeline order"):
        concat(init, [second], output)
    assert not output.exists()


def test_playlist_lists_segments_in_order_and_ends_only_when_the_render_ends(tmp_path: Path) -> None:
    lengths = [40, 40, 4, 33]
    audio = MemoryAudio(speech_like(sum(lengths) / FPS))
    (tmp_path / "init.mp4").write_bytes(init_segment(FORMAT))
    segments = []
    for index, (first, count) in enumerate(zip(starts(lengths), lengths, strict=True)):
        path = write_segment(FORMAT, audio, first, count, tmp_path / f"{index:05d}.m4s")
        segments.append((path.name, count / FPS))

    running = playlist(segments[:2], init_uri="init.mp4", ended=False, target_duration=2.0)
    assert "#EXT-X-PLAYLIST-TYPE:EVENT" in running and "#EXT-X-ENDLIST" not in running
    ended = playlist(segments, init_uri="init.mp4", ended=True)
    lines = ended.splitlines()
    assert lines[0] == "#EXTM3U" and "#EXT-X-VERSION:7" in lines and "#EXT-X-INDEPENDENT-SEGMENTS" in lines
    assert '#EXT-X-MAP:URI="init.mp4"' in lines and lines[-1] == "#EXT-X-ENDLIST"
    assert "#EXT-X-TARGETDURATION:2" in lines
    durations = [float(match) for match in re.findall(r"^#EXTINF:([0-9.]+),$", ended, flags=re.MULTILINE)]
    assert durations == pytest.approx([count / FPS for count in lengths], abs=1e-6)
    assert all(len(line.split(":")[1].rstrip(",").split(".")[1]) >= 3 for line in lines if line.startswith("#EXTINF"))
    assert [line for line in lines if line.endswith(".m4s")] == [name for name, _ in segments]

    index_file = tmp_path / "index.m3u8"
    index_file.write_text(ended)
    with av.open(str(index_file)) as container:
        decoded = [read_index(frame.to_ndarray(format="rgb24")) for frame in container.decode(video=0)]
    assert decoded == list(range(sum(lengths)))
    assert probe_warnings(index_file) == []


def test_playlist_rejects_a_target_duration_shorter_than_a_segment() -> None:
    with pytest.raises(ValueError, match=r"target_duration=1\.0"):
        playlist([("a.m4s", 1.6)], init_uri="init.mp4", ended=False, target_duration=1.0)
    with pytest.raises(ValueError, match="needs target_duration"):
        playlist([], init_uri="init.mp4", ended=False)
    assert "#EXT-X-TARGETDURATION:2" in playlist([], init_uri="init.mp4", ended=False, target_duration=1.6)


def test_audio_stays_within_a_frame_of_the_video_over_ten_minutes(tmp_path: Path) -> None:
    fmt = StreamFormat(width=32, height=32, fps=FPS)
    total_frames = 15_000
    lengths: list[int] = []
    while sum(lengths) < total_frames:
        lengths.append(4 if len(lengths) % 9 == 4 else 40)  # mostly 40, some 4: junctions fall off the packet grid
    lengths[-1] -= sum(lengths) - total_frames
    seconds = total_frames // FPS
    signal = np.zeros(seconds * SOURCE_RATE, dtype=np.float32)
    # A click every 10 s, off the AAC grid by a different amount each time; the last one 40 ms before the end.
    clicks = [10 * second * SOURCE_RATE + 37 * second for second in range(1, seconds // 10)]
    clicks.append(seconds * SOURCE_RATE - 640)
    for position in clicks:
        signal[position : position + 3] = [0.5, 0.9, 0.5]
    audio = MemoryAudio(signal)
    (tmp_path / "init.mp4").write_bytes(init_segment(fmt))
    paths = [
        write_segment(fmt, audio, first, count, tmp_path / f"{first:06d}.m4s")
        for first, count in zip(starts(lengths), lengths, strict=True)
    ]
    final = tmp_path / "final.mp4"
    concat(tmp_path / "init.mp4", paths, final)

    with av.open(str(final)) as container:
        video_packets = sum(1 for packet in container.demux(video=0) if packet.size)
    assert video_packets == total_frames
    samples, first = decoded_audio(final)
    assert first == 0
    assert abs(samples.shape[0] / OUTPUT_RATE - total_frames / FPS) <= 0.040
    errors = []
    for position in clicks:
        expected = position * 3 + 3  # the middle of the 3-sample click, at 48 kHz
        window = samples[expected - 4800 : expected + 4800]
        found = expected - 4800 + int(np.argmax(np.abs(window)))
        errors.append(abs(found - expected) / OUTPUT_RATE)
    assert max(errors) <= 1 / FPS, f"click timing errors (s): {errors}"
    assert max(errors[-5:]) <= 1 / FPS  # no drift near the end either
    # The packet grid makes timing sample-exact in practice; 1 ms catches regressions long before they are visible.
    assert max(errors) <= 0.001, f"click timing errors (s): {errors}"


def test_junctions_between_segments_do_not_click(tmp_path: Path) -> None:
    lengths = [7, 40, 4, 13, 40, 2, 25, 9]
    total = sum(lengths)
    source = MemoryAudio(speech_like(total / FPS))
    paths = [
        write_segment(FORMAT, source, first, count, tmp_path / f"{index}.m4s")
        for index, (first, count) in enumerate(zip(starts(lengths), lengths, strict=True))
    ]
    (tmp_path / "init.mp4").write_bytes(init_segment(FORMAT))
    final = tmp_path / "final.mp4"
    concat(tmp_path / "init.mp4", paths, final)

    decoded, _ = decoded_audio(final)
    reference = upsample(source, 0, decoded.shape[0])  # (N,)
    error = decoded - reference
    window = 1024
    junctions = {audio_packet_range(start, 0, FPS, OUTPUT_RATE)[0] * 1024 for start in starts(lengths)[1:]}
    near: list[float] = []
    elsewhere: list[float] = []
    # Skip the session's first two packets (packet 0 has no predecessor) and the last one.
    for start in range(2 * window, decoded.shape[0] - 2 * window, window):
        rms = float(np.sqrt(np.mean(error[start : start + window] ** 2)))
        is_near = any(start - window <= junction <= start + window for junction in junctions)
        (near if is_near else elsewhere).append(rms)
    assert len(near) >= 2 * (len(lengths) - 2)
    assert max(near) <= 2 * float(np.median(elsewhere)), (max(near), float(np.median(elsewhere)))


@settings(max_examples=40, deadline=None)
@given(
    start=st.integers(min_value=-200, max_value=3000),
    length=st.integers(min_value=0, max_value=1500),
)
def test_upsampling_a_slice_matches_the_whole_signal_exactly(start: int, length: int) -> None:
    source = MemoryAudio(np.random.default_rng(7).uniform(-1, 1, 1200).astype(np.float32))
    whole = upsample(source, -300, 4800)  # (5100,)
    part = upsample(source, start, start + length)
    np.testing.assert_array_equal(part, whole[start + 300 : start + 300 + length])


def test_upsampler_keeps_the_band_and_is_silent_outside_the_audio() -> None:
    time = np.arange(SOURCE_RATE) / SOURCE_RATE
    source = MemoryAudio(np.sin(2 * np.pi * 1000 * time).astype(np.float32))
    output = upsample(source, -100, 3 * SOURCE_RATE + 100)  # (48200,)
    expected = np.sin(2 * np.pi * 1000 * np.arange(3 * SOURCE_RATE) / OUTPUT_RATE)
    middle = slice(100 + 2000, 100 + 3 * SOURCE_RATE - 2000)
    assert np.max(np.abs(output[middle] - expected[2000:-2000])) < 1e-3
    assert not output[:100].any() and not output[-100:].any()


def test_frames_of_the_wrong_shape_or_type_are_refused() -> None:
    writer = SegmentWriter(FORMAT, first_frame=0, audio=MemoryAudio(np.zeros(100, dtype=np.float32)))
    with pytest.raises(ValueError, match=r"\(2, 96, 130, 3\)"):
        writer.write(np.zeros((2, HEIGHT, WIDTH + 2, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="float32"):
        writer.write(np.zeros((2, HEIGHT, WIDTH, 3), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\(96, 128, 3\)"):
        writer.write(np.zeros((HEIGHT, WIDTH, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match="at least one frame"):
        writer.finish()


def test_stream_format_refuses_odd_sizes_and_unknown_presets() -> None:
    with pytest.raises(ValueError, match="127x96"):
        StreamFormat(width=127, height=96, fps=FPS)
    with pytest.raises(ValueError, match="'fastest'"):
        StreamFormat(width=128, height=96, fps=FPS, preset="fastest")
    assert FORMAT.video_timescale % FPS == 0
    assert Fraction(FORMAT.frame_ticks, FORMAT.video_timescale) == Fraction(1, FPS)
