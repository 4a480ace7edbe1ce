"""WHIP on the real embedded stack: an aiortc client (a browser's stand-in) sends a WAV as Opus to `POST
/v1/live/{id}/whip` with the session's audio ticket; the node holding the session stores it as the audio socket would,
the workflow plans from it, the sender's DELETE ends the audio, and the session completes with the frames a render of
the very samples stored gives. Requests without a valid ticket and offers without Opus audio are refused; nothing is
left open on the node."""

from __future__ import annotations

import asyncio
import io
import wave
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer

from cli.stack import Stack
from monologue import SAMPLES
from monologue.client import Client
from monologue.live_audio import stored_live_audio
from monologue.media import decode_wav, normalise_audio
from monologue.plan import AUDIO_RATE, frame_count
from monologue.storage import LocalStore
from tests.helpers import api_key, eventually, node_media_stats, submit, wait_done
from tests.test_live import _frame_hashes
from tests.test_webrtc import SDP

pytestmark = pytest.mark.timeout(240)
SECONDS = 2


def _microphone_wav(path: Path) -> Path:
    """The first seconds of the bundled speech at a browser microphone's 48 kHz, stereo."""
    samples = decode_wav(normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav)[: SECONDS * AUDIO_RATE]
    wide = np.repeat(np.round(samples * 32767).astype("<i2"), 3)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(48_000)
        out.writeframes(np.repeat(wide, 2).tobytes())
    return path


def _stored_wav(root: Path, session_id: str) -> bytes:
    """The session's stored pieces as a 16 kHz mono WAV, sample for sample."""
    folder = root / "sessions" / session_id / "input" / "live"
    pcm = b"".join(piece.read_bytes() for piece in sorted(folder.glob("*.pcm")))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(AUDIO_RATE)
        out.writeframes(pcm)
    return buffer.getvalue()


async def _offer(*tracks: Any, kinds: tuple[str, ...] = ()) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    for track in tracks:
        pc.addTrack(track)
    for kind in kinds:
        pc.addTransceiver(kind, direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def test_a_microphone_over_whip_feeds_a_live_session_that_renders_what_was_stored(
    stack: Stack, api_url: str, sample_portrait: bytes, tmp_path: Path
) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
    assert session.audio_ticket is not None
    url = f"{api_url}/v1/live/{session.id}/whip"
    root = stack.settings.storage.root
    assert root is not None
    store = LocalStore(root)

    async def send() -> None:
        player = MediaPlayer(str(_microphone_wav(tmp_path / "mic.wav")))
        pc, offer = await _offer(player.audio)
        async with httpx.AsyncClient(timeout=30) as http:
            auth = {**SDP, "Authorization": f"Bearer {session.audio_ticket.ticket}"}  # type: ignore[union-attr]
            answer = await http.post(url, content=offer, headers=auth)
            assert answer.status_code == 201, answer.text
            location = answer.headers["Location"]
            assert location.startswith(f"/v1/live/{session.id}/whip/")
            again = await http.post(url, content=offer, headers=auth)  # a ticket opens one sender, once
            assert again.status_code == 403 and "ticket" in again.text
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            await eventually(  # the WAV plays in real time
                lambda: (
                    player.audio is not None
                    and player.audio.readyState == "ended"
                    and stored_live_audio(store, session.id)[0] >= 1.7 * AUDIO_RATE
                ),
                timeout_s=60,
                what="the WAV sent and stored",
            )
            await asyncio.sleep(0.3)
            stop = await http.delete(f"{api_url}{location}")
            assert stop.status_code == 204, stop.text
        await pc.close()

    asyncio.run(send())
    total, ended = stored_live_audio(store, session.id)
    assert ended and abs(total - SECONDS * AUDIO_RATE) < 0.3 * AUDIO_RATE, total
    with Client(api_url, api_key=api_key(api_url)) as client:
        done = client.wait(session.id, timeout_s=120)
    assert done.status == "completed", done.error
    frames = frame_count(total, rate=AUDIO_RATE, fps=done.options.fps)
    assert done.progress.frames_total == frames
    assert node_media_stats(stack)["peer_connections"] == 0

    # A render of the very samples stored, with the same options, makes the same frames.
    same = {name: getattr(done.options, name) for name in ("chunk_frames", "i_frames", "first_chunk_frames")}
    render = submit(api_url, sample_portrait, _stored_wav(root, session.id), lip_sync=done.options.lip_sync, **same)
    rendered = wait_done(api_url, render.json()["id"])
    assert rendered["status"] == "completed", rendered["error"]
    assert _frame_hashes(stack, session.id) == _frame_hashes(stack, rendered["id"])


def test_whip_without_a_ticket_or_opus_is_refused(api_url: str) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=SAMPLES / "portrait.jpg", options={"delivery": "webrtc"})
        ticket = client.ticket(session.id).ticket
        client.cancel(session.id)
    url = f"{api_url}/v1/live/{session.id}/whip"

    async def offers() -> tuple[str, str]:
        audio_pc, audio = await _offer(kinds=("audio",))
        video_pc, video = await _offer(kinds=("video",))
        await audio_pc.close()
        await video_pc.close()
        return audio, video

    audio, video = asyncio.run(offers())
    assert httpx.post(url, content=audio, headers=SDP, timeout=30).status_code == 401
    forged = {**SDP, "Authorization": "Bearer tk_000000000000_" + "A" * 32}
    refused = httpx.post(url, content=audio, headers=forged, timeout=30)
    assert refused.status_code == 403 and "ticket" in refused.text
    no_audio = httpx.post(url, content=video, headers={**SDP, "Authorization": f"Bearer {ticket}"}, timeout=30)
    assert no_audio.status_code == 400 and "no audio section" in no_audio.text
