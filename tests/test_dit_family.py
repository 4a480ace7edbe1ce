"""The dit family renders through the same API, workflow and node as warp (selected per session); here
its tiny seeded smoke-test model on the CPU."""

from __future__ import annotations

import time
from typing import Any

import httpx
import numpy as np

from cli.stack import Stack
from tests.conftest import SAMPLES
from tests.helpers import decode_video, wav_bytes


def _wait(url: str, headers: dict[str, str], session_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        render: dict[str, Any] = httpx.get(f"{url}/v1/renders/{session_id}", headers=headers, timeout=10).json()
        if render["status"] in ("completed", "failed"):
            return render
        time.sleep(0.25)
    raise TimeoutError(f"render {session_id} did not finish")


def test_a_dit_render_completes_through_the_api_with_a_prompt(stack: Stack) -> None:
    url, headers = str(stack.settings.api.public_url), {"Authorization": f"Bearer {stack.api_key}"}
    speech = np.frombuffer((SAMPLES / "speech.wav").read_bytes()[44:], dtype="<i2")[: 16_000 * 2] / 32768.0
    files = {"portrait": ("p.jpg", (SAMPLES / "portrait.jpg").read_bytes()), "audio": ("s.wav", wav_bytes(speech))}
    options = {"family": "dit", "resolution": "512", "preview": "true", "prompt": "a calm studio, soft light"}
    created = httpx.post(f"{url}/v1/renders", files=files, data=options, headers=headers, timeout=60)
    assert created.status_code == 201, created.text
    assert created.json()["options"]["family"] == "dit"
    render = _wait(url, headers, created.json()["id"])
    assert render["status"] == "completed", render["error"]
    video = httpx.get(render["links"]["video"], headers=headers, timeout=30).content
    frames, video_seconds, audio_seconds = decode_video(video)
    assert frames.shape == (50, 256, 256, 3) and abs(video_seconds - 2.0) < 0.05 and abs(audio_seconds - 2.0) < 0.05
    assert frames.std() > 1.0  # the model painted something, not a constant frame


def test_an_unknown_family_is_refused_before_anything_starts(stack: Stack) -> None:
    url, headers = str(stack.settings.api.public_url), {"Authorization": f"Bearer {stack.api_key}"}
    files = {
        "portrait": ("p.jpg", (SAMPLES / "portrait.jpg").read_bytes()),
        "audio": ("s.wav", wav_bytes(np.zeros(1600))),
    }
    response = httpx.post(f"{url}/v1/renders", files=files, data={"family": "gan"}, headers=headers, timeout=60)
    assert response.status_code == 422, response.text
    (problem,) = response.json()["errors"]  # the form field's own check: OpenAPI lists the families
    assert problem["loc"] == ["body", "family"] and "'warp', 'dit' or 'infinitetalk'" in problem["msg"]
