from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import cv2
import numpy as np
import pytest
from av.video.frame import PictureType
from skimage import data

from gpu_worker.encode import encode_video_segment, mux_final
from gpu_worker.face import detect_face
from gpu_worker.talking import FPS, TalkingPhoto

RATE = 16000
SEGMENT_FRAMES = (40, 40, 17)
TOTAL_FRAMES = sum(SEGMENT_FRAMES)  # 97 frames = 3.88 s at 25 fps


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    """A talking astronaut, slightly softened: smooth content whose H.264 round trip error is small."""
    portrait = cv2.GaussianBlur(data.astronaut(), (0, 0), 1.0)  # (512, 512, 3)
    openings = 0.5 + 0.5 * np.sin(np.arange(TOTAL_FRAMES) / 3.0)
    talking = TalkingPhoto(portrait, detect_face(portrait))
    return talking.render(openings.astype(np.float32))  # (97, 512, 512, 3)


@pytest.fixture(scope="module")
def segments(frames: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("segments")
    paths = []
    start = 0
    for index, count in enumerate(SEGMENT_FRAMES):
        path = folder / f"segment-{index}.mp4"
        encode_video_segment(frames[start : start + count], fps=FPS, path=path)
        paths.append(path)
        start += count
    return paths


@pytest.fixture(scope="module")
def final(segments: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    speech = 0.2 * np.sin(2 * np.pi * 180 * np.arange(round(3.88 * RATE)) / RATE)
    path = tmp_path_factory.mktemp("final") / "final.mp4"
    mux_final(segments, speech.astype(np.float32), rate=RATE, fps=FPS, n_frames=TOTAL_FRAMES, path=path)
    return path


def _decode_video(path: Path) -> tuple[np.ndarray, list[av.VideoFrame]]:
    with av.open(str(path)) as container:
        decoded = list(container.decode(video=0))
        pixels = np.stack([frame.to_ndarray(format="rgb24") for frame in decoded])  # (T, H, W, 3)
    return pixels, decoded


def test_a_segment_decodes_to_its_frames_from_a_keyframe(segments: list[Path], frames: np.ndarray) -> None:
    pixels, decoded = _decode_video(segments[0])

    assert pixels.shape == (40, 512, 512, 3)
    assert decoded[0].key_frame
    assert [frame.time for frame in decoded] == [index / FPS for index in range(40)]
    # One GOP per segment: the only keyframe is the first.
    assert [frame.key_frame for frame in decoded[1:]] == [False] * 39
    assert np.abs(pixels.astype(np.int32) - frames[:40]).mean() < 3.0


def test_segments_share_codec_headers_so_they_can_be_stitched(segments: list[Path]) -> None:
    extradata = set()
    for path in segments:
        with av.open(str(path)) as container:
            extradata.add(container.streams.video[0].codec_context.extradata)

    assert len(extradata) == 1


def test_the_final_video_holds_every_frame_close_to_the_input(final: Path, frames: np.ndarray) -> None:
    pixels, decoded = _decode_video(final)

    assert pixels.shape == frames.shape
    assert [frame.time for frame in decoded] == pytest.approx([index / FPS for index in range(TOTAL_FRAMES)])
    # Each stitched segment still begins with its keyframe.
    assert [index for index, frame in enumerate(decoded) if frame.key_frame] == [0, 40, 80]
    assert np.abs(pixels.astype(np.int32) - frames).mean() < 3.0


def test_audio_and_video_durations_match_the_frame_count(final: Path) -> None:
    expected = Fraction(TOTAL_FRAMES, FPS)
    with av.open(str(final)) as container:
        video = container.streams.video[0]
        audio = container.streams.audio[0]
        assert video.duration is not None and audio.duration is not None
        video_seconds = video.duration * video.time_base
        audio_seconds = audio.duration * audio.time_base
        assert (audio.codec_context.name, audio.rate, audio.channels) == ("aac", 48000, 1)

    assert abs(video_seconds - expected) <= Fraction(1, FPS)
    assert abs(audio_seconds - expected) <= Fraction(40, 1000)

    with av.open(str(final)) as container:
        decoded_samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(decoded_samples / 48000 - float(expected)) <= 0.04


def test_audio_is_padded_or_trimmed_to_the_video(segments: list[Path], tmp_path: Path) -> None:
    for seconds in (1.0, 9.0):
        path = tmp_path / f"speech-{seconds}.mp4"
        speech = np.full(round(seconds * RATE), 0.1, dtype=np.float32)

        mux_final(segments, speech, rate=RATE, fps=FPS, n_frames=TOTAL_FRAMES, path=path)

        with av.open(str(path)) as container:
            audio = container.streams.audio[0]
            assert audio.duration is not None
            assert abs(audio.duration * audio.time_base - Fraction(TOTAL_FRAMES, FPS)) <= Fraction(40, 1000)


def test_the_final_video_has_no_b_frames_and_is_progressive(final: Path) -> None:
    with av.open(str(final)) as container:
        packets = [packet for packet in container.demux(video=0) if packet.size > 0]
    _, decoded = _decode_video(final)

    assert all(packet.pts == packet.dts for packet in packets)
    assert {PictureType(frame.pict_type).name for frame in decoded} == {"I", "P"}
    # faststart puts the index (moov) before the media data (mdat), so playback can start mid-download.
    head = final.read_bytes()[:4096]
    assert 0 <= head.find(b"moov") < head.find(b"mdat") or b"mdat" not in head


def test_a_wrong_frame_count_names_both_numbers(segments: list[Path], tmp_path: Path) -> None:
    speech = np.zeros(RATE, dtype=np.float32)

    with pytest.raises(ValueError, match=r"97.*100|100.*97"):
        mux_final(segments, speech, rate=RATE, fps=FPS, n_frames=100, path=tmp_path / "wrong.mp4")
