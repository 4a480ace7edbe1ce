"""The whole path: API → Temporal → node → storage → MP4, on the real embedded stack."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest

from gpu_worker.face import detect_face
from monologue.media import AUDIO_RATE, decode_png, decode_wav, normalise_audio, normalise_portrait
from monologue.stack import Stack
from tests.helpers import decode_video, submit, wait_done, wav_bytes

pytestmark = pytest.mark.slow
FPS = 25


@dataclass
class Rendered:
    render: dict[str, Any]
    frames: np.ndarray  # (T, H, W, 3) decoded from the MP4
    video_seconds: float
    audio_seconds: float
    audio: np.ndarray  # the normalised input speech
    portrait: np.ndarray  # the normalised input portrait


@pytest.fixture(scope="module")
def rendered(api_url: str, sample_portrait: bytes, sample_speech: bytes) -> Rendered:
    response = submit(api_url, sample_portrait, sample_speech)
    assert response.status_code == 201, response.text
    created = response.json()
    assert created["status"] == "queued" and created["links"]["video"].endswith("/video.mp4")
    render = wait_done(api_url, created["id"])
    assert render["status"] == "completed", render["error"]
    video = httpx.get(render["links"]["video"], timeout=60)
    assert video.status_code == 200 and video.headers["content-type"] == "video/mp4"
    frames, video_seconds, audio_seconds = decode_video(video.content)
    return Rendered(
        render,
        frames,
        video_seconds,
        audio_seconds,
        decode_wav(normalise_audio(sample_speech).wav),
        decode_png(normalise_portrait(sample_portrait).png),
    )


def test_sample_becomes_an_mp4_whose_audio_and_video_match_the_speech(rendered: Rendered) -> None:
    speech_seconds = len(rendered.audio) / AUDIO_RATE
    assert abs(len(rendered.frames) - round(speech_seconds * FPS)) <= 1
    assert abs(rendered.audio_seconds - speech_seconds) <= 0.040
    assert abs(rendered.audio_seconds - rendered.video_seconds) <= 0.040
    assert rendered.frames.shape[1:] == rendered.portrait.shape


def test_mouth_moves_during_speech_and_rests_during_silence(rendered: Rendered) -> None:
    face = detect_face(rendered.portrait)
    x0, y0 = face.mouth_x - face.mouth_width // 2, face.mouth_y - face.mouth_height
    x1, y1 = face.mouth_x + face.mouth_width // 2, face.mouth_y + 2 * face.mouth_height
    loudness = _frame_rms(rendered.audio, len(rendered.frames))
    speech = np.flatnonzero(loudness > 0.05)
    # Silent frames well inside a gap: lips start moving a little before a sound and settle after it.
    quiet = np.convolve(loudness, np.ones(9), mode="same") == 0
    silence = np.flatnonzero(quiet)
    assert len(speech) > 25 and len(silence) > 10, "the sample must hold both speech and a silent gap"
    mouth = rendered.frames[:, y0:y1, x0:x1].astype(np.float32)
    rest = rendered.portrait[y0:y1, x0:x1].astype(np.float32)
    change = np.abs(mouth - rest).mean(axis=(1, 2, 3))  # (T,)
    assert change[silence].max() < 3.0, "a silent mouth should look like the portrait (codec noise only)"
    assert np.percentile(change[speech], 75) > 8.0, "the mouth should visibly move while speaking"


def test_pixels_away_from_the_face_stay_the_portrait(rendered: Rendered) -> None:
    face = detect_face(rendered.portrait)
    x0, y0, x1, y1 = face.animated_box(rendered.portrait.shape[1], rendered.portrait.shape[0])
    outside = np.ones(rendered.portrait.shape[:2], dtype=bool)
    outside[max(0, y0 - 16) : y1 + 16, max(0, x0 - 16) : x1 + 16] = False  # codec blocks bleed a little
    difference = np.abs(rendered.frames.astype(np.int16) - rendered.portrait.astype(np.int16))
    assert difference[:, outside].mean() < 3.0  # H.264 at crf 20 on a detailed photo; a leak would be far more
    # and it is the same in every frame: the background does not shimmer
    assert np.abs(np.diff(rendered.frames[:, outside].astype(np.int16), axis=0)).mean() < 0.5


def test_progress_timings_and_manifest_are_recorded(rendered: Rendered, stack: Stack) -> None:
    render = rendered.render
    frames = render["progress"]["frames_total"]
    assert frames == len(rendered.frames)
    assert render["progress"]["chunks_done"] == render["progress"]["chunks_total"] == -(-frames // 40)
    assert render["node_id"] == "test-node"
    assert render["ttff_ms"] > 0 and render["finished_at"] >= render["started_at"]
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / render["id"] / "out" / "frames.jsonl").read_text().splitlines()
    assert [json.loads(line)["frame"] for line in lines] == list(range(frames))


def test_same_inputs_and_seed_give_identical_frames(
    api_url: str, stack: Stack, rendered: Rendered, sample_portrait: bytes, sample_speech: bytes
) -> None:
    again = wait_done(api_url, submit(api_url, sample_portrait, sample_speech, chunk_frames=30).json()["id"])
    assert again["status"] == "completed"
    root = stack.settings.storage.root
    assert root is not None

    def manifest(session_id: str) -> list[str]:
        text = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text()
        return [json.loads(line)["sha256"] for line in text.splitlines()]

    # Different chunking, same frames: no state leaks across chunk boundaries.
    assert manifest(again["id"]) == manifest(rendered.render["id"])


def test_silent_audio_gives_a_still_face(api_url: str, sample_portrait: bytes) -> None:
    render = wait_done(api_url, submit(api_url, sample_portrait, wav_bytes(np.zeros(AUDIO_RATE))).json()["id"])
    assert render["status"] == "completed", render["error"]
    frames, _, audio_seconds = decode_video(httpx.get(render["links"]["video"], timeout=60).content)
    assert len(frames) == FPS and abs(audio_seconds - 1.0) <= 0.040
    assert np.abs(np.diff(frames.astype(np.int16), axis=0)).mean() < 0.5


def test_render_list_shows_the_newest_first(api_url: str, rendered: Rendered) -> None:
    items = httpx.get(f"{api_url}/v1/renders", timeout=10).json()["items"]
    assert rendered.render["id"] in [item["id"] for item in items]
    created = [item["created_at"] for item in items]
    assert created == sorted(created, reverse=True)


def _frame_rms(audio: np.ndarray, n_frames: int) -> np.ndarray:
    per_frame = AUDIO_RATE // FPS
    padded = np.zeros(n_frames * per_frame, dtype=np.float32)
    padded[: min(len(audio), len(padded))] = audio[: len(padded)]
    return np.sqrt((padded.reshape(n_frames, per_frame) ** 2).mean(axis=1))
