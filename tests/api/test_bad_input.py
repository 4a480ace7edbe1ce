"""Bad input gets a 4xx naming the problem, starts no workflow and leaves nothing behind."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from cli.stack import Stack
from monologue.db import SessionRow, make_engine
from tests.helpers import get, post, submit, wav_bytes, workflow_count

pytestmark = pytest.mark.slow


def _png(width: int, height: int, value: int = 128) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (value, value, value)).save(buffer, format="PNG")
    return buffer.getvalue()


def _state(stack: Stack) -> tuple[set[str], list[Path], int]:
    """Every session row (all tenants, no page limit), stored object and session workflow on the shared stack."""
    root = stack.settings.storage.root
    assert root is not None
    objects = sorted((root / "sessions").rglob("*")) if (root / "sessions").exists() else []
    engine = make_engine(stack.settings.db_url)
    try:
        with engine.connect() as connection:
            sessions = set(connection.execute(select(SessionRow.id)).scalars())
    finally:
        engine.dispose()
    return sessions, objects, workflow_count(stack.settings)


@pytest.mark.parametrize(
    ("case", "expected_status", "message"),
    [
        ("portrait_is_audio", 422, "portrait"),
        ("audio_is_image", 422, "audio"),
        ("audio_is_random_bytes", 422, "audio"),
        ("audio_is_zero_length", 422, "audio"),
        ("portrait_is_truncated", 422, "portrait: the image is corrupt or truncated"),
        ("portrait_too_large", 422, "4096"),
        ("portrait_has_no_face", 422, "face"),
        ("empty_portrait_file", 422, "empty"),
        ("fps_out_of_range", 422, "fps"),
        ("transcript_with_loudness", 422, "transcript: only the warp family's visemes"),
        ("transcript_too_long", 422, "transcript"),
        ("sinks_nested_5000_deep", 422, "sinks: json nested deeper than 16 levels"),
    ],
)
def test_bad_input_is_refused_and_leaves_nothing(
    case: str,
    expected_status: int,
    message: str,
    stack: Stack,
    api_url: str,
    sample_portrait: bytes,
    sample_speech: bytes,
) -> None:
    portrait, audio, options = sample_portrait, sample_speech, {}
    if case == "portrait_is_audio":
        portrait = sample_speech
    elif case == "audio_is_image":
        audio = sample_portrait
    elif case == "audio_is_random_bytes":
        audio = np.random.default_rng(1).integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    elif case == "audio_is_zero_length":
        audio = wav_bytes(np.zeros(0, dtype=np.float32))
    elif case == "portrait_is_truncated":
        portrait = sample_portrait[: len(sample_portrait) // 3]
    elif case == "portrait_too_large":
        portrait = _png(4100, 100)
    elif case == "portrait_has_no_face":
        portrait = _png(512, 512)
    elif case == "empty_portrait_file":
        portrait = b""
    elif case == "fps_out_of_range":
        options = {"fps": 0}
    elif case == "transcript_with_loudness":
        options = {"transcript": "hello there", "lip_sync": "loudness"}
    elif case == "transcript_too_long":
        options = {"transcript": "word " * 2001}
    elif case == "sinks_nested_5000_deep":
        options = {"sinks": "[" * 5000}
    before = _state(stack)
    response = submit(api_url, portrait, audio, **options)
    assert response.status_code == expected_status, response.text
    assert message in response.json()["detail"].lower()
    assert _state(stack) == before


def test_a_live_session_with_a_transcript_is_refused_and_leaves_nothing(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    before = _state(stack)
    response = post(
        f"{api_url}/v1/sessions",
        data={"transcript": "hello there"},
        files={"portrait": ("p.jpg", sample_portrait)},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert "transcript: live sessions" in response.json()["detail"]
    assert _state(stack) == before


def test_missing_field_names_the_field(api_url: str, sample_portrait: bytes) -> None:
    response = post(f"{api_url}/v1/renders", files={"portrait": ("p.jpg", sample_portrait)}, timeout=30)
    assert response.status_code == 422
    assert "audio" in str(response.json()["detail"])


def test_upload_over_the_size_limit_is_413(stack: Stack, api_url: str, sample_speech: bytes) -> None:
    limit = stack.settings.limits.max_upload_bytes
    response = submit(api_url, b"\xff" * (limit + 1), sample_speech)
    assert response.status_code == 413
    assert str(limit) in response.json()["detail"]


def test_unknown_render_is_404(api_url: str) -> None:
    for path in ("", "/video.mp4"):
        response = get(f"{api_url}/v1/renders/does-not-exist{path}", timeout=10)
        assert response.status_code == 404
        assert "not found" in response.json()["detail"]
