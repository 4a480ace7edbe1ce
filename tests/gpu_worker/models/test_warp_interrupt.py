"""Barge-in and idle on a live warp session, on storage: an `interrupt` mid-utterance drops the audio the workflow had
not been told of (`LiveAudioWriter.interrupt`: a stored cut, read as silence), the mouth is at rest within 100 ms of
media time after the interrupt point, the dropped audio is never rendered or heard, and a session rebuilt from storage
(a node taking it over) makes the same frames. While no speech comes (silence), the avatar keeps moving."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from gpu_worker.models.warp import build_family, parameters as p
from gpu_worker.pipeline import ChunkRequest, OutputSpec, Pipeline
from monologue.contracts import LipSync, RenderOptions
from monologue.live_audio import Cut, LiveAudio, LiveAudioWriter, live_audio_cuts
from monologue.plan import AUDIO_RATE, IncrementalPlanner, frame_count, live_frames, plan_chunks
from monologue.storage import LocalStore
from tests.gpu_worker.models.test_warp import _ListSink, _RecordingRenderer

FPS = 25
PIECE = AUDIO_RATE // 10
SIZES = {"n_frames": 8, "i_frames": 2, "first_frames": 8}  # a webrtc session's small chunks
OPTIONS = RenderOptions(lip_sync=LipSync.LOUDNESS, chunk_frames=8, i_frames=2, first_chunk_frames=8)
OUTPUT = OutputSpec(resolution="512", preview=True)
MOUTH = (p.OPENING, p.WIDTH, p.PRESS, p.TUCK, p.PUCKER)


def _pcm(samples: np.ndarray) -> np.ndarray:
    return np.round(samples * 32768).clip(-32768, 32767).astype("<i2")


class _Live:
    """A live session as the workflow and a node run it: audio stored piece by piece, each chunk planned once the
    workflow hears of enough audio (`signal`), and run on a pipeline reading the stored pieces."""

    def __init__(self, store: LocalStore, portrait: np.ndarray) -> None:
        self.writer, self.audio = LiveAudioWriter(store, "live"), LiveAudio(store, "live")
        family = build_family()
        self.recorder = _RecordingRenderer(family.super_resolution)
        family.super_resolution = self.recorder
        self.pipeline = Pipeline(family)
        self.session = self.pipeline.start_session(portrait, OUTPUT, self.audio)
        self.planner = IncrementalPlanner(**SIZES)
        self.signalled = 0
        self.hashes: dict[int, list[str]] = {}
        self.latents: dict[int, np.ndarray] = {}

    def store(self, pcm: np.ndarray) -> None:
        for offset in range(0, len(pcm), PIECE):
            self.writer.append(pcm[offset : offset + PIECE])

    def signal(self, *, ended: bool = False) -> None:
        """The API tells the workflow what is stored; the workflow plans and the node runs what that allows."""
        stored = self.writer.finish() if ended else self.writer.stored
        self.signalled = stored
        self.audio.update(stored, ended)
        for chunk in self.planner.advance(live_frames(stored, OPTIONS, ended=ended), final=ended):
            result = self.pipeline.run_chunk(self.session, ChunkRequest(chunk, lip_sync=LipSync.LOUDNESS), _ListSink())
            self.hashes[chunk.first_frame] = result.frame_hashes
            self.latents[chunk.first_frame] = self.recorder.latents[-1]

    def frames(self) -> tuple[list[str], np.ndarray]:
        starts = sorted(self.hashes)
        return [h for s in starts for h in self.hashes[s]], np.concatenate([self.latents[s] for s in starts])


def _rebuilt(store: LocalStore, portrait: np.ndarray, total: int) -> tuple[list[str], LiveAudio]:
    """The session from storage alone on a fresh pipeline (a node that took it over), every chunk run again."""
    audio = LiveAudio(store, "live")
    audio.update(total, ended=True)
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(portrait, OUTPUT, audio)
    frames = frame_count(total, rate=AUDIO_RATE, fps=FPS)
    results = {
        chunk.first_frame: pipeline.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.LOUDNESS), _ListSink())
        for chunk in plan_chunks(frames, **SIZES)
    }
    return [h for start in sorted(results) for h in results[start].frame_hashes], audio


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    from skimage import data

    image: np.ndarray = data.astronaut()  # type: ignore[no-untyped-call]
    return image


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    from monologue.media import decode_wav
    from tests.gpu_worker.models.test_warp import SPEECH_WAV

    return decode_wav(SPEECH_WAV.read_bytes())


def _mid_utterance(speech: np.ndarray) -> int:
    """A sample in the middle of speech, on a frame's start (the hardest case: no part of the frame before it is
    spoken): the start of the loudest 0.2 s (whole pieces and frames) in the first 3 s."""
    step = 2 * PIECE
    blocks = speech[: 3 * AUDIO_RATE].astype(np.float64).reshape(-1, step)
    return int(np.argmax((blocks**2).mean(axis=1)[3:]) + 3) * step


def test_an_interrupt_mid_utterance_rests_the_mouth_within_100_ms_and_a_rebuilt_session_repeats_it(
    portrait: np.ndarray, speech: np.ndarray, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path)
    live = _Live(store, portrait)
    pcm = _pcm(speech)
    spoken = _mid_utterance(speech)
    live.store(pcm[:spoken])
    live.signal()  # the workflow knows of the audio up to the interrupt point...
    queued = spoken + AUDIO_RATE
    live.store(pcm[spoken:queued])  # ...and a second more is stored, not yet signalled: queued, not yet spoken
    live.writer.append(pcm[queued : queued + 700])  # and part of a piece is buffered, never stored
    cut = live.writer.interrupt(live.signalled)
    assert cut == Cut(spoken, queued)
    assert live_audio_cuts(store, "live") == (cut,)
    assert live.writer.stored == queued  # the buffered part went with the interrupt
    live.signal()
    live.store(pcm[:AUDIO_RATE])  # the next utterance, after the dropped second (its length stays, as silence)
    live.signal(ended=True)

    hashes, latents = live.frames()
    total = queued + AUDIO_RATE
    assert len(hashes) == frame_count(total, rate=AUDIO_RATE, fps=FPS)
    point = spoken * FPS / AUDIO_RATE  # the interrupt point, in frames
    # The goal: at rest on the frame on screen 100 ms after the point. The cut shuts the mouth faster than a pause
    # does (`MouthDynamics.cut_release`): one frame after the point already, where a pause takes two or three.
    rest = int(point + 0.1 * FPS)
    assert rest >= int(point) + 1
    resumed = queued * FPS // AUDIO_RATE
    assert latents[int(point) - 5 : int(point), p.OPENING].max() > 0.2  # mid-utterance: the mouth was open
    assert not latents[int(point) + 1 : resumed][:, MOUTH].any(), latents[int(point) : rest + 2, p.OPENING]
    assert latents[resumed:, p.OPENING].max() > 0.2  # the next utterance moves the lips again
    # The idle motion carries on through the cut: the head sways frame by frame, never a frozen frame.
    assert len(set(hashes[rest:resumed])) == resumed - rest

    rebuilt, audio = _rebuilt(store, portrait, total)
    assert rebuilt == hashes
    assert not audio.read(spoken, queued).any()  # the dropped second is never rendered or heard
    assert audio.read(spoken - PIECE, spoken).any()


def test_an_interrupt_with_nothing_queued_drops_only_the_unstored_rest(tmp_path: Path) -> None:
    writer = LiveAudioWriter(LocalStore(tmp_path), "live")
    writer.append(np.ones(PIECE + 10, dtype="<i2"))
    assert writer.interrupt(PIECE) is None
    assert writer.stored == PIECE and live_audio_cuts(LocalStore(tmp_path), "live") == ()
    assert writer.append(np.ones(PIECE - 1, dtype="<i2")) == PIECE  # the 10 buffered samples were dropped


def test_a_live_session_waiting_in_silence_keeps_moving(portrait: np.ndarray, tmp_path: Path) -> None:
    """Ten seconds of silence (a conversation's listening turn, or a browser microphone in a quiet room): the head
    sways and the eyes blink, every frame differs from the last, the mouth stays at rest; and again the same."""
    store = LocalStore(tmp_path)
    live = _Live(store, portrait)
    live.store(np.zeros(10 * AUDIO_RATE, dtype="<i2"))
    live.signal(ended=True)
    hashes, latents = live.frames()
    assert all(a != b for a, b in itertools.pairwise(hashes))
    assert not latents[:, MOUTH].any()
    assert latents[:, p.BLINK].max() > 0.9  # at least one blink in 10 s
    assert np.ptp(latents[:, p.SHIFT_X]) > 0.002 and np.ptp(latents[:, p.ROLL]) > 0.002
    assert _rebuilt(store, portrait, 10 * AUDIO_RATE)[0] == hashes


def test_the_node_reads_a_cut_stored_before_it_hears_of_the_audio_past_it(tmp_path: Path) -> None:
    """The node's reader lists the cuts again when the workflow says more audio is stored."""
    store = LocalStore(tmp_path)
    writer, audio = LiveAudioWriter(store, "live"), LiveAudio(store, "live")
    writer.append(np.full(3 * PIECE, 1000, dtype="<i2"))
    audio.update(PIECE, ended=False)
    writer.interrupt(PIECE)
    audio.update(3 * PIECE, ended=False)
    assert audio.silenced(0, 3 * PIECE) == ((PIECE, 3 * PIECE),)
    assert audio.read(0, PIECE).all() and not audio.read(PIECE, 3 * PIECE).any()
