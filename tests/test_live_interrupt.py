"""Barge-in and idle on the real embedded stack: `interrupt` on the live audio socket drops the audio the workflow has
not been told of (a stored cut), the session goes on and completes, and the dropped audio is never heard in its video;
a `realtime` socket whose client goes quiet gets silence stored, so the avatar keeps moving, and a render of the stored
samples makes the same frames."""

from __future__ import annotations

import io
import itertools
import json
import time
from typing import Any

import av
import numpy as np
from websockets.sync.client import connect

from cli.stack import Stack
from monologue import contracts as c
from monologue.client import Client
from monologue.live_audio import Cut, live_audio_cuts
from monologue.plan import IncrementalPlanner, chunk_sizes, frame_count, live_frames
from monologue.storage import LocalStore
from tests.helpers import api_key, get, submit, wait_done
from tests.test_live import PORTRAIT, SPEECH, _frame_hashes, _pcm
from tests.test_webrtc_whip import _stored_wav

RATE = 16_000


def _audio(mp4: bytes) -> np.ndarray:
    """The video's audio track, mono float at its own rate (the service's AAC is 16 kHz or more)."""
    with av.open(io.BytesIO(mp4)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate
        samples = np.concatenate([frame.to_ndarray().mean(axis=0) for frame in container.decode(stream)])
    assert rate == RATE or rate % RATE == 0, rate
    return samples[:: rate // RATE]


def test_an_interrupt_drops_the_audio_not_yet_spoken_and_the_session_completes_without_it(
    stack: Stack, api_url: str
) -> None:
    """2 s of speech as fast as the socket takes it, then `interrupt`: the server answers with the interrupt point
    (the audio it had told the workflow of) and drops the stored rest, which the video then has as silence; the
    session completes with every stored sample's frames."""
    speech = _pcm(SPEECH)[: 3 * RATE]
    pcm = speech.tobytes()
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=PORTRAIT, options={"delivery": "webrtc"})
        options = c.render_options(session.options.model_dump(mode="json"))
        # Mid-utterance (speech in the 0.2 s before the interrupt point), where the most is queued.
        candidates = [(stored, point) for stored, point in _signals(options, 2 * RATE) if _loud(speech, point)]
        stored, point = max(candidates, key=lambda pair: pair[0] - pair[1])
        report = client.stream_audio(session, pcm, speed=0, interrupt_at_s=stored / RATE)
        interrupted = report.interrupted
        assert interrupted is not None and interrupted["type"] == "interrupted", report.errors
        # What the API had told the workflow of when the interrupt came: the plan decides it, not timing.
        assert interrupted == {"type": "interrupted", "samples": stored, "at": point, "dropped": stored - point}
        assert report.ended is not None and report.ended["samples"] == stored
        done = client.wait(session.id, timeout_s=120)
    assert done.status == "completed", done.error
    frames = frame_count(stored, rate=RATE, fps=options.fps)
    assert done.progress.frames_total == frames
    dropped = stored - point

    root = stack.settings.storage.root
    assert root is not None
    assert live_audio_cuts(LocalStore(root), session.id) == (Cut(point, point + dropped),)
    heard = _audio(get(done.links.video, timeout=30).content)
    margin = RATE // 100  # 10 ms either side of the cut, for the AAC encoder's overlap
    assert np.sqrt(np.mean(heard[point - RATE // 5 : point - margin] ** 2)) > 0.01
    assert np.abs(heard[point + margin : point + dropped - margin]).max() < 1e-3, "the dropped audio is heard"
    assert len(_frame_hashes(stack, session.id)) == frames


def _loud(speech: np.ndarray, point: int) -> bool:
    before = speech[max(0, point - RATE // 5) : point].astype(np.float64) / 32768
    return before.size > 0 and float(np.sqrt(np.mean(before**2))) > 0.03


def _signals(options: c.RenderOptions, until: int) -> list[tuple[int, int]]:
    """(samples stored, samples the API had signalled then) for each stored 0.1 s piece up to `until`, as the API
    decides (a signal when the stored audio lets the workflow plan new chunks)."""
    planner, signalled, pairs = IncrementalPlanner(**chunk_sizes(options)), 0, []
    for stored in range(RATE // 10, until + 1, RATE // 10):
        if list(planner.advance(live_frames(stored, options, ended=False), final=False)):
            signalled = stored
        pairs.append((stored, signalled))
    return pairs


def _acked(socket: Any) -> int:
    """The samples the server has stored so far: an empty message (no audio, not heard as speech) and its ack."""
    socket.send(b"")
    return int(next(m for m in map(json.loads, socket) if m["type"] == "ack")["samples"])


def test_a_realtime_socket_that_goes_quiet_keeps_the_avatar_moving(
    stack: Stack, api_url: str, sample_portrait: bytes
) -> None:
    """1 s of speech in real time, then 2 s of nothing: the server stores silence for the quiet (to within the slack
    of the wall clock), the video goes on through it, every frame moving (blinks, sway), and a render of the very
    samples stored gives the same frames."""
    speech = _pcm(SPEECH)[RATE // 2 : RATE // 2 + RATE]
    with Client(api_url, api_key=api_key(api_url)) as client:
        session = client.create_live(portrait=PORTRAIT, options={"delivery": "webrtc"})
    assert session.audio_ticket is not None
    with connect(session.audio_ticket.url, max_size=None) as socket:
        assert json.loads(socket.recv(timeout=30))["type"] == "ready"
        socket.send(json.dumps({"type": "start", "realtime": True}))
        started = time.monotonic()
        offsets = range(0, len(speech), RATE // 50)
        for offset in offsets:
            time.sleep(max(0.0, started + offset / RATE - time.monotonic()))
            socket.send(speech[offset : offset + RATE // 50].tobytes())
        for _ in offsets:  # each piece's ack, so the next ack read is the newest
            next(m for m in map(json.loads, socket) if m["type"] == "ack")
        quiet_until = time.monotonic() + 2.0  # the client has nothing to say for 2 s, then waits for the server
        while (stored := _acked(socket)) < 2.4 * RATE or time.monotonic() < quiet_until:
            assert time.monotonic() < quiet_until + 60, f"the server stored {stored} samples, no silence for the quiet"
            time.sleep(0.1)
        socket.send(json.dumps({"type": "end"}))
        ended = next(m for m in map(json.loads, socket) if m["type"] == "ended")
    total = ended["samples"]
    assert total >= 2.4 * RATE, total  # 1 s of speech, 2 s of quiet less the slack
    with Client(api_url, api_key=api_key(api_url)) as client:
        done = client.wait(session.id, timeout_s=120)
    assert done.status == "completed", done.error
    root = stack.settings.storage.root
    assert root is not None
    hashes = _frame_hashes(stack, session.id)
    assert len(hashes) == frame_count(total, rate=RATE, fps=done.options.fps)
    assert all(a != b for a, b in itertools.pairwise(hashes))  # never a frozen frame
    same = {name: getattr(done.options, name) for name in ("chunk_frames", "i_frames", "first_chunk_frames")}
    render = submit(api_url, sample_portrait, _stored_wav(root, session.id), lip_sync=done.options.lip_sync, **same)
    rendered = wait_done(api_url, render.json()["id"])
    assert rendered["status"] == "completed", rendered["error"]
    assert _frame_hashes(stack, rendered["id"]) == hashes
