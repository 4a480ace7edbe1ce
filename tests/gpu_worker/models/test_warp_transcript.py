"""A transcript for the warp family's visemes: the words' forced alignment over the whole speech drives the lips
(instead of recognised phones), the same for a frame whatever the chunking or the node, and bad transcripts get
a clear error before any chunk."""
# ruff: noqa: F811 (the fixtures of test_warp_visemes, imported by name, are this module's arguments too)

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gpu_worker.models.warp import build_family
from gpu_worker.models.warp.alignment import AlignedPhones, TranscriptAligner, transcript_words
from gpu_worker.models.warp.phonemes import PHONE_IDS
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.pipeline import Session
from monologue.contracts import Family, LipSync, RenderOptions
from monologue.errors import InputError
from monologue.plan import AUDIO_RATE, plan_chunks
from tests.gpu_worker.models.test_warp import Render, _ListSink, _render
from tests.gpu_worker.models.test_warp_visemes import (  # noqa: F401 (module-scoped fixtures shared with it)
    FPS,
    TEXT,
    Spoken,
    _shapes,
    assert_chunks_read_the_whole_timeline_s_mouth,
    portrait,
    spoken,
    spoken_render,
)

OUTPUT = OutputSpec(resolution="512", preview=True)


@pytest.fixture(scope="module")
def aligned_session(portrait: np.ndarray, spoken: Spoken) -> Session:
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(portrait, OUTPUT, ArrayAudio(spoken.samples))
    pipeline.prepare_speech(session, TEXT)
    return session


def test_the_transcript_s_phones_are_its_words_forced_alignment(aligned_session: Session, spoken: Spoken) -> None:
    prepared = aligned_session.prepared
    assert isinstance(prepared, AlignedPhones)
    truth = np.zeros_like(prepared.steps)
    for name, first, end in spoken.phones:
        truth[first:end] = PHONE_IDS.get(name, 0)
    speech = truth > 0
    assert speech.sum() > 500 and np.mean(prepared.steps[speech] == truth[speech]) > 0.95
    assert (
        not prepared.between(-50, 0).any() and not prepared.between(prepared.steps.size, prepared.steps.size + 9).any()
    )


def test_with_the_transcript_the_lips_close_on_more_m_b_p_frames_than_recognition_gives(
    portrait: np.ndarray, spoken: Spoken, spoken_render: Render
) -> None:
    """The rendered frames, measured as for recognition: the recogniser misses some m, b, p; the alignment
    knows them, so (nearly) every frame inside one shows closed lips."""
    recognised = _shapes(spoken_render, spoken)
    aligned = _shapes(_render(portrait, spoken.samples, OutputSpec(resolution="512"), transcript=TEXT), spoken)
    print(recognised.line("recognised phones"), aligned.line("transcript"), sep="\n")  # docs/benchmarks.md

    closed_recognised, closed_aligned = np.mean(recognised.closed_gaps <= 1), np.mean(aligned.closed_gaps <= 1)
    assert closed_aligned >= 0.8 and closed_aligned > closed_recognised
    assert np.median(aligned.vowel_gaps) >= aligned.rest and aligned.round_ratio < 0.8 * aligned.spread_ratio


@pytest.mark.parametrize(("n_frames", "i_frames", "first"), [(40, 4, 16), (7, 0, 7), (25, 3, 1)])
def test_every_chunking_gives_every_frame_the_same_aligned_mouth(
    aligned_session: Session, spoken: Spoken, n_frames: int, i_frames: int, first: int
) -> None:
    assert_chunks_read_the_whole_timeline_s_mouth(aligned_session, spoken, n_frames, i_frames, first)


def test_a_node_that_aligns_again_resumes_with_the_same_frames(portrait: np.ndarray, spoken: Spoken) -> None:
    """The alignment is not checkpointed: a node taking the session over aligns the speech again, and must
    get the same phones, hence the same frames from the checkpointed anchors on."""
    total = len(spoken.samples) * FPS // AUDIO_RATE
    order = plan_chunks(total, n_frames=40, i_frames=4)
    first = Pipeline(build_family())
    session = first.start_session(portrait, OUTPUT, ArrayAudio(spoken.samples))
    first.prepare_speech(session, TEXT)
    for chunk in order[:3]:
        first.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink())
    checkpoint = session.anchors.export()
    originals = [
        first.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()).frame_hashes
        for chunk in order[3:]
    ]

    second = Pipeline(build_family())
    resumed = second.start_session(portrait, OUTPUT, ArrayAudio(spoken.samples), reference=session.reference)
    second.prepare_speech(resumed, TEXT)
    resumed.anchors.restore({name: value.copy() for name, value in checkpoint.items()})
    again = [
        second.run_chunk(resumed, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()).frame_hashes
        for chunk in order[3:]
    ]
    assert np.array_equal(resumed.prepared.steps, session.prepared.steps)
    assert again == originals and len(again) >= 3


def test_words_outside_the_dictionary_are_named(spoken: Spoken) -> None:
    with pytest.raises(InputError, match=r"2 word\(s\) are not in the pronunciation dictionary \(zorblax, quuxly\)"):
        TranscriptAligner().align(ArrayAudio(spoken.samples), "Bob and Pam zorblax the quuxly map")


def test_a_transcript_that_is_not_what_is_said_is_refused(spoken: Spoken) -> None:
    with pytest.raises(InputError, match="the speech does not align with it"):
        TranscriptAligner().align(
            ArrayAudio(spoken.samples), "The weather in Paris is lovely today and tomorrow it will rain on the hills."
        )


def test_a_transcript_needs_the_whole_speech_and_words() -> None:
    streaming = ArrayAudio(np.zeros(16_000, dtype=np.float32))
    streaming.total_samples = None  # as a live session's audio, still arriving
    with pytest.raises(InputError, match="only renders take one"):
        TranscriptAligner().align(streaming, "hello")
    with pytest.raises(InputError, match="holds no words"):
        TranscriptAligner().align(ArrayAudio(np.zeros(16_000, dtype=np.float32)), " 42 -- !")


def test_transcript_words_keep_letters_and_apostrophes() -> None:
    assert transcript_words("Don\u2019t STOP—now, 'Bob'! 3 cats") == ["don't", "stop", "now", "bob", "cats"]


@pytest.mark.parametrize(
    "options",
    [
        {"lip_sync": LipSync.LOUDNESS},
        {"family": Family.DIT, "lip_sync": LipSync.VISEMES},
        {"family": Family.INFINITETALK, "lip_sync": LipSync.VISEMES, "chunk_frames": 40, "i_frames": 4},
    ],
)
def test_only_warp_visemes_take_a_transcript(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="only the warp family's visemes follow a transcript"):
        RenderOptions(transcript="hello", **options)
    assert RenderOptions(transcript="  ", **options).transcript == "  "  # blank: no transcript
    assert RenderOptions(transcript="hello", lip_sync=LipSync.VISEMES).transcript == "hello"
