from __future__ import annotations

import numpy as np
import pytest
from skimage import data

from gpu_worker.face import FaceRegion, detect_face
from gpu_worker.talking import FPS, TalkingPhoto, mouth_openings

RATE = 16000
SAMPLES_PER_FRAME = RATE // FPS


def _tone_bursts(centres_s: list[float], amplitude: float, total_s: float = 8.0) -> np.ndarray:
    """A 220 Hz tone gated on and off by Hann-shaped envelopes of 0.32 s, a stand-in for syllables."""
    times = np.arange(round(total_s * RATE)) / RATE
    envelope = np.zeros_like(times)
    for centre in centres_s:
        inside = np.abs(times - centre) < 0.16
        envelope[inside] = np.hanning(int(inside.sum()))
    return (amplitude * envelope * np.sin(2 * np.pi * 220 * times)).astype(np.float32)


def _openings(audio: np.ndarray, first_frame: int, n_frames: int) -> np.ndarray:
    return mouth_openings(audio, rate=RATE, fps=FPS, first_frame=first_frame, n_frames=n_frames)


def test_silence_keeps_the_mouth_closed() -> None:
    openings = _openings(np.zeros(RATE * 4, dtype=np.float32), 0, 100)

    assert openings.shape == (100,)
    assert openings.dtype == np.float32
    assert np.all(openings == 0.0)


def test_loud_speech_opens_the_mouth_wider_than_quiet_speech() -> None:
    loud = _openings(_tone_bursts([1.0], amplitude=0.3), 0, 50)
    quiet = _openings(_tone_bursts([1.0], amplitude=0.01), 0, 50)

    assert loud.max() > 0.8
    assert quiet.max() < loud.max() - 0.3


def test_openings_stay_in_unit_range_even_for_clipping_audio() -> None:
    audio = np.random.default_rng(3).uniform(-1.0, 1.0, RATE * 3).astype(np.float32)
    audio[RATE:] = 0.0

    openings = _openings(audio, 0, 75)

    assert np.all((openings >= 0.0) & (openings <= 1.0))
    assert openings[:20].min() == 1.0
    assert np.all(openings[30:] == 0.0)


def test_a_chunk_computed_alone_equals_the_same_slice_of_the_whole_video() -> None:
    audio = _tone_bursts([0.5, 1.3, 1.7, 3.1, 5.9, 7.2], amplitude=0.1)
    audio += np.random.default_rng(5).normal(0.0, 0.003, audio.shape).astype(np.float32)

    whole = _openings(audio, 0, 200)
    chunk = _openings(audio, 40, 40)

    np.testing.assert_array_equal(chunk, whole[40:80])


def test_frames_past_the_end_of_the_audio_are_closed() -> None:
    openings = _openings(_tone_bursts([0.5], amplitude=0.3, total_s=1.0), 20, 20)

    assert np.all(openings[5:] == 0.0)


@pytest.mark.parametrize("centre_s", [1.0, 2.02, 3.05])
def test_the_mouth_peaks_with_the_sound_at_most_one_frame_late(centre_s: float) -> None:
    audio = _tone_bursts([centre_s], amplitude=0.02)
    openings = _openings(audio, 0, 150)
    envelope = np.sqrt((audio[: 150 * SAMPLES_PER_FRAME].reshape(150, -1) ** 2).mean(axis=1))  # (150,)

    lag = int(np.argmax(openings)) - int(np.argmax(envelope))

    # Negative is fine: the lips may lead the sound a little, never trail it.
    assert -2 <= lag <= 1


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    return data.astronaut()  # (512, 512, 3)


@pytest.fixture(scope="module")
def face(portrait: np.ndarray) -> FaceRegion:
    return detect_face(portrait)


def test_a_closed_mouth_is_the_portrait_bit_for_bit(portrait: np.ndarray, face: FaceRegion) -> None:
    frames = TalkingPhoto(portrait, face).render(np.zeros(3, dtype=np.float32))

    assert frames.shape == (3, *portrait.shape)
    assert frames.dtype == np.uint8
    assert np.array_equal(frames, np.broadcast_to(portrait, frames.shape))


def test_only_the_animated_box_ever_changes(portrait: np.ndarray, face: FaceRegion) -> None:
    x0, y0, x1, y1 = face.animated_box(portrait.shape[1], portrait.shape[0])
    frames = TalkingPhoto(portrait, face).render(np.linspace(0.0, 1.0, 9, dtype=np.float32))

    outside = np.ones(portrait.shape[:2], dtype=bool)
    outside[y0:y1, x0:x1] = False
    for frame in frames:
        assert np.array_equal(frame[outside], portrait[outside])
    assert not np.array_equal(frames[-1], portrait)


def test_a_wider_opening_changes_the_mouth_more(portrait: np.ndarray, face: FaceRegion) -> None:
    frames = TalkingPhoto(portrait, face).render(np.array([0.2, 0.5, 1.0], dtype=np.float32))
    mouth = (
        slice(face.mouth_y - face.mouth_height, face.mouth_y + 2 * face.mouth_height),
        slice(face.mouth_x - face.mouth_width // 2, face.mouth_x + face.mouth_width // 2),
    )

    changes = [np.abs(frame[mouth].astype(np.int32) - portrait[mouth]).mean() for frame in frames]
    darkness = [frame[mouth].mean() for frame in frames]

    assert changes[0] < changes[1] < changes[2]
    # The opened mouth shows a dark cavity, so the mouth area gets darker as it opens.
    assert darkness[0] > darkness[1] > darkness[2]


def test_rendering_is_deterministic(portrait: np.ndarray, face: FaceRegion) -> None:
    openings = np.array([0.0, 0.13, 0.77, 1.0, 0.4], dtype=np.float32)

    first = TalkingPhoto(portrait, face).render(openings)
    second = TalkingPhoto(portrait.copy(), face).render(openings)

    assert np.array_equal(first, second)


def test_rendering_does_not_modify_the_callers_portrait(portrait: np.ndarray, face: FaceRegion) -> None:
    original = portrait.copy()

    TalkingPhoto(portrait, face).render(np.ones(2, dtype=np.float32))

    assert np.array_equal(portrait, original)
