"""family=infinitetalk renders through the same API, workflow and node as the other families: here the tiny random
checkpoints in the original folder layout that the shared stack's node loads (tests/conftest.py)."""

from __future__ import annotations

import io
import json
import wave

import httpx
import numpy as np

from cli.live_stream import start_session
from cli.stack import Stack
from tests.conftest import SAMPLES
from tests.helpers import decode_video, wav_bytes, ws_connect
from tests.test_dit_family import _wait
from tests.test_live import _frame_hashes


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
    detail = response.json()["detail"]  # an error about the sizes together: the sentence alone, no location
    assert detail.startswith("the infinitetalk family makes one latent frame of every 4 video frames"), detail
    assert "first_chunk_frames 0 or 1 + a multiple of 4 (got first_chunk_frames=16)" in detail


def test_an_infinitetalk_live_session_starts_on_the_wan_grid_and_hears_each_chunk_s_own_audio(stack: Stack) -> None:
    """The one family whose live frames are not its render's: a render encodes its whole speech once (as InfiniteTalk
    does), a live session, whose speech is still arriving, each chunk's audio with a second before it (issue 29 item
    6, docs/architecture.md). The first frame is the portrait's own latent in both."""
    url, headers = str(stack.settings.api.public_url), {"Authorization": f"Bearer {stack.api_key}"}
    pcm = (np.frombuffer((SAMPLES / "speech.wav").read_bytes()[44:], dtype="<i2")[: int(16_000 * 1.2)]).copy()
    options = {"family": "infinitetalk", "chunk_frames": "16", "i_frames": "4", "prompt": "a calm studio"}
    # No first_chunk_frames: the live default (16 frames) moves onto the Wan VAE's 1 + 4k grid, not a 422.
    live = start_session(url, SAMPLES / "portrait.jpg", options=options, api_key=stack.api_key)
    assert live["options"]["first_chunk_frames"] == 17
    with ws_connect(live["links"]["audio"]) as socket:
        socket.send(json.dumps({"type": "start", "sample_rate": 16_000, "channels": 1, "format": "s16le"}))
        for offset in range(0, len(pcm), 1600):  # 0.1 s messages, as fast as the socket takes them
            socket.send(pcm[offset : offset + 1600].tobytes())
        socket.send(json.dumps({"type": "end"}))
        for _ in socket:  # until the server closes it after "ended"
            pass
    session = _wait(url, headers, live["id"])
    assert session["status"] == "completed", session["error"]
    assert session["kind"] == "live" and session["progress"]["frames_total"] == 30

    wav = io.BytesIO()
    with wave.open(wav, "wb") as out:  # the very samples the socket carried
        out.setnchannels(1), out.setsampwidth(2), out.setframerate(16_000), out.writeframes(pcm.tobytes())
    files = {"portrait": ("p.jpg", (SAMPLES / "portrait.jpg").read_bytes()), "audio": ("s.wav", wav.getvalue())}
    created = httpx.post(f"{url}/v1/renders", files=files, data=options, headers=headers, timeout=60)
    render = _wait(url, headers, created.json()["id"])
    assert render["status"] == "completed", render["error"]
    live_hashes, render_hashes = _frame_hashes(stack, live["id"]), _frame_hashes(stack, render["id"])
    assert len(live_hashes) == len(render_hashes) == 30 and live_hashes[0] == render_hashes[0]
    assert all(live != rendered for live, rendered in zip(live_hashes[1:], render_hashes[1:], strict=True))
