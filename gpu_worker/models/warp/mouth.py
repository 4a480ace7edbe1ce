"""The mouth: drop the jaw, spread or round the lips, and show the inner mouth between them.

The lower face is warped so that the line between the lips tears open into a lens-shaped gap (the lower
lip and chin move down, the corners follow halfway, the cheeks stretch smoothly), and the gap is filled
from the session's fixed inner-mouth texture (teeth under the upper lip, a dark cavity behind), which is
anchored to the upper lip so the teeth never swim or flicker.

Viseme shapes move the portrait's own lips in the same warp: pressed lips (m, b, p) stretch the upper lip
down over any teeth the portrait shows until it meets the lower lip, and thin both; a tucked lower lip (f, v)
rises under the upper teeth; puckered lips (oo, oh) pull the corners in and look fuller, pushed forward.
All of it stays inside the head's support, so the background never changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from gpu_worker.models.warp.layout import Layout


@dataclass(frozen=True)
class MouthShape:
    # How far the lower lip drops at opening 1, in face heights: a wide "ah" in conversational speech.
    max_drop: float = 0.085
    # The chin sits this far below the lip line and moves rigidly with the jaw; below it the neck absorbs
    # the motion over `neck_span` (face heights), so the collar never moves.
    chin_below_mouth: float = 0.27
    neck_span: float = 0.33
    # The jaw warp's box: out to the jaw line either side, up to below the nose.
    jaw_half_width: float = 0.62  # face heights
    above_mouth: float = 0.30  # face heights
    # The cheeks stretch over this span either side of the lip line, so no row ever tears outside the gap.
    cheek_span: float = 0.16
    # Under the lips the jaw moves as one; beyond this many lip half-widths it fades out to the box edge.
    rigid_half_width: float = 1.6
    # The opening is narrower than the closed lips: the corners stay closed.
    cavity_width: float = 0.85
    # Lip shape: corners move out by this share of the lips' half-width at width +1 ("ee"), in at -1 ("oo").
    spread: float = 0.12
    rounding: float = 0.20
    # Spreading affects the lips and a little of the cheeks: full within `lip_band` of the lip line,
    # gone `lip_fade` further (face heights).
    lip_band: float = 0.05
    lip_fade: float = 0.15
    # Visible upper teeth under the upper lip, in face heights.
    teeth_height: float = 0.032
    # The lips' edge softness in pixels per face height, never sharper than a pixel.
    feather: float = 1 / 90
    # A trace of the lips shows through the darkest cavity, as in real mouths where nothing is pure black.
    cavity_opacity: float = 0.97
    # Visemes. The upper lip's height (face heights) that stretches over the teeth when the lips press; the lips
    # thin by this share when fully pressed; teeth are covered across this share of the lips' half-width.
    upper_lip: float = 0.05
    press_thinning: float = 0.12
    teeth_across: float = 1.0
    # A tucked lower lip rises this far (face heights) under the upper teeth, fading out this far below.
    tuck_rise: float = 0.025
    tuck_fade: float = 0.12
    # Puckered lips: corners in by this share of the half-width, the opening this much narrower, the lips
    # this much taller about the lip line (pushed forward, they look fuller).
    pucker_in: float = 0.18
    pucker_narrow: float = 0.3
    pucker_fuller: float = 0.15


MOUTH = MouthShape()


@dataclass(frozen=True)
class MouthPose:
    """One frame's mouth (see `parameters`): opening, width, and the viseme shapes press, tuck, pucker."""

    opening: float
    width: float
    press: float = 0.0
    tuck: float = 0.0
    pucker: float = 0.0

    @property
    def at_rest(self) -> bool:
        return self.opening <= 0.0 and self.width == 0.0 and self.press == self.tuck == self.pucker == 0.0

    @property
    def shaped(self) -> bool:
        return self.press > 0.0 or self.tuck > 0.0 or self.pucker > 0.0


def _smoothstep(values: np.ndarray) -> np.ndarray:
    """0 → 0, 1 → 1 with zero slope at both ends, so a fade has no visible crease."""
    clipped = np.clip(values, 0.0, 1.0)
    eased: np.ndarray = clipped * clipped * (3.0 - 2.0 * clipped)
    return eased


class MouthWarp:
    """Per chunk: the jaw box and its fixed profiles; per frame: warp the jaw box and fill the gap."""

    def __init__(
        self,
        layout: Layout,
        origin: tuple[int, int],
        support: np.ndarray,
        texture: np.ndarray,
        shape: MouthShape = MOUTH,
        *,
        teeth_rows: float | None = None,
    ) -> None:
        """layout in frame coordinates; origin (x0, y0) of the head crop; support (h, w) bool, True where the
        head may move (the jaw never moves anything outside it); teeth_rows, the upper teeth the portrait
        shows above the line (None: the usual height if it shows any)."""
        self._shape = shape
        self._texture = texture  # (rows, columns, 3) uint8, row 0 at the lip line
        self._texture_centre = (texture.shape[1] - 1) / 2
        face = layout.face_height
        self._face = face
        # Pixel-centre coordinates inside the crop.
        self._mouth_x = layout.mouth_x - 0.5 - origin[0]
        self._mouth_y = layout.mouth_y - 0.5 - origin[1]
        self._lips = max(layout.mouth_half_width, 1.0)
        self._rise = layout.mouth_rise
        height, width = support.shape
        x0 = max(0, int(np.floor(self._mouth_x - shape.jaw_half_width * face)))
        x1 = min(width, int(np.ceil(self._mouth_x + shape.jaw_half_width * face)) + 1)
        chin = self._mouth_y + shape.chin_below_mouth * face
        y0 = max(0, int(np.floor(self._mouth_y - shape.above_mouth * face)))
        y1 = min(height, int(np.ceil(chin + shape.neck_span * face)) + 1)
        self.box = (slice(y0, y1), slice(x0, x1))
        self._rows = np.arange(y0, y1, dtype=np.float32)  # (bh,)
        self._columns = np.arange(x0, x1, dtype=np.float32)  # (bw,)
        self._grid_x = np.broadcast_to(self._columns[None, :], (y1 - y0, x1 - x0)).astype(np.float32)
        self._grid_y = np.broadcast_to(self._rows[:, None], (y1 - y0, x1 - x0)).astype(np.float32)
        self._support = support[y0:y1, x0:x1].astype(np.float32)  # (bh, bw)

        # Horizontal falloff (bw,): rigid under the mouth, fading to zero at the box's sides.
        rigid = shape.rigid_half_width * self._lips
        edge = max(min(self._mouth_x - x0, x1 - 1 - self._mouth_x), rigid + 1.0)
        self._horizontal = 1.0 - _smoothstep((np.abs(self._columns - self._mouth_x) - rigid) / (edge - rigid))
        # The neck (bh,) fades the jaw's motion out to the box bottom; the cheek ramp (bh, bw) carries the
        # corners' share of the drop smoothly across the (curved) lip line.
        neck = 1.0 - _smoothstep((self._rows - chin) / max(y1 - 1 - chin, 1.0))
        span = max(shape.cheek_span * face, 1.0)
        self._neck = neck.astype(np.float32)
        from_line = self._rows[:, None] - self._line(self._columns)[None, :]  # (bh, bw)
        self._cheek = (_smoothstep((from_line + span) / (2 * span)) * neck[:, None]).astype(np.float32)
        # Lip spreading: a stretch about the mouth centre out to the corners, fading over the cheeks.
        across = (self._columns - self._mouth_x) / self._lips
        fade = 1.0 - _smoothstep((np.abs(across) - 1.0) / 1.2)
        self._spread_profile = np.where(np.abs(across) <= 1.0, across, np.sign(across) * fade).astype(np.float32)
        band = np.abs(from_line) - shape.lip_band * face
        self._lip_profile = (1.0 - _smoothstep(band / (shape.lip_fade * face))).astype(np.float32)
        self._from_line = from_line.astype(np.float32)  # (bh, bw) rows below the closed lip line
        # The viseme shapes act on the lips alone: full between the corners, gone just beyond them.
        self._mouth_profile = (1.0 - _smoothstep((np.abs(across) - 0.8) / 0.6)).astype(np.float32)  # (bw,)
        teeth = layout.teeth_showing * shape.teeth_height * face if teeth_rows is None else teeth_rows
        self._teeth = teeth  # visible upper teeth above the line, in rows
        self._dirty = False

    def _line(self, columns: np.ndarray) -> np.ndarray:
        """Row of the closed mouth's line per column, through the centre and both corners: flat in the middle
        and bending near the corners, as lips (and the teeth under them) do in a smile."""
        across = np.abs(np.clip((columns - self._mouth_x) / self._lips, -1.3, 1.3))
        line: np.ndarray = self._mouth_y + self._rise * across**3
        return line

    def _cavity_half_width(self, width: float, pucker: float) -> float:
        """The gap's half-width: wider for spread lips, narrower for rounded and puckered ones."""
        shape = self._shape
        stretch = shape.spread * max(width, 0.0) - shape.rounding * max(-width, 0.0)
        half_width = self._lips * shape.cavity_width * (1.0 + stretch)
        if pucker > 0.0:
            half_width *= 1.0 - shape.pucker_narrow * pucker
        return half_width

    def _shape_shift(self, pose: MouthPose) -> np.ndarray:
        """(bh, bw) the rows' extra inverse shift (source row = row - shift) for press, tuck and pucker."""
        shape, below = self._shape, self._from_line  # (bh, bw) rows under the lip line (negative: above)
        shift = np.zeros(below.shape, dtype=np.float64)
        if pose.press > 0.0 and self._teeth > 0.0:
            # The upper lip [line - teeth - lip, line - teeth] stretched over [line - teeth - lip, line].
            lip, teeth = shape.upper_lip * self._face, self._teeth
            cover = float(_smoothstep(np.array(pose.press)))
            over = np.clip(below + teeth + lip, 0.0, None) * (below <= 0.0)
            across = (self._columns - self._mouth_x) / (self._lips * shape.teeth_across)
            flat = np.sqrt(np.clip(1.0 - np.abs(across) ** 3, 0.0, 1.0))  # (bw,) flat over the teeth, 0 at corners
            shift += cover * teeth / (teeth + lip) * over * flat
        # Lips pressed thin (magnification < 1 about the line) or puckered fuller (> 1); source = line + d / m.
        magnification = (1.0 - shape.press_thinning * pose.press) * (1.0 + shape.pucker_fuller * pose.pucker)
        if magnification != 1.0:
            shift += below * (1.0 - 1.0 / magnification) * self._lip_profile
        if pose.tuck > 0.0:  # the lower lip's rim moves up, under the line (and the upper teeth)
            fade = 1.0 - _smoothstep(below / (shape.tuck_fade * self._face))
            shift -= pose.tuck * shape.tuck_rise * self._face * fade * (below > 0.0)
        weighted: np.ndarray = shift * (self._mouth_profile[None, :] * self._support)
        return weighted

    def _gap(self, columns: np.ndarray, drop: float, half_width: float) -> np.ndarray:
        """Opening height per column: full at the centre, closing to nothing at the corners."""
        across = (columns - self._mouth_x) / half_width
        gap: np.ndarray = drop * np.sqrt(np.clip(1.0 - across * across, 0.0, 1.0))
        return gap

    def apply(self, pose: MouthPose, source: np.ndarray, work: np.ndarray) -> None:
        """Animate the mouth of `work` (h, w, 3) uint8 from the untouched crop `source`; a closed, neutral
        mouth leaves the jaw box exactly as in `source`."""
        rows, columns = self.box
        if pose.at_rest:
            if self._dirty:
                work[rows, columns] = source[rows, columns]
                self._dirty = False
            return
        self._dirty = True
        shape, opening, width = self._shape, pose.opening, pose.width
        drop = opening * shape.max_drop * self._face
        half_width = self._cavity_half_width(width, pose.pucker)
        gap = self._gap(self._columns, drop, half_width)  # (bw,)
        top = self._line(self._columns) + 0.5 * (drop - gap)  # (bw,) upper edge of the gap
        # Inverse map, rows: inside the gap the lip line is stretched (the cavity covers it), below it the
        # jaw is shifted by the gap, and the corners' share of the drop is spread over the cheeks.
        # The lower lip starts half a pixel past the line, so the row the line runs through (half teeth or
        # upper lip) is not dragged down as a light or dark rim under the gap.
        keep = np.where(gap > 0.5, 1.0 - 0.5 / np.maximum(gap, 0.5), 0.0)  # (bw,)
        torn = np.clip(self._rows[:, None] - top[None, :], 0.0, gap[None, :]) * keep[None, :] * self._neck[:, None]
        smooth = self._cheek * (drop - gap)[None, :]
        shift_y = (torn + smooth) * (self._horizontal[None, :] * self._support)
        corners = self._lips * (shape.spread * max(width, 0.0) - shape.rounding * max(-width, 0.0))
        if pose.shaped:  # (loudness lip sync never gets here: its frames are computed exactly as before)
            corners -= self._lips * shape.pucker_in * pose.pucker
            shift_y = shift_y + self._shape_shift(pose)
        shift_x = (corners * self._lip_profile) * (self._spread_profile[None, :] * self._support)
        map_x = self._grid_x - shift_x.astype(np.float32)
        map_y = self._grid_y - shift_y.astype(np.float32)
        cv2.remap(source, map_x, map_y, cv2.INTER_LINEAR, dst=work[rows, columns], borderMode=cv2.BORDER_REPLICATE)
        if drop >= 0.25:
            self._fill_gap(drop, half_width, work)

    def _fill_gap(self, drop: float, half_width: float, work: np.ndarray) -> None:
        """Blend the inner-mouth texture into the gap, with soft lip edges."""
        x0 = max(0, int(np.floor(self._mouth_x - half_width)) - 1)
        x1 = min(work.shape[1], int(np.ceil(self._mouth_x + half_width)) + 2)
        columns = np.arange(x0, x1, dtype=np.float32)  # (w',)
        line = self._line(columns)
        y0 = max(0, int(np.floor(line.min())) - 2)
        y1 = min(work.shape[0], int(np.ceil(line.max() + drop)) + 3)
        if x1 <= x0 or y1 <= y0:
            return
        rows = np.arange(y0, y1, dtype=np.float32)  # (h',)
        gap = self._gap(columns, drop, half_width)
        top = line + 0.5 * (drop - gap)
        below = rows[:, None] - top[None, :]  # (h', w') distance under the upper lip
        feather = max(0.7, self._shape.feather * self._face)
        inside = np.clip(below / feather + 0.5, 0.0, 1.0) * np.clip((gap[None, :] - below) / feather + 0.5, 0.0, 1.0)
        alpha = (inside * self._shape.cavity_opacity).astype(np.float32)[:, :, None]  # (h', w', 1)
        # Texture coordinates: rows measured from the upper lip, columns from the mouth centre, in pixels.
        map_x = np.broadcast_to(columns[None, :] - self._mouth_x + self._texture_centre, below.shape)
        map_y = below - 0.5
        inner = cv2.remap(
            self._texture,
            map_x.astype(np.float32),
            map_y.astype(np.float32),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
        region = work[y0:y1, x0:x1].astype(np.float32)
        region += alpha * (inner.astype(np.float32) - region)
        work[y0:y1, x0:x1] = np.clip(region + 0.5, 0.0, 255.0).astype(np.uint8)
