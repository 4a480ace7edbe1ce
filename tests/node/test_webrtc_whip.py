"""The node's WHIP ingress on loopback: an aiortc client (the browser's stand-in) sends a WAV as Opus; the node stores
it as 16 kHz mono s16 pieces exactly as the audio socket does, signals the workflow (AUDIO_AVAILABLE, about once a
chunk, and the end on DELETE), holds back no more than a packet of speech, and leaves no connection or claim behind.
Offers it cannot take are refused with what is wrong, and leave nothing behind either."""

from __future__ import annotations

import asyncio
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaPlayer
from sqlalchemy.orm import sessionmaker
from temporalio.service import RPCError, RPCStatusCode

from monologue import SAMPLES, contracts as c, repo
from monologue.db import make_engine, make_sessionmaker, migrate
from monologue.live_audio import LiveAudio, LiveAudioWriter, stored_live_audio
from monologue.media import decode_wav, normalise_audio
from monologue.plan import AUDIO_RATE
from monologue.storage import LocalStore
from node.webrtc import whip
from node.webrtc.peers import OfferRefused
from node.webrtc.whip import WhipIngress
from tests.helpers import eventually

pytestmark = pytest.mark.timeout(90)
OPTIONS = {"delivery": "webrtc", "chunk_frames": 8, "i_frames": 2, "first_chunk_frames": 8, "lip_sync": "loudness"}
SECONDS = 2


class _Temporal:
    """Temporal's client as the ingress uses it: the signals each workflow got."""

    def __init__(self, *, refuse: bool = False) -> None:
        self.signals: list[tuple[str, str, c.AudioAvailable]] = []
        self.refuse = refuse  # the workflow has ended: every signal is refused

    def get_workflow_handle(self, workflow_id: str) -> Any:
        temporal = self

        class Handle:
            async def signal(self, name: str, audio: c.AudioAvailable) -> None:
                if temporal.refuse:
                    raise RPCError("workflow execution already completed", RPCStatusCode.NOT_FOUND, b"")
                temporal.signals.append((workflow_id, name, audio))

        return Handle()


@pytest.fixture
def sessions(tmp_path: Path) -> Iterator[sessionmaker[Any]]:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    migrate(url)
    engine = make_engine(url)
    factory = make_sessionmaker(engine)
    with factory() as db:
        for session_id in ("live", "other"):
            repo.create_session(
                db,
                session_id=session_id,
                tenant="local",
                options=OPTIONS,
                workflow_id=c.render_workflow_id(session_id),
                audio_seconds=0.0,
                width=512,
                height=512,
                kind=c.SessionKind.LIVE,
            )
    yield factory
    engine.dispose()


@pytest.fixture
def speech_wav(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """The first seconds of the bundled speech as a 48 kHz stereo WAV (a browser's microphone rate), and the 16 kHz
    samples it holds."""
    samples = decode_wav(normalise_audio((SAMPLES / "speech.wav").read_bytes()).wav)[: SECONDS * AUDIO_RATE]
    wide = np.repeat(np.round(samples * 32767).astype("<i2"), 3)  # 48 kHz, each sample three times
    path = tmp_path / "speech48k.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(48_000)
        out.writeframes(np.repeat(wide, 2).tobytes())
    return path, samples


async def _offer(*tracks: Any, kinds: tuple[str, ...] = ()) -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    for track in tracks:
        pc.addTrack(track)
    for kind in kinds:
        pc.addTransceiver(kind, direction="sendonly")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


def _envelope(samples: np.ndarray, step: int = AUDIO_RATE // 50) -> np.ndarray:
    usable = len(samples) // step * step
    return np.sqrt((samples[:usable].astype(np.float64).reshape(-1, step) ** 2).mean(axis=1))


def test_a_wav_sent_over_whip_is_stored_as_the_socket_stores_it_and_the_workflow_told(
    sessions: sessionmaker[Any], speech_wav: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    path, spoken = speech_wav
    store, temporal = LocalStore(tmp_path / "store"), _Temporal()

    async def main() -> None:
        ingress = WhipIngress(store=store, sessions=sessions, temporal=temporal)  # type: ignore[arg-type]
        player = MediaPlayer(str(path))
        client, offer = await _offer(player.audio)
        resource, answer = await ingress.answer("live", offer)
        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
        # Each packet goes on once the next has come, not four later (aiortc's default: 80 ms of speech held back)
        [receiver] = [t.receiver for t in ingress._senders[resource].pc.getTransceivers()]
        assert getattr(receiver, whip._JITTER_BUFFER)._prefetch == whip.AUDIO_PREFETCH == 1
        with pytest.raises(OfferRefused) as second:  # one sender at a time, socket or WHIP
            await ingress.answer("live", (await _offer(kinds=("audio",)))[1])
        assert second.value.status == 409
        await eventually(  # the WAV plays in real time
            lambda: (
                stored_live_audio(store, "live")[0] >= (SECONDS - 0.3) * AUDIO_RATE
                and player.audio.readyState == "ended"
            ),
            timeout_s=60,
            what="the WAV stored",
        )
        await asyncio.sleep(0.3)
        assert await ingress.close(resource, end=True)  # its DELETE: the session's audio ends with what was stored
        assert ingress.count() == 0
        await client.close()

    asyncio.run(main())

    total, ended = stored_live_audio(store, "live")
    assert ended and abs(total - SECONDS * AUDIO_RATE) < 0.3 * AUDIO_RATE, total
    audio = LiveAudio(store, "live")
    audio.update(total, ended=True)
    stored = audio.read(0, total)
    # Opus and two resamplings change the samples, not the speech: the loudness envelopes line up (codec delay:
    # a few ms) and match.
    heard, sent = _envelope(stored), _envelope(spoken)
    lag = max(range(0, 10), key=lambda k: np.corrcoef(heard[k : k + 80], sent[:80])[0, 1])
    length = min(len(heard) - lag, len(sent))
    assert np.corrcoef(heard[lag : lag + length], sent[:length])[0, 1] > 0.9

    signals = [audio for workflow, name, audio in temporal.signals if workflow == c.render_workflow_id("live")]
    assert all(name == c.AUDIO_AVAILABLE for _, name, _ in temporal.signals)
    assert len(signals) >= 3 and signals[-1].ended and signals[-1].samples == total
    assert [s.samples for s in signals] == sorted(s.samples for s in signals)
    with sessions() as db:
        row = repo.get_session(db, session_id="live")
        assert row is not None and row.audio_socket is None  # the claim is released
        assert row.audio_samples == total and row.started_at is not None  # the TTFF clock started


@pytest.mark.parametrize(
    ("session_id", "kinds", "status", "words"),
    [
        ("live", ("video",), 400, "audio (Opus) and nothing else"),
        ("live", ("audio", "video"), 400, "audio (Opus) and nothing else"),
        ("nope", ("audio",), 404, "not found"),
    ],
)
def test_offers_it_cannot_take_are_refused_and_leave_nothing_behind(
    sessions: sessionmaker[Any], tmp_path: Path, session_id: str, kinds: tuple[str, ...], status: int, words: str
) -> None:
    async def main() -> None:
        ingress = WhipIngress(store=LocalStore(tmp_path), sessions=sessions, temporal=_Temporal())  # type: ignore[arg-type]
        tasks = len(asyncio.all_tasks())
        client, offer = await _offer(kinds=kinds)
        with pytest.raises(OfferRefused) as refused:
            await ingress.answer(session_id, offer)
        assert refused.value.status == status and words in str(refused.value)
        assert ingress.count() == 0
        await client.close()
        await eventually(lambda: len(asyncio.all_tasks()) <= tasks, what="no task left behind")

    asyncio.run(main())
    with sessions() as db:
        row = repo.get_session(db, session_id="live")
        assert row is not None and row.audio_socket is None


def test_a_session_whose_audio_has_ended_takes_no_sender(sessions: sessionmaker[Any], tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    LiveAudioWriter.mark_ended(store, "live", 0)

    async def main() -> None:
        ingress = WhipIngress(store=store, sessions=sessions, temporal=_Temporal())  # type: ignore[arg-type]
        client, offer = await _offer(kinds=("audio",))
        with pytest.raises(OfferRefused) as refused:
            await ingress.answer("live", offer)
        assert refused.value.status == 409 and "ended" in str(refused.value)
        await client.close()

    asyncio.run(main())
    with sessions() as db:
        row = repo.get_session(db, session_id="live")
        assert row is not None and row.audio_socket is None


def test_a_sender_of_a_session_that_has_ended_is_closed(
    sessions: sessionmaker[Any], speech_wav: tuple[Path, np.ndarray], tmp_path: Path
) -> None:
    """The session ends while audio comes (its lifetime, a cancel): the workflow refuses the signal, the sender is
    closed and its claim released; what it stored stays."""
    path, _ = speech_wav
    store = LocalStore(tmp_path / "store")

    async def main() -> None:
        ingress = WhipIngress(store=store, sessions=sessions, temporal=_Temporal(refuse=True))  # type: ignore[arg-type]
        client, offer = await _offer(MediaPlayer(str(path)).audio)
        _, answer = await ingress.answer("live", offer)
        with sessions() as db:
            row = repo.get_session(db, session_id="live")
            assert row is not None
            row.status = c.SessionStatus.CANCELLED
            db.commit()
        await client.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))

        def closed_and_released() -> bool:
            with sessions() as db:
                row = repo.get_session(db, session_id="live")
                return ingress.count() == 0 and row is not None and row.audio_socket is None

        await eventually(closed_and_released, timeout_s=60, what="the sender closed and its claim released")
        await client.close()

    asyncio.run(main())
    assert stored_live_audio(store, "live")[0] > 0
    with sessions() as db:
        row = repo.get_session(db, session_id="live")
        assert row is not None and row.audio_socket is None
