"""Captions burned into the frames (`captions=burn`): the text of the cue shown at each frame's time, white with a
dark outline, centred near the bottom, wrapped to the frame's width and sized to its short side.

Text goes through Pillow's FreeType rendering of DejaVu Sans, from Debian's fonts-dejavu-core (installed in the node
images: the same file on every node; Latin, Greek and Cyrillic scripts; nothing downloaded). Pillow's own scalable
font (`ImageFont.load_default(size=…)`) has ASCII glyphs only: "café" would show a box. Each cue is rasterised once
into two 8-bit masks (outline, fill) and blended into the frames with integer arithmetic, so the same cues on the same
frames give the same bytes (frames are hashed and compared across nodes and resumes). A frame outside every cue is
left as the family made it, byte for byte. numpy and Pillow only; never called from the workflow or the API."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from monologue.captions import Cue

FONT_FILE = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")  # Debian's fonts-dejavu-core
_SIZE_OF_SHORT_SIDE = 0.055  # font size (px) per pixel of the frame's short side: ~28 px at 512, ~40 px at 720p
_MIN_SIZE = 10
_BOTTOM_MARGIN = 0.06  # of the frame height, between the text's last line and the bottom edge
_SIDE_MARGIN = 0.05  # of the frame width, each side, that the text keeps clear of
_LINE_SPACING = 0.2  # of the font size, between lines


@dataclass(frozen=True)
class _Overlay:
    """One cue rasterised: where it goes in the frame and its two masks, (h, w) uint8 each."""

    top: int
    left: int
    outline: np.ndarray  # the text with its stroke: drawn dark first
    fill: np.ndarray  # the glyphs alone: drawn white over it


class CaptionBurner:
    """Draws a session's cues into its frames; one per session (it keeps each cue's masks once drawn)."""

    def __init__(self, cues: Sequence[Cue], *, fps: int, width: int, height: int) -> None:
        self._cues = tuple(sorted(cues, key=lambda cue: cue.start_s))
        self._starts = [cue.start_s for cue in self._cues]
        self._fps, self._width, self._height = fps, width, height
        size = max(_MIN_SIZE, round(min(width, height) * _SIZE_OF_SHORT_SIDE))
        if not FONT_FILE.is_file():
            raise RuntimeError(
                f"captions=burn: this node has no {FONT_FILE} (Debian's fonts-dejavu-core, in the node images); "
                "install it, or render with captions=files"
            )
        self._font = ImageFont.truetype(FONT_FILE, size)
        self._stroke = max(1, round(size / 12))
        self._spacing = round(size * _LINE_SPACING)
        self._overlays: dict[int, _Overlay] = {}

    def cue_at(self, frame: int) -> int | None:
        """The index of the cue shown at absolute frame `frame` (time frame / fps; a cue shows from its start up to,
        not including, its end), or None."""
        seconds = frame / self._fps
        index = bisect.bisect_right(self._starts, seconds) - 1  # the last cue that starts by then (cues never overlap)
        return index if index >= 0 and seconds < self._cues[index].end_s else None

    def burn(self, frames: np.ndarray, first_frame: int) -> np.ndarray:
        """`frames` (T, H, W, 3) uint8, the first at absolute frame `first_frame`, with their cues drawn in: a new
        array when any frame shows a cue (the input may be a model's reused buffer), `frames` itself otherwise."""
        shown = [(offset, self.cue_at(first_frame + offset)) for offset in range(len(frames))]
        if all(index is None for _, index in shown):
            return frames
        out = frames.copy()
        for offset, index in shown:
            if index is not None:
                self._draw(out[offset], self._overlay(index))
        return out

    def _overlay(self, index: int) -> _Overlay:
        if index not in self._overlays:
            self._overlays[index] = self._rasterise(self._cues[index].text)
        return self._overlays[index]

    def _rasterise(self, text: str) -> _Overlay:
        lines = "\n".join(self._wrap(text))
        probe = ImageDraw.Draw(Image.new("L", (1, 1)))
        left, top, right, bottom = (
            math.floor(edge) if number < 2 else math.ceil(edge)  # Pillow may give fractions: take whole pixels around
            for number, edge in enumerate(
                probe.multiline_textbbox(
                    (0, 0), lines, font=self._font, spacing=self._spacing, align="center", stroke_width=self._stroke
                )
            )
        )
        box = (right - left, bottom - top)
        masks = []
        for stroke in (self._stroke, 0):  # the outline (glyphs with their stroke), then the glyphs alone
            mask = Image.new("L", box, 0)
            ImageDraw.Draw(mask).multiline_text(
                (-left, -top),
                lines,
                font=self._font,
                fill=255,
                spacing=self._spacing,
                align="center",
                stroke_width=stroke,
                stroke_fill=255,
            )
            masks.append(np.asarray(mask, dtype=np.uint8))
        frame_top = self._height - round(self._height * _BOTTOM_MARGIN) - box[1]
        frame_left = (self._width - box[0]) // 2
        return _clip(_Overlay(frame_top, frame_left, masks[0], masks[1]), self._width, self._height)

    def _wrap(self, text: str) -> list[str]:
        """The cue's own lines, each wrapped again at word boundaries where it is wider than the frame allows (a
        word wider than that stands alone, clipped at the frame's edges)."""
        room = self._width * (1 - 2 * _SIDE_MARGIN)
        wrapped: list[str] = []
        for line in text.split("\n"):
            current = ""
            for word in line.split():
                candidate = f"{current} {word}" if current else word
                if current and self._font.getlength(candidate) > room:
                    wrapped.append(current)
                    candidate = word
                current = candidate
            if current:
                wrapped.append(current)
        return wrapped

    @staticmethod
    def _draw(frame: np.ndarray, overlay: _Overlay) -> None:
        """Blend the overlay into `frame` (H, W, 3) in place: black through the outline mask, then white through the
        fill mask; integer arithmetic, rounded half up."""
        height, width = overlay.fill.shape
        region = frame[overlay.top : overlay.top + height, overlay.left : overlay.left + width].astype(np.uint32)
        outline = overlay.outline[..., None].astype(np.uint32)  # (h, w, 1)
        fill = overlay.fill[..., None].astype(np.uint32)
        region = (region * (255 - outline) + 127) // 255  # towards black
        region = (region * (255 - fill) + 255 * fill + 127) // 255  # towards white
        frame[overlay.top : overlay.top + height, overlay.left : overlay.left + width] = region.astype(np.uint8)


def _clip(overlay: _Overlay, width: int, height: int) -> _Overlay:
    """The part of the overlay inside the frame (a cue taller or wider than the frame loses its edges)."""
    top, left = max(0, overlay.top), max(0, overlay.left)
    rows = slice(top - overlay.top, min(overlay.fill.shape[0], height - overlay.top))
    cols = slice(left - overlay.left, min(overlay.fill.shape[1], width - overlay.left))
    return _Overlay(top, left, overlay.outline[rows, cols], overlay.fill[rows, cols])
