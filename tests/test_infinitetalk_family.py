"""family=infinitetalk renders through the same API, workflow and node as the other families: here the tiny random
checkpoints in the original folder layout that the shared stack's node loads (tests/conftest.py)."""

from __future__ import annotations

import httpx
import numpy as np

from monologue.stack import Stack
from tests.conftest import SAMPLES
from tests.helpers import decode_video, wav_bytes
from tests.test_dit_family import _wait


def test_an_infinitetalk_render_completes_through_the_api_in_n_and_i_chunks(stack: Stack) -> None:
    url, headers = str(stack.settings.api.public_url), {"Authorization": f"Bearer {stack.api_key}"}
    speech = np.frombuffer((SAMPLES / "speech.wav").read_bytes()[44:], dtype="<i2")[: int(16_000 * 1.2)] / 32768.0
    files = {"portrait": ("p.jpg", (SAMPLES / "portrait.jpg").read_bytes()), "audio": ("s.wav", wav_bytes(speech))}
    options = {"family": "infinitetalk", "chunk_frames": "16", "i_frames": "4", "prompt": "a calm studio"}
    created = httpx.post(f"{url}/v1/renders", files=files, data=options, headers=headers, timeout=60)
    assert created.status_code == 201, created.text
    render = _wait(url, headers, created.json()["id"])
    assert render["status"] == "completed", render["error"]
    assert render["progress"]["chunks_total"] == 3  # N0 (17 frames: 1 + 4k), N1 (9), I0 (4)
    video = httpx.get(render["links"]["video"], headers=headers, timeout=30).content
    frames, video_seconds, _ = decode_video(video)
    assert frames.shape[0] == 30 and abs(video_seconds - 1.2) < 0.05
    assert frames.shape[1:3] in {(64, 64), (48, 96), (96, 48)}  # the tiny preset's size buckets
    assert frames.std() > 1.0


def test_off_grid_infinitetalk_sizes_get_a_422_saying_what_to_fix(stack: Stack) -> None:
    url, headers = str(stack.settings.api.public_url), {"Authorization": f"Bearer {stack.api_key}"}
    files = {
        "portrait": ("p.jpg", (SAMPLES / "portrait.jpg").read_bytes()),
        "audio": ("s.wav", wav_bytes(np.zeros(1600))),
    }
    data = {"family": "infinitetalk", "first_chunk_frames": "16"}
    response = httpx.post(f"{url}/v1/renders", files=files, data=data, headers=headers, timeout=60)
    assert response.status_code == 422, response.text
    assert "first_chunk_frames 0 or 1 + a multiple of 4" in response.text
