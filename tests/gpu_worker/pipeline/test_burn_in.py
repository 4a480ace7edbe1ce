"""Burned-in captions through the real pipeline (the warp family on the CPU, `DecodePublishStage`): only the frames a
cue covers change, only in the band near the bottom where its text is drawn (bright glyphs in a dark outline), and
the same cues give the same bytes again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_worker.models.warp import build_family
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.pipeline.burn_in import CaptionBurner
from monologue.captions import Cue
from monologue.contracts import RenderOptions
from monologue.media import decode_wav
from monologue.plan import chunk_sizes, plan_chunks

SPEECH_WAV = Path(__file__).resolve().parents[3] / "monologue" / "samples" / "speech.wav"
CUES = (Cue(0.4, 1.0, "Hello there"), Cue(1.0, 1.64, "A second cue, long enough to wrap\non a small frame"))
OPTIONS = RenderOptions(preview=True)  # 256 x 256 frames from the 512 x 512 portrait
SECONDS = 2.2


class _Frames:
    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []

    def write(self, frames: np.ndarray) -> None:
        self.frames.append(frames.copy())


def _render(portrait: np.ndarray, speech: np.ndarray, cues: tuple[Cue, ...]) -> np.ndarray:
    """(T, H, W, 3) uint8 frames in timeline order, with `cues` burned in (none: the plain frames)."""
    pipeline = Pipeline(build_family())
    session = pipeline.start_session(portrait, OutputSpec.of(OPTIONS), ArrayAudio(speech))
    if cues:
        size = {"width": session.frame_width, "height": session.frame_height}
        session.captions = CaptionBurner(cues, fps=OPTIONS.fps, **size)
    total = int(SECONDS * OPTIONS.fps)
    made = {}
    for chunk in plan_chunks(total, **chunk_sizes(OPTIONS)):
        sink = _Frames()
        pipeline.run_chunk(session, ChunkRequest.of(chunk, OPTIONS), sink)
        made[chunk.first_frame] = np.concatenate(sink.frames)
    return np.concatenate([made[first] for first in sorted(made)])


@pytest.fixture(scope="module")
def renders() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from skimage import data

    portrait: np.ndarray = data.astronaut()  # type: ignore[no-untyped-call]  # (512, 512, 3) uint8
    speech = decode_wav(SPEECH_WAV.read_bytes())[: int(SECONDS * 16_000)]
    return _render(portrait, speech, ()), _render(portrait, speech, CUES), _render(portrait, speech, CUES)


def test_burned_frames_differ_only_in_the_bottom_band_under_a_cue_and_repeat_exactly(
    renders: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    plain, burned, again = renders
    assert burned.shape == plain.shape and np.array_equal(burned, again)  # deterministic: the same bytes
    height = plain.shape[1]
    fps = OPTIONS.fps
    for frame in range(len(plain)):
        cue = next((cue for cue in CUES if cue.start_s <= frame / fps < cue.end_s), None)
        changed_rows = np.flatnonzero((burned[frame] != plain[frame]).any(axis=(1, 2)))
        if cue is None:
            assert changed_rows.size == 0, f"frame {frame} is outside every cue yet changed"
            continue
        assert changed_rows.size > 0, f"frame {frame} is under {cue.text!r} yet unchanged"
        assert changed_rows.min() >= height // 2, f"frame {frame}: the caption reaches row {changed_rows.min()}"
        band = burned[frame, changed_rows.min() :]
        bright = (band.min(axis=2) >= 235) & (plain[frame, changed_rows.min() :].min(axis=2) < 235)
        dark = band.max(axis=2) <= 20
        assert bright.sum() > 50 and dark.sum() > 50, f"frame {frame}: white glyphs in a dark outline"


def test_a_cue_wider_than_the_frame_wraps_onto_more_lines() -> None:
    """Each of the cue's lines is wrapped again at the frame's width: a narrow frame gets more, shorter lines."""
    text = "A second cue, long enough to wrap\non a small frame"
    narrow = CaptionBurner([Cue(0, 1, text)], fps=25, width=160, height=256)
    wide = CaptionBurner([Cue(0, 1, text)], fps=25, width=1280, height=256)
    frames = {name: np.zeros((1, 256, burner_width, 3), np.uint8) for name, burner_width in (("n", 160), ("w", 1280))}
    rows = {}
    for name, burner in (("n", narrow), ("w", wide)):
        out = burner.burn(frames[name], 0)
        rows[name] = np.flatnonzero(out[0].any(axis=(1, 2)))
        assert (out[0, :, :2] == 0).all() and (out[0, :, -2:] == 0).all()  # within the side margins
    assert rows["n"].size > rows["w"].size  # more lines of text


def test_accented_and_cyrillic_letters_are_drawn_not_boxes() -> None:
    """Captions of a French or Russian voice: each letter has its own glyph, not the font's box for a missing one."""
    shapes = {}
    for letter in ("é", "ß", "Ж", "\ue000"):  # the last is a private-use character: no font has it (the box)
        burner = CaptionBurner([Cue(0, 1, letter)], fps=25, width=256, height=256)
        shapes[letter] = burner.burn(np.zeros((1, 256, 256, 3), np.uint8), 0).tobytes()
    assert len(set(shapes.values())) == 4
