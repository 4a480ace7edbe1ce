"""The warp family, driven through the real Pipeline the way a render node drives it: a portrait and real
speech in, chunks in generation order N0 N1 I0 N2 I1 …, frames out."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from gpu_worker.models.warp import build_family, parameters as p
from gpu_worker.models.warp.layout import Layout
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline, SuperResolution
from gpu_worker.pipeline.module import Reference
from gpu_worker.pipeline.pipeline import Session
from monologue.contracts import Chunk, LipSync
from monologue.media import decode_wav, normalise_audio

RATE = 16_000
FPS = 25
SAMPLES_PER_FRAME = RATE // FPS
SPEECH_WAV = Path(__file__).resolve().parents[3] / "monologue" / "samples" / "speech.wav"
# The sample's exact silence, 3.443-4.443 s, in frames.
SILENCE_FRAMES = (87, 111)
LONG_TEXT = (
    "Good morning everyone, and thank you for joining me today. I would like to tell you a short story about a "
    "small town by the sea. Every morning the fishermen would sail out before sunrise, and every evening they "
    "would return with stories of the wind and the waves. The children would run down to the harbour to meet "
    "them, shouting and laughing, while the old sailors mended their nets. It was a quiet life, but a happy one."
)


def _plan(
    total_frames: int, seed: int = 0, n_frames: int = 40, i_frames: int = 4, lip_sync: LipSync = LipSync.VISEMES
) -> list[ChunkRequest]:
    """Chunks in generation order (N0 N1 I0 N2 I1 …): N chunks of n_frames, I chunks of i_frames between them."""
    timeline: list[ChunkRequest] = []
    first, index = 0, 0
    while first < total_frames:
        size = min(n_frames, total_frames - first)
        timeline.append(ChunkRequest(Chunk("N", index, first, size), seed, lip_sync=lip_sync))
        first += size
        gap = min(i_frames, total_frames - first - 1)  # leave at least one frame for the next N chunk
        if gap > 0:
            timeline.append(ChunkRequest(Chunk("I", index, first, gap), seed, lip_sync=lip_sync))
            first += gap
        index += 1
    n_chunks = [chunk for chunk in timeline if chunk.kind == "N"]
    i_chunks = {chunk.index: chunk for chunk in timeline if chunk.kind == "I"}
    order: list[ChunkRequest] = []
    for chunk in n_chunks:
        order.append(chunk)
        if chunk.index - 1 in i_chunks:
            order.append(i_chunks[chunk.index - 1])
    return order


class _ListSink:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(frames.copy())


class _RecordingRenderer(SuperResolution):
    """Passes through to the family's renderer, keeping each chunk's latents so tests can read the motion."""

    def __init__(self, inner: SuperResolution) -> None:
        super().__init__()
        self.inner = inner
        self.latents: list[np.ndarray] = []

    def upscale(self, reference: Reference, latents: np.ndarray) -> np.ndarray:
        self.latents.append(np.array(latents, copy=True))
        frames: np.ndarray = self.inner.upscale(reference, latents)
        return frames


@dataclass
class Render:
    session: Session
    chunks: list[ChunkRequest]  # timeline order
    frames: np.ndarray  # (T, H, W, 3) uint8, timeline order
    latents: np.ndarray  # (T, PARAMETER_COUNT), timeline order
    hashes: list[str]  # timeline order


def _render(
    portrait: np.ndarray,
    audio: np.ndarray,
    output: OutputSpec,
    seed: int = 0,
    total_frames: int | None = None,
    lip_sync: LipSync = LipSync.VISEMES,
    transcript: str = "",
    n_frames: int = 40,
    i_frames: int = 4,
) -> Render:
    family = build_family()
    recorder = _RecordingRenderer(family.super_resolution)
    family.super_resolution = recorder
    pipeline = Pipeline(family)
    session = pipeline.start_session(portrait, output, ArrayAudio(audio))
    if transcript:
        pipeline.prepare_speech(session, transcript)
    total = total_frames if total_frames is not None else len(audio) * output.fps // RATE
    order = _plan(total, seed, n_frames, i_frames, lip_sync=lip_sync)
    frames, hashes = {}, {}
    for chunk in order:
        sink = _ListSink()
        result = pipeline.run_chunk(session, chunk, sink)
        frames[chunk.first_frame] = np.concatenate(sink.frames)
        hashes[chunk.first_frame] = result.frame_hashes
    latents = dict(zip([chunk.first_frame for chunk in order], recorder.latents, strict=True))
    starts = sorted(frames)
    return Render(
        session=session,
        chunks=sorted(order, key=lambda chunk: chunk.first_frame),
        frames=np.concatenate([frames[start] for start in starts]),
        latents=np.concatenate([latents[start] for start in starts]),
        hashes=[digest for start in starts for digest in hashes[start]],
    )


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return decode_wav(SPEECH_WAV.read_bytes())


@pytest.fixture(scope="module")
def portrait() -> np.ndarray:
    image: np.ndarray = data.astronaut()  # type: ignore[no-untyped-call]  # (512, 512, 3) uint8
    return image


@pytest.fixture(scope="module")
def sample_render(portrait: np.ndarray, speech: np.ndarray) -> Render:
    return _render(portrait, speech, OutputSpec(resolution="512"))


@pytest.fixture(scope="session")
def long_speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About 25 s of real (synthesised) speech from espeak-ng, normalised like an upload."""
    program = shutil.which("espeak-ng")
    if program is None:
        # A failure, not a skip: a skip would let CI pass without the seam, blink and sway checks.
        pytest.fail("espeak-ng is not installed (apt-get install espeak-ng; infra/test.sh installs it)")
    path = tmp_path_factory.mktemp("speech") / "long.wav"
    subprocess.run([program, "-v", "en-us", "-s", "165", "-w", str(path), LONG_TEXT], check=True, capture_output=True)
    samples: np.ndarray = decode_wav(normalise_audio(path.read_bytes()).wav)
    return samples


@pytest.fixture(scope="module")
def long_render(portrait: np.ndarray, long_speech: np.ndarray) -> Render:
    # Preview of "512" (256x256): the motion is the same as full quality and the render is cheap.
    return _render(portrait, long_speech, OutputSpec(resolution="512", preview=True))


def _layout(render: Render) -> Layout:
    return Layout.from_array(render.session.reference["layout"])


def _frame_rms(audio: np.ndarray, n_frames: int) -> np.ndarray:
    padded = np.zeros(n_frames * SAMPLES_PER_FRAME, dtype=np.float64)
    usable = min(len(audio), padded.size)
    padded[:usable] = audio[:usable]
    rms: np.ndarray = np.sqrt((padded.reshape(n_frames, SAMPLES_PER_FRAME) ** 2).mean(axis=1))  # (T,)
    return rms


def _mouth_box(layout: Layout) -> tuple[slice, slice]:
    half = 1.2 * layout.mouth_half_width
    return (
        slice(round(layout.mouth_y - 0.12 * layout.face_height), round(layout.mouth_y + 0.16 * layout.face_height)),
        slice(round(layout.mouth_x - half), round(layout.mouth_x + half)),
    )


def _aligned_change(frame: np.ndarray, portrait: np.ndarray, rows: slice, columns: slice) -> float:
    """Mean grey-level change of a region against the portrait's, after undoing the head's sway (a small
    rotation and shift, found by ECC alignment); what remains is what the face itself did."""
    still = cv2.cvtColor(portrait[rows, columns], cv2.COLOR_RGB2GRAY).astype(np.float32)
    moved = cv2.cvtColor(frame[rows, columns], cv2.COLOR_RGB2GRAY).astype(np.float32)
    criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 100, 1e-5)
    _, warp = cv2.findTransformECC(still, moved, np.eye(2, 3, dtype=np.float32), cv2.MOTION_EUCLIDEAN, criteria)
    aligned = cv2.warpAffine(moved, warp, still.shape[::-1], flags=cv2.INTER_LINEAR + cv2.WARP_INVERSE_MAP)
    return float(np.abs(aligned - still)[4:-4, 4:-4].mean())


def test_mouth_opening_follows_the_speech_envelope_with_the_lips_at_most_a_frame_early(
    sample_render: Render, speech: np.ndarray
) -> None:
    opening = sample_render.latents[:, p.OPENING].astype(np.float64)
    envelope = _frame_rms(speech, len(opening))
    correlations = {}
    for lag in range(-3, 4):  # opening[t] against envelope[t + lag]
        a = opening[max(0, -lag) : len(opening) - max(0, lag)]
        b = envelope[max(0, lag) : len(envelope) - max(0, -lag)]
        correlations[lag] = float(np.corrcoef(a, b)[0, 1])
    best = max(correlations, key=lambda lag: correlations[lag])
    # docs/benchmarks.md cites this line (shown by `pytest -rP`).
    print(f"mouth vs loudness: best lag {best} frames, r = {correlations[best]:.2f}")

    assert best in (-1, 0, 1), correlations
    assert correlations[best] > 0.6, correlations
    # The frames show it: dark pixels between the lips track the opening.
    rows, columns = _mouth_box(_layout(sample_render))
    grey = sample_render.frames[:, rows, columns].astype(np.float64).mean(axis=3)
    dark = (grey < 70).sum(axis=(1, 2))
    assert np.corrcoef(dark, opening)[0, 1] > 0.8


def test_silence_closes_the_mouth_within_three_frames(sample_render: Render) -> None:
    first, last = SILENCE_FRAMES
    closed = range(first + 3, last - 2)  # the lips may part a frame before the next word
    opening = sample_render.latents[:, p.OPENING]
    portrait = sample_render.session.reference["portrait"]
    rows, columns = _mouth_box(_layout(sample_render))

    def mouth_change(frame: int) -> float:
        return float(
            np.abs(sample_render.frames[frame, rows, columns].astype(np.int16) - portrait[rows, columns]).mean()
        )

    assert all(opening[frame] == 0.0 for frame in closed)
    assert opening[first - 8 : first].max() > 0.2  # it was speaking just before
    speaking = max(mouth_change(frame) for frame in range(first - 30, first))
    silent = max(_aligned_change(sample_render.frames[frame], portrait, rows, columns) for frame in closed)
    # What is left once the sway is undone is resampling blur on the teeth's edges, a few grey levels.
    assert silent < min(6.0, speaking / 5)


def test_background_outside_the_head_mask_is_the_portrait_in_every_frame(sample_render: Render) -> None:
    reference = sample_render.session.reference
    x0, y0, x1, y1 = (int(value) for value in reference["head_box"])
    still = np.ones(reference["portrait"].shape[:2], dtype=bool)
    still[y0:y1, x0:x1] = reference["head_mask"] == 0.0

    assert still.mean() > 0.5  # most of a 512 frame of this portrait is background
    assert np.array_equal(
        sample_render.frames[:, still],
        np.broadcast_to(reference["portrait"][still], sample_render.frames[:, still].shape),
    )
    # and the head does move
    assert not np.array_equal(
        sample_render.frames[:, ~still],
        np.broadcast_to(reference["portrait"][~still], sample_render.frames[:, ~still].shape),
    )


def _frame_changes(render: Render) -> np.ndarray:
    """Mean absolute change of each frame t → t + 1, (T-1,)."""
    changes: np.ndarray = np.abs(np.diff(render.frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    return changes


def _seam_ratios(render: Render) -> dict[str, tuple[float, int]]:
    """Per kind of seam (N→I, I→N; N→N without I chunks): the mean frame change across it over the mean change
    inside chunks, and how many there are."""
    difference = _frame_changes(render)
    kind_at = np.empty(len(render.frames), dtype="<U1")
    starts = set()
    for chunk in render.chunks:
        kind_at[chunk.first_frame : chunk.end_frame] = chunk.kind
        starts.add(chunk.first_frame)
    seams: dict[str, list[float]] = {}
    within: list[float] = []
    for frame in range(len(difference)):
        if frame + 1 in starts:
            seams.setdefault(f"{kind_at[frame]}→{kind_at[frame + 1]}", []).append(float(difference[frame]))
        else:
            within.append(float(difference[frame]))
    return {name: (float(np.mean(values) / np.mean(within)), len(values)) for name, values in seams.items()}


def test_chunk_seams_are_as_smooth_as_the_motion_inside_chunks(long_render: Render) -> None:
    assert len(long_render.frames) >= 20 * FPS
    ratios = _seam_ratios(long_render)
    # docs/benchmarks.md cites these ratios (shown by `pytest -rP`).
    print(", ".join(f"{name} seam/within {ratio:.2f}" for name, (ratio, _count) in ratios.items()))
    assert ratios.keys() == {"N→I", "I→N"}
    for name, (ratio, count) in ratios.items():
        assert count >= 10, name
        assert ratio <= 1.5, (name, ratio)


@pytest.mark.parametrize(("n_frames", "i_frames"), [(8, 2), (6, 0), (4, 0)])
def test_small_live_chunks_have_seams_as_smooth_and_move_no_rougher_than_long_ones(
    portrait: np.ndarray, long_speech: np.ndarray, long_render: Render, n_frames: int, i_frames: int
) -> None:
    """WebRTC's small chunks (api/routes/sessions.py `WEBRTC_CHUNKS`): many more seams, each as smooth as the
    motion inside chunks, and the video as a whole changes from frame to frame as today's long chunks' does."""
    small = _render(
        portrait, long_speech, OutputSpec(resolution="512", preview=True), n_frames=n_frames, i_frames=i_frames
    )
    ratios = _seam_ratios(small)
    # docs/benchmarks.md cites these (shown by `pytest -rP`).
    print(
        f"{n_frames}/{i_frames}: "
        + ", ".join(f"{name} seam/within {ratio:.2f}" for name, (ratio, _c) in ratios.items())
    )
    assert sum(count for _ratio, count in ratios.values()) >= len(small.frames) // (n_frames + i_frames) - 1
    for name, (ratio, _count) in ratios.items():
        assert ratio <= 1.5, (name, ratio)
    today, now = _frame_changes(long_render), _frame_changes(small)
    assert now.mean() <= 1.05 * today.mean() and np.percentile(now, 95) <= 1.05 * np.percentile(today, 95)


def test_blinks_come_every_few_seconds_and_close_the_eyelids(long_render: Render, sample_render: Render) -> None:
    closure = long_render.latents[:, p.BLINK]
    began = np.flatnonzero((closure[1:] > 0) & (closure[:-1] == 0)) + 1
    seconds = len(closure) / FPS

    assert len(began) >= int(seconds // 10)
    assert np.diff(began).min() >= FPS  # never more often than once a second
    lengths = [np.flatnonzero(closure[start:] == 0)[0] for start in began[:-1]]
    assert all(3 <= length <= 7 for length in lengths)  # 120-280 ms at 25 fps
    # The eyelids visibly cover the eyes at the peak of a blink (the sample's 6.9 s always has one: the
    # first blink comes within 6 s), far more than anything else changes them.
    closure = sample_render.latents[:, p.BLINK]
    peak = int(np.argmax(closure))
    assert closure[peak] > 0.9
    layout = _layout(sample_render)
    portrait = sample_render.session.reference["portrait"]
    reach = 1.6 * layout.eye_half_width
    for eye_x, eye_y in ((layout.left_eye_x, layout.left_eye_y), (layout.right_eye_x, layout.right_eye_y)):
        rows = slice(round(eye_y - reach), round(eye_y + reach))
        columns = slice(round(eye_x - reach), round(eye_x + reach))
        open_eyes = [
            _aligned_change(sample_render.frames[frame], portrait, rows, columns)
            for frame in np.flatnonzero(closure == 0)[::8]
        ]
        assert _aligned_change(sample_render.frames[peak], portrait, rows, columns) > 3 * np.median(open_eyes)


def test_the_head_sways_a_little_and_never_far(long_render: Render) -> None:
    latents = long_render.latents
    layout = _layout(long_render)
    roll_degrees = np.degrees(latents[:, p.ROLL])
    # The crown is about 1.7 face heights from the pivot at the base of the neck.
    crown_shift = np.abs(latents[:, p.ROLL]) * 1.7 + np.hypot(latents[:, p.SHIFT_X], latents[:, p.SHIFT_Y])

    assert np.abs(roll_degrees).max() <= 2.0
    assert roll_degrees.std() > 0.1
    assert crown_shift.max() <= 0.06  # face heights: a few per cent of the face
    # Sway moves pixels even when the mouth is shut and the eyes open.
    still = np.flatnonzero((latents[:, p.OPENING] == 0) & (latents[:, p.BLINK] == 0))
    top = round(layout.face_y)
    hair = long_render.frames[still][:, max(0, top - round(0.3 * layout.face_height)) : top]
    assert np.abs(np.diff(hair.astype(np.int16), axis=0)).max() > 0


def test_same_seed_repeats_exactly_and_another_seed_moves_differently_with_the_same_mouth(
    portrait: np.ndarray, speech: np.ndarray, sample_render: Render
) -> None:
    again = _render(portrait, speech, OutputSpec(resolution="512"), seed=0)
    other = _render(portrait, speech, OutputSpec(resolution="512"), seed=1)

    assert again.hashes == sample_render.hashes
    assert other.hashes != sample_render.hashes
    mouth = [p.OPENING, p.WIDTH]
    idle = [p.ROLL, p.SHIFT_X, p.SHIFT_Y, p.BLINK]
    assert np.array_equal(other.latents[:, mouth], sample_render.latents[:, mouth])
    assert not np.allclose(other.latents[:, idle], sample_render.latents[:, idle])


def test_chunks_regenerated_from_saved_anchors_are_identical(portrait: np.ndarray, speech: np.ndarray) -> None:
    """A resumed session (anchors restored from a checkpoint) regenerates I0 and N2 bit for bit."""
    output = OutputSpec(resolution="512", preview=True)
    order = _plan(len(speech) * FPS // RATE)
    pipeline = Pipeline(build_family())
    first = pipeline.start_session(portrait, output, ArrayAudio(speech))
    for chunk in order[:2]:  # N0 N1
        pipeline.run_chunk(first, chunk, _ListSink())
    checkpoint = first.anchors.export()
    originals = [pipeline.run_chunk(first, chunk, _ListSink()).frame_hashes for chunk in order[2:4]]  # I0 N2

    resumed = pipeline.start_session(portrait, output, ArrayAudio(speech), reference=first.reference)
    resumed.anchors.restore({name: value.copy() for name, value in checkpoint.items()})
    again = [pipeline.run_chunk(resumed, chunk, _ListSink()).frame_hashes for chunk in order[2:4]]

    assert [chunk.name for chunk in order[2:4]] == ["I0", "N2"]
    assert again == originals


def test_preview_moves_exactly_like_full_quality_at_half_the_size(
    portrait: np.ndarray, speech: np.ndarray, sample_render: Render
) -> None:
    preview = _render(portrait, speech, OutputSpec(resolution="512", preview=True))

    assert np.array_equal(preview.latents, sample_render.latents)
    assert preview.frames.shape[1:] == (256, 256, 3)
    assert sample_render.frames.shape[1:] == (512, 512, 3)
