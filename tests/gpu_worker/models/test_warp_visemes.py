"""The warp family's visemes: phone-timed mouth shapes, seen in the rendered frames, and the same for a frame
whatever the chunking, live arrival or resume."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from skimage import data

from gpu_worker.models.warp import build_family, parameters as p
from gpu_worker.models.warp.phonemes import PHONES, WINDOW_CACHE, PhoneRecogniser, WindowCache
from gpu_worker.models.warp.texture import _LUMA, _skin_luma
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.pipeline import Session
from gpu_worker.pipeline.stages import ChunkState, ContextStage
from monologue.contracts import Chunk, ChunkKind, Family, LipSync, RenderOptions
from monologue.live_audio import LiveAudio, LiveAudioWriter
from monologue.media import decode_wav, normalise_audio
from monologue.plan import AUDIO_RATE, IncrementalPlanner, live_frames, live_samples_needed, plan_chunks
from monologue.storage import LocalStore
from tests.gpu_worker.models.test_warp import SPEECH_WAV, Render, _layout, _ListSink, _RecordingRenderer, _render

FPS = 25
# Known words: bilabials between open vowels, rounded and spread vowels.
TEXT = (
    "Bob and Pam bought a map. Mom made apple pie. Who knew two blue boots? Oh no, go slow. "
    "We see three green keys. He will eat cheese."
)
# The frame digests of the bundled sample in loudness lip sync, 512x512, seed 0, N 40 / I 4 chunks, recorded
# before visemes existed: loudness sessions (all sessions from before) must keep rendering exactly these.
LOUDNESS_SAMPLE_DIGEST = "b41b4c39b845b62585ac2aacd1a37aeb0aa5bb99d29b35d8314c8934a245093d"


@dataclass
class Spoken:
    samples: np.ndarray  # (S,) float32 16 kHz
    phones: list[tuple[str, int, int]]  # forced alignment of TEXT: (phone, first step, end step), 10 ms steps


def _forced_alignment(samples: np.ndarray, text: str) -> list[tuple[str, int, int]]:
    """The test's ground truth: PocketSphinx aligning the known words (a different search from the product's
    phone recogniser, which never sees the text)."""
    from pocketsphinx import Decoder

    decoder = Decoder(loglevel="FATAL")
    dither = np.round(np.random.default_rng(0).standard_normal(samples.size) * 16)
    pcm = np.clip(np.round(samples * 32768.0) + dither, -32768, 32767).astype("<i2").tobytes()
    decoder.set_align_text(" ".join(re.sub(r"[^a-z' ]", " ", text.lower()).split()))
    for alignment_pass in ("words", "phones within them"):  # PocketSphinx's two-pass alignment
        if alignment_pass != "words":
            decoder.set_alignment()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
    return [
        (phone.name, phone.start, phone.start + phone.duration) for word in decoder.get_alignment() for phone in word
    ]


@pytest.fixture(scope="module")
def spoken(tmp_path_factory: pytest.TempPathFactory) -> Spoken:
    program = shutil.which("espeak-ng")
    if program is None:
        pytest.fail("espeak-ng is not installed (apt-get install espeak-ng; infra/test.sh installs it)")
    path = tmp_path_factory.mktemp("visemes") / "words.wav"
    subprocess.run([program, "-v", "en-us", "-s", "165", "-w", str(path), TEXT], check=True, capture_output=True)
    speech = decode_wav(normalise_audio(path.read_bytes()).wav)
    pause = np.zeros(AUDIO_RATE // 2, dtype=np.float32)
    samples = np.concatenate([pause, speech, pause])
    return Spoken(samples, _forced_alignment(samples, TEXT))


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    image: np.ndarray = data.astronaut()  # type: ignore[no-untyped-call]
    return image


@pytest.fixture(scope="module")
def spoken_render(portrait: np.ndarray, spoken: Spoken) -> Render:
    return _render(portrait, spoken.samples, OutputSpec(resolution="512"))


def _frames_inside(spoken: Spoken, names: set[str], n_frames: int) -> list[int]:
    """Frames whose centre lies inside one of the named phones."""
    centres = [(2 * frame + 1) * AUDIO_RATE // (2 * FPS * 160) for frame in range(n_frames)]
    return [f for f, step in enumerate(centres) if any(a <= step < b for n, a, b in spoken.phones if n in names)]


class MouthMeter:
    """Reads the inner mouth off a rendered frame: pixels brighter than the skin (teeth) or much darker
    (the cavity) in the mouth region."""

    def __init__(self, render: Render) -> None:
        self.layout = layout = _layout(render)
        self.skin = _skin_luma(render.session.reference["portrait"], layout)
        face, lips = layout.face_height, layout.mouth_half_width
        self.rows = slice(round(layout.mouth_y - 0.12 * face), round(layout.mouth_y + 0.14 * face))
        self.columns = slice(round(layout.mouth_x - 1.3 * lips), round(layout.mouth_x + 1.3 * lips))

    def inner(self, frame: np.ndarray) -> np.ndarray:
        luma = frame[self.rows, self.columns].astype(np.float64) @ _LUMA  # (h, w)
        mask: np.ndarray = ((luma > 1.08 * self.skin) & (luma > 110)) | (luma < 0.45 * self.skin)
        return mask

    def gap(self, frame: np.ndarray) -> float:
        """Rows between the lips at the middle of the mouth (median over its central half)."""
        inner = self.inner(frame)
        centre, half = inner.shape[1] // 2, round(0.5 * self.layout.mouth_half_width)
        return float(np.median(inner[:, centre - half : centre + half + 1].sum(axis=0)))

    def width_over_height(self, frame: np.ndarray) -> float:
        counts = self.inner(frame).sum(axis=0)  # (w,)
        columns = np.flatnonzero(counts >= 1)
        return float((columns[-1] - columns[0] + 1) / counts.max()) if columns.size else float("nan")


@dataclass
class MouthShapes:
    rest: float  # the portrait's own gap (its teeth)
    closed_gaps: np.ndarray  # (m/b/p frames,) rows between the lips
    vowel_gaps: np.ndarray
    round_ratio: float  # median width / height of the inner mouth on oo/oh
    spread_ratio: float  # … and on ee/eh

    def line(self, name: str) -> str:
        return (
            f"{name}: m/b/p median gap {np.median(self.closed_gaps):.1f} rows (rest {self.rest:.0f}, vowels"
            f" {np.median(self.vowel_gaps):.1f}), {np.mean(self.closed_gaps <= 1):.0%} at most 1 row;"
            f" width/height oo/oh {self.round_ratio:.2f} vs ee/eh {self.spread_ratio:.2f}"
        )


def _shapes(render: Render, spoken: Spoken) -> MouthShapes:
    meter, frames = MouthMeter(render), render.frames
    closed = _frames_inside(spoken, {"M", "B", "P"}, len(frames))
    rounded = _frames_inside(spoken, {"UW", "UH", "OW", "W"}, len(frames))
    spread = _frames_inside(spoken, {"IY", "IH", "EY", "EH"}, len(frames))
    vowels = _frames_inside(spoken, {"AA", "AE", "AH", "AY", "UW", "OW", "IY", "EY"}, len(frames))
    assert len(closed) >= 15 and len(rounded) >= 15 and len(spread) >= 15
    return MouthShapes(
        rest=meter.gap(render.session.reference["portrait"]),
        closed_gaps=np.array([meter.gap(frames[f]) for f in closed]),
        vowel_gaps=np.array([meter.gap(frames[f]) for f in vowels]),
        round_ratio=float(np.nanmedian([meter.width_over_height(frames[f]) for f in rounded])),
        spread_ratio=float(np.nanmedian([meter.width_over_height(frames[f]) for f in spread])),
    )


def test_lips_close_on_m_b_p_and_round_on_o_u_in_the_rendered_frames(
    portrait: np.ndarray, spoken: Spoken, spoken_render: Render
) -> None:
    """Against the words' forced alignment: the inner-lip gap is near zero inside m, b and p (the portrait
    shows 4 rows of teeth at rest) and the mouth is rounder (width / height lower) on oo/oh than on ee/eh;
    loudness lip sync, measured the same way, does neither."""
    visemes = _shapes(spoken_render, spoken)
    loudness = _shapes(
        _render(portrait, spoken.samples, OutputSpec(resolution="512"), lip_sync=LipSync.LOUDNESS), spoken
    )
    print(visemes.line("visemes"), loudness.line("loudness"), sep="\n")  # docs/benchmarks.md cites these lines

    assert visemes.rest >= 3 and np.median(visemes.closed_gaps) <= 1.0 and np.mean(visemes.closed_gaps <= 1) >= 0.5
    assert np.median(visemes.vowel_gaps) >= visemes.rest  # vowels are not closed: the lips part over the teeth
    assert visemes.round_ratio < 0.8 * visemes.spread_ratio
    assert np.median(loudness.closed_gaps) > visemes.rest and loudness.round_ratio > 0.8 * loudness.spread_ratio


def test_loudness_lip_sync_renders_exactly_the_frames_it_rendered_before_visemes(portrait: np.ndarray) -> None:
    render = _render(
        portrait, decode_wav(SPEECH_WAV.read_bytes()), OutputSpec(resolution="512"), lip_sync=LipSync.LOUDNESS
    )

    assert hashlib.sha256("".join(render.hashes).encode()).hexdigest() == LOUDNESS_SAMPLE_DIGEST
    assert not render.latents[:, [p.PRESS, p.TUCK, p.PUCKER]].any()


@pytest.fixture(scope="module")
def context_session(portrait: np.ndarray, spoken: Spoken) -> Session:
    return Pipeline(build_family()).start_session(
        portrait, OutputSpec(resolution="512", preview=True), ArrayAudio(spoken.samples)
    )


def _visemes(session: Session, chunk: ChunkRequest) -> np.ndarray:
    """The context stage's viseme targets of a chunk, read as a node reads them."""
    state = ChunkState(chunk=chunk, rng=np.random.default_rng(0), sink=_ListSink())
    ContextStage().run(session, state)
    assert state.context is not None
    targets: np.ndarray = state.context["visemes"]
    return targets


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n_frames=st.integers(2, 60),
    i_frames=st.integers(0, 8),
    first=st.integers(1, 60),
)
def test_every_chunking_gives_every_frame_the_same_mouth_shape(
    context_session: Session, spoken: Spoken, n_frames: int, i_frames: int, first: int
) -> None:
    assert_chunks_read_the_whole_timeline_s_mouth(context_session, spoken, n_frames, i_frames, first)


def assert_chunks_read_the_whole_timeline_s_mouth(
    session: Session, spoken: Spoken, n_frames: int, i_frames: int, first: int
) -> None:
    """Every chunk of this chunking gets the viseme targets that one chunk over the whole speech gives its frames."""
    total = len(spoken.samples) * FPS // AUDIO_RATE
    whole = _visemes(session, ChunkRequest(plan_chunks(total, n_frames=total)[0], lip_sync=LipSync.VISEMES))
    for chunk in plan_chunks(total, n_frames=n_frames, i_frames=i_frames, first_frames=first):
        targets = _visemes(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES))
        assert np.array_equal(targets, whole[chunk.first_frame : chunk.end_frame]), chunk.name


def test_the_mouth_is_the_same_for_every_chunk_layout(
    portrait: np.ndarray, spoken: Spoken, spoken_render: Render
) -> None:
    """Whole frames differ between chunk layouts by design (the head's sway draws per chunk), the mouth must not."""
    mouth = [p.OPENING, p.WIDTH, p.PRESS, p.TUCK, p.PUCKER]
    family = build_family()
    recorder = family.super_resolution = _RecordingRenderer(family.super_resolution)
    pipeline = Pipeline(family)
    session = pipeline.start_session(portrait, OutputSpec(resolution="512", preview=True), ArrayAudio(spoken.samples))
    total = len(spoken_render.latents)
    for n_frames, i_frames, first_frames in ((25, 3, 16), (7, 0, 7)):
        recorder.latents.clear()
        chunks = plan_chunks(total, n_frames=n_frames, i_frames=i_frames, first_frames=first_frames)
        for chunk in chunks:
            pipeline.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink())
        timeline = np.argsort([chunk.first_frame for chunk in chunks])
        latents = np.concatenate([recorder.latents[index] for index in timeline])
        assert np.array_equal(latents[:, mouth], spoken_render.latents[:, mouth]), (n_frames, i_frames)


def test_a_live_feed_with_exactly_the_planned_lookahead_renders_the_render_s_frames(
    portrait: np.ndarray, spoken: Spoken, tmp_path: Path
) -> None:
    """Audio stored 0.1 s at a time; each chunk runs as soon as the live planner allows (the phone windows its
    mouth reads and not a sample more: LiveAudio refuses to read past what is stored), and the frames are the
    render's."""
    options = RenderOptions(family=Family.WARP, lip_sync=LipSync.VISEMES, first_chunk_frames=16)
    output = OutputSpec(resolution="512", preview=True)
    reference = Pipeline(build_family()).start_session(portrait, output, ArrayAudio(spoken.samples)).reference
    store = LocalStore(tmp_path)
    writer, audio = LiveAudioWriter(store, "live"), LiveAudio(store, "live")
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(portrait, output, audio, reference=reference)
    planner = IncrementalPlanner(n_frames=40, i_frames=4, first_frames=16)
    hashes: dict[int, list[str]] = {}
    pcm = np.round(spoken.samples * 32768).astype("<i2")
    for offset in range(0, len(pcm) + 1600, 1600):
        ended = offset >= len(pcm)
        stored = writer.finish() if ended else writer.append(pcm[offset : offset + 1600])
        audio.update(stored, ended)
        available = live_frames(stored, options, ended=ended)
        for chunk in planner.advance(available, final=ended):
            hashes[chunk.first_frame] = pipeline.run_chunk(
                session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()
            ).frame_hashes
    live_hashes = [digest for start in sorted(hashes) for digest in hashes[start]]
    assert len(live_hashes) == len(spoken.samples) * FPS // AUDIO_RATE
    assert live_hashes == _render_with_first_chunk(portrait, spoken, output, 16)


def _render_with_first_chunk(portrait: np.ndarray, spoken: Spoken, output: OutputSpec, first: int) -> list[str]:
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(portrait, output, ArrayAudio(spoken.samples))
    total = len(spoken.samples) * FPS // AUDIO_RATE
    results = {
        chunk.first_frame: pipeline.run_chunk(
            session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()
        ).frame_hashes
        for chunk in plan_chunks(total, n_frames=40, i_frames=4, first_frames=first)
    }
    return [digest for start in sorted(results) for digest in results[start]]


def test_a_node_that_never_saw_the_session_resumes_it_with_the_same_frames(
    portrait: np.ndarray, spoken: Spoken
) -> None:
    """A fresh family (its own decoder) and an empty phone cache, from the checkpointed anchors only."""
    output = OutputSpec(resolution="512", preview=True)
    total = len(spoken.samples) * FPS // AUDIO_RATE
    order = plan_chunks(total, n_frames=40, i_frames=4)
    first = Pipeline(build_family())
    session = first.start_session(portrait, output, ArrayAudio(spoken.samples))
    for chunk in order[:3]:  # N0 N1 I0
        first.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink())
    checkpoint = session.anchors.export()
    originals = [
        first.run_chunk(session, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()).frame_hashes
        for chunk in order[3:]
    ]

    WINDOW_CACHE.clear()
    second = Pipeline(build_family())
    resumed = second.start_session(portrait, output, ArrayAudio(spoken.samples), reference=session.reference)
    resumed.anchors.restore({name: value.copy() for name, value in checkpoint.items()})
    again = [
        second.run_chunk(resumed, ChunkRequest(chunk, lip_sync=LipSync.VISEMES), _ListSink()).frame_hashes
        for chunk in order[3:]
    ]
    assert again == originals and len(again) >= 3


def test_a_window_s_phones_depend_on_its_samples_alone(spoken: Spoken) -> None:
    """Decoded after other windows, by a new decoder, cached or not: the same phones (PocketSphinx keeps a noise
    estimate between utterances; the recogniser resets it)."""
    shared = PhoneRecogniser(cache=WindowCache(capacity=0))
    length = shared.windows.window_samples
    starts = range(AUDIO_RATE // 2, len(spoken.samples) - length, 2 * length)  # windows of the words
    in_order = [shared.window(spoken.samples[s : s + length]) for s in starts]
    backwards = [shared.window(spoken.samples[s : s + length]) for s in reversed(starts)][::-1]
    fresh = PhoneRecogniser(cache=WindowCache(capacity=0)).window(spoken.samples[starts[-1] : starts[-1] + length])
    cached = PhoneRecogniser(cache=WindowCache())
    twice = [cached.window(spoken.samples[s : s + length]) for s in list(starts) * 2]

    assert len(in_order) >= 3
    assert all(np.array_equal(a, b) for a, b in zip(in_order, backwards, strict=True))
    assert np.array_equal(in_order[-1], fresh)
    assert all(np.array_equal(a, b) for a, b in zip(in_order * 2, twice, strict=True))
    assert cached.decoded == len(in_order)  # the second round came from the cache
    heard = {PHONES[phone] for phones in in_order for phone in phones}
    assert {"M", "B", "UW", "IY"} <= heard  # and it hears speech, not silence
    silent = shared.window(np.zeros(length, dtype=np.float32))
    assert not silent.any()


@pytest.mark.parametrize("fps", [24, 25, 30, 60])
def test_the_live_planner_waits_for_exactly_the_audio_a_chunk_reads(fps: int) -> None:
    """`live_samples_needed` (the live planner's rule, in workflow code) covers what the warp family's context
    reads for any chunk ending there, and is no more than what some chunk ending there reads plus 0.1 s."""
    context = build_family().context
    options = RenderOptions(lip_sync=LipSync.VISEMES, fps=fps)
    for end in range(1, 4 * fps):
        reads = [
            context.audio_range(
                ChunkRequest(Chunk(ChunkKind.N, 0, end - n, n), lip_sync=LipSync.VISEMES), fps, AUDIO_RATE
            )[1]
            for n in (1, 16, 40)
            if n <= end
        ]
        needed = live_samples_needed(end, options)
        assert max(reads) <= needed
        assert needed <= max(max(reads), -(-end * AUDIO_RATE // fps) + AUDIO_RATE // 10)


def test_a_decode_interrupted_mid_utterance_leaves_the_recogniser_working(spoken: Spoken) -> None:
    """A cancelled activity can leave the decoder inside an utterance: the next window still decodes, to the same
    phones as on a fresh recogniser."""
    interrupted = PhoneRecogniser(cache=WindowCache(capacity=0))
    middle = spoken.samples.size // 2  # speech, not silence (which is never decoded)
    window = spoken.samples[middle : middle + interrupted.windows.window_samples]
    expected = PhoneRecogniser(cache=WindowCache(capacity=0)).window(window)
    assert expected.any()
    interrupted.load().start_utt()  # as if an exception landed after start_utt
    assert np.array_equal(interrupted.window(window), expected)
