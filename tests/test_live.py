"""Live sessions on the real embedded stack: speech streamed in over the WebSocket in real time, video
published while it arrives, and the same frames a render of the same audio gives."""

from __future__ import annotations

import contextlib
import json
import socket as socket_module
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from api.routes.sessions import WEBRTC_CHUNKS, WEBRTC_LIP_SYNC
from cli.live_stream import start_session, stream_live
from cli.stack import Stack
from monologue.client import Client
from monologue.media import normalise_audio
from tests.conftest import SAMPLES
from tests.helpers import api_key, decode_video, get, post, submit, wait_done, ws_connect

PORTRAIT, SPEECH = SAMPLES / "portrait.jpg", SAMPLES / "speech.wav"


def _frame_hashes(stack: Stack, session_id: str) -> list[str]:
    root = stack.settings.storage.root
    assert root is not None
    lines = (root / "sessions" / session_id / "out" / "frames.jsonl").read_text().splitlines()
    return [json.loads(line)["sha256"] for line in lines]


def _pcm(path: Path) -> np.ndarray:
    return np.frombuffer(normalise_audio(path.read_bytes()).wav[44:], dtype="<i2")


def _close_reason(socket: Any) -> tuple[int | None, list[dict[str, Any]]]:
    """Read until the server closes: (close code, the JSON messages it sent)."""
    messages = []
    try:
        for message in socket:
            messages.append(json.loads(message))
    except ConnectionClosed:
        pass
    return socket.close_code, messages


def test_live_session_publishes_while_audio_arrives_and_matches_a_render(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    report = stream_live(api_url, PORTRAIT, SPEECH, api_key=api_key(api_url))  # real time: 6.9 s of espeak-ng speech
    session = report.session
    assert session["status"] == "completed", session["error"]
    assert session["kind"] == "live" and not report.errors
    assert report.acks > 0
    assert report.segments_while_streaming >= 2  # video went out while the speech was still coming in
    latency = session["latency"]
    assert latency["chunks"] == session["progress"]["chunks_total"]
    assert 0 < latency["p50_ms"] <= latency["p95_ms"] <= latency["max_ms"]
    first_ms = 1000 * session["options"]["first_chunk_frames"] / session["options"]["fps"]
    assert session["options"]["first_chunk_frames"] == 16  # live sessions start with a short chunk (a setting)
    assert session["options"]["lip_sync"] == "visemes"  # new sessions' default: phone windows, 1.3 s look-ahead
    assert session["ttff_ms"] >= first_ms  # the first chunk needs its own audio first
    video = get(session["links"]["video"], timeout=30)
    frames, video_seconds, audio_seconds = decode_video(video.content)
    assert len(frames) == session["progress"]["frames_total"]
    assert abs(video_seconds - report.audio_seconds) <= 1 / 25 and abs(audio_seconds - report.audio_seconds) < 0.05
    playlist = get(session["links"]["stream"], timeout=10).text
    assert playlist.rstrip().endswith("#EXT-X-ENDLIST")

    # The same audio as a render: the incremental plan and the stored pieces give the very same frames.
    render = wait_done(api_url, submit(api_url, sample_portrait, sample_speech, first_chunk_frames=16).json()["id"])
    assert render["status"] == "completed", render["error"]
    assert _frame_hashes(stack, session["id"]) == _frame_hashes(stack, render["id"])


@pytest.mark.parametrize("given", [{}, {"i_frames": 2}], ids=["defaults", "small-i-chunks"])
def test_a_webrtc_live_session_makes_small_chunks_as_its_audio_arrives_and_a_render_the_same_frames(
    stack: Stack, api_url: str, sample_portrait: bytes, sample_speech: bytes, given: dict[str, int]
) -> None:
    """delivery=webrtc: small chunks by default (`WEBRTC_CHUNKS`: warp has no I chunks, its N chunks carry the
    motion across each seam; or small I chunks if asked), planned as the audio arrives; a render of the same
    samples with the same chunk options gives the very same frames."""
    options = {"delivery": "webrtc", **given}
    report = stream_live(api_url, PORTRAIT, SPEECH, options=options, api_key=api_key(api_url))  # real time
    session = report.session
    assert session["status"] == "completed", session["error"]
    chosen = {name: session["options"][name] for name in ("chunk_frames", "i_frames", "first_chunk_frames")}
    assert chosen == {**WEBRTC_CHUNKS, **given} and session["options"]["lip_sync"] == WEBRTC_LIP_SYNC
    frames, n_frames = session["progress"]["frames_total"], WEBRTC_CHUNKS["chunk_frames"]
    if not given:
        assert session["progress"]["chunks_total"] == -(-frames // n_frames)  # N chunks only
    assert session["latency"]["chunks"] == session["progress"]["chunks_total"]
    assert report.segments_while_streaming >= 10  # small chunks went out while the speech was still coming in

    same = {**chosen, "lip_sync": session["options"]["lip_sync"]}
    render = wait_done(api_url, submit(api_url, sample_portrait, sample_speech, **same).json()["id"])
    assert render["status"] == "completed", render["error"]
    assert _frame_hashes(stack, session["id"]) == _frame_hashes(stack, render["id"])


@pytest.mark.parametrize("given", [{}, {"chunk_frames": 6, "i_frames": 2}], ids=["defaults", "sizes-given"])
def test_a_webrtc_live_session_keeps_the_chunk_sizes_its_client_gives(api_url: str, given: dict[str, int]) -> None:
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=PORTRAIT, options={"delivery": "webrtc", **given})
        client.cancel(session.id)
    expected = {**WEBRTC_CHUNKS, **given}
    assert {name: getattr(session.options, name) for name in expected} == expected


def test_only_live_sessions_deliver_over_webrtc(api_url: str, sample_portrait: bytes, sample_speech: bytes) -> None:
    before = get(f"{api_url}/v1/renders", params={"limit": 200}).json()["items"]
    refused = submit(api_url, sample_portrait, sample_speech, delivery="webrtc")
    assert refused.status_code == 422 and "delivery" in refused.text, refused.text
    after = get(f"{api_url}/v1/renders", params={"limit": 200}).json()["items"]
    assert {item["id"] for item in after} == {item["id"] for item in before}  # nothing created


def test_other_rates_are_resampled_and_audio_may_come_faster_than_real_time(stack: Stack, api_url: str) -> None:
    pcm = _pcm(SPEECH)[: 16_000 * 3]
    stereo_48k = np.repeat(np.repeat(pcm, 3)[:, None], 2, axis=1)  # 48 kHz, two channels
    session = start_session(api_url, PORTRAIT, api_key=api_key(api_url))
    with ws_connect(session["links"]["audio"]) as socket:
        socket.send(json.dumps({"type": "start", "sample_rate": 48_000, "channels": 2, "format": "s16le"}))
        for offset in range(0, len(stereo_48k), 4800):  # 0.1 s messages, as fast as the socket takes them
            socket.send(stereo_48k[offset : offset + 4800].tobytes())
        socket.send(json.dumps({"type": "end"}))
        code, messages = _close_reason(socket)
    assert code == 1000 and messages[-1]["type"] == "ended"
    assert abs(messages[-1]["seconds"] - 3.0) < 0.01
    render = wait_done(api_url, session["id"])
    assert render["status"] == "completed", render["error"]
    assert render["progress"]["frames_total"] == 75


@pytest.mark.parametrize(
    ("first", "problem"),
    [
        (b"\x01\x02\x03", "whole samples"),
        ("not json", "JSON objects"),
        (json.dumps({"type": "start", "format": "f32le"}), "format"),
        (json.dumps({"type": "start", "sample_rate": 44}), "sample_rate"),
        (json.dumps({"type": "pause"}), "unknown message type"),
        ("[" * 100_000, "JSON objects"),  # Python's parser would recurse past its limit: a 1006 close, not 4400
    ],
    ids=["odd-bytes", "not-json", "float-format", "bad-rate", "unknown-type", "nested-100000-deep"],
)
def test_bad_audio_is_refused_with_a_clear_error_and_ends_the_session_cleanly(
    api_url: str, first: bytes | str, problem: str
) -> None:
    session = start_session(api_url, PORTRAIT, api_key=api_key(api_url))
    with ws_connect(session["links"]["audio"]) as socket:
        socket.send(first)
        code, messages = _close_reason(socket)
    assert code == 4400
    assert messages[-1]["type"] == "error" and problem in messages[-1]["message"]
    render = wait_done(api_url, session["id"], timeout_s=60)
    assert render["status"] == "failed" and "no audio" in render["error"]  # nothing stored, nothing half-made


def test_a_second_audio_socket_and_audio_after_end_are_refused(api_url: str) -> None:
    session = start_session(api_url, PORTRAIT, api_key=api_key(api_url))
    second_half = _pcm(SPEECH)[16_000 * 2 : 16_000 * 4]
    with ws_connect(session["links"]["audio"]) as first:
        first.send(_pcm(SPEECH)[: 16_000 * 2].tobytes())
        with ws_connect(session["links"]["audio"]) as second:
            code, messages = _close_reason(second)
        assert code == 4409 and "already has" in messages[-1]["message"]
        first.send(json.dumps({"type": "end"}))
        assert _close_reason(first)[0] == 1000
    with ws_connect(session["links"]["audio"]) as late:  # audio after `end`: the session takes no more
        with contextlib.suppress(ConnectionClosed):  # the server may refuse before the audio goes out
            late.send(second_half.tobytes())
        code, messages = _close_reason(late)
    assert code in (4409,) and messages[-1]["type"] == "error"
    render = wait_done(api_url, session["id"])
    assert render["status"] == "completed" and render["progress"]["frames_total"] == 50  # 2 s, not 4


def test_unknown_sessions_and_renders_have_no_audio_socket(
    api_url: str, sample_portrait: bytes, sample_speech: bytes
) -> None:
    with ws_connect(f"ws{api_url.removeprefix('http')}/v1/sessions/nope/audio") as socket:
        code, messages = _close_reason(socket)
    assert code == 4404 and "not found" in messages[-1]["message"]
    render = submit(api_url, sample_portrait, sample_speech).json()
    with ws_connect(f"ws{api_url.removeprefix('http')}/v1/sessions/{render['id']}/audio") as socket:
        assert _close_reason(socket)[0] == 4404
    assert render["links"]["audio"] is None
    assert wait_done(api_url, render["id"])["status"] == "completed"  # nothing left running for the next test


def test_a_live_session_needs_a_usable_portrait(api_url: str) -> None:
    response = post(f"{api_url}/v1/sessions", files={"portrait": ("p.png", b"not an image")}, timeout=30)
    assert response.status_code == 422 and "portrait" in response.json()["detail"]
    response = post(f"{api_url}/v1/sessions", data={"fps": "0"}, files={"portrait": ("p.png", b"x")}, timeout=30)
    assert response.status_code == 422 and "fps" in response.json()["detail"]


class _DropsOnce:
    """Opens audio sockets like websockets' own `connect`, and drops the first one's TCP connection (no close
    frame, no `end`: a network blip) after `after` messages, as a client losing its network mid-stream would."""

    def __init__(self, after: int) -> None:
        self.after, self.opened = after, 0

    def __call__(self, url: str, **kwargs: Any) -> Any:
        from websockets.sync.client import connect

        socket = connect(url, **kwargs)
        self.opened += 1
        if self.opened == 1:
            send, sent = socket.send, [0]

            def send_then_drop(message: Any) -> None:
                send(message)
                sent[0] += 1
                if sent[0] == self.after:
                    socket.socket.shutdown(socket_module.SHUT_RDWR)

            socket.send = send_then_drop  # type: ignore[method-assign]
        return socket


def test_a_dropped_audio_socket_reconnects_with_a_fresh_ticket_and_the_video_is_the_same(
    stack: Stack, api_url: str
) -> None:
    """The live helper streams 3 s of speech with tickets only (no key on the socket); the first socket is cut
    after 1.6 s, the helper takes a new ticket and continues from the sample the server says it stored. The video
    is frame for frame the one an uninterrupted session of the same audio makes."""
    pcm = _pcm(SPEECH)[: 16_000 * 3].tobytes()
    hashes = []
    with Client(api_url, api_key=api_key(api_url)) as client:
        for connect in (_DropsOnce(after=80), None):  # 80 messages of 20 ms
            session = client.create_live(portrait=PORTRAIT)
            assert session.audio_ticket is not None and "ticket=" in session.audio_ticket.url
            report = client.stream_audio(session, pcm, speed=0, connect=connect)
            assert report.ended is not None and report.ended["samples"] == 16_000 * 3
            assert report.reconnects == (1 if connect else 0), report.errors
            done = client.wait(session.id, timeout_s=120)
            assert done.progress.frames_total == 75
            hashes.append(_frame_hashes(stack, session.id))
    assert hashes[0] == hashes[1]


def test_tickets_open_one_socket_once_and_only_for_their_session(api_url: str, stack: Stack) -> None:
    origin = stack.settings.links.cors_origins[0]
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=PORTRAIT)
        other = client.create_live(portrait=PORTRAIT)
        try:
            assert session.audio_ticket is not None
            url = session.audio_ticket.url
            # From a browser page at the configured origin: no header but the ticket, which works once.
            with connect(url, additional_headers={"Origin": origin}) as socket:
                assert json.loads(socket.recv(timeout=30)) == {"type": "ready", "samples": 0, "seconds": 0.0}
            with connect(url) as socket:
                code, messages = _close_reason(socket)
            assert code == 4401 and "used already" in messages[-1]["message"]
            fresh = client.ticket(other.id).url
            with connect(fresh.replace(other.id, session.id)) as socket:  # another session's ticket
                assert _close_reason(socket)[0] == 4401
            with pytest.raises(InvalidStatus):  # a page elsewhere may not open it, ticket or not
                connect(client.ticket(session.id).url, additional_headers={"Origin": "https://elsewhere.example"})
        finally:
            client.cancel(session.id)
            client.cancel(other.id)
