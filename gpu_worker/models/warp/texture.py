"""The inner mouth, painted once per session: upper teeth under the lip, a dark cavity, the tongue deep down.

Built from the portrait's own lighting (and its own teeth, when the portrait shows them), so the mouth
belongs to the face; built once, so every frame shows exactly the same teeth.
"""

from __future__ import annotations

import numpy as np

from gpu_worker.models.warp.layout import Layout
from gpu_worker.models.warp.mouth import MOUTH, MouthShape

# Rec. 601 luma, the weights greyscale conversions use.
_LUMA = np.array([0.299, 0.587, 0.114])
# Colours for a face lit at `_REFERENCE_SKIN` grey: shadow behind the teeth, tongue, and teeth that are
# off-white rather than white (white teeth read as a cartoon).
_CAVITY_RGB = np.array([24.0, 8.0, 10.0])
_TONGUE_RGB = np.array([96.0, 40.0, 44.0])
_TEETH_RGB = np.array([222.0, 214.0, 196.0])
_REFERENCE_SKIN = 170.0
# Teeth in the portrait are brighter than skin by at least this factor, and cover this share of the lips.
_TEETH_BRIGHTER = 1.08
_TEETH_MIN_SHARE = 0.04
# Gaps between teeth, in lip half-widths from the centre (incisors, laterals, canines), and how much they
# darken: a faint hint of separate teeth, not drawn lines.
_TOOTH_EDGES = (0.0, 0.34, 0.62, 0.9)
_TOOTH_GAP_DARKENING = 0.15


def _region(image: np.ndarray, x0: float, x1: float, y0: float, y1: float) -> np.ndarray:
    """Pixels (N, 3) float64 in a box, clamped to the image; at least one pixel."""
    height, width = image.shape[:2]
    left, right = int(np.clip(np.floor(x0), 0, width - 1)), int(np.clip(np.ceil(x1), 1, width))
    top, bottom = int(np.clip(np.floor(y0), 0, height - 1)), int(np.clip(np.ceil(y1), 1, height))
    return image[top : max(bottom, top + 1), left : max(right, left + 1)].reshape(-1, 3).astype(np.float64)


def _skin_luma(portrait: np.ndarray, layout: Layout) -> float:
    """The cheeks' median grey: how the face is lit."""
    face = layout.face_height
    centre_x = layout.face_x + layout.face_width / 2
    cheeks = np.concatenate(
        [
            _region(
                portrait,
                centre_x - 0.32 * layout.face_width,
                centre_x - 0.2 * layout.face_width,
                layout.face_y + 0.55 * face,
                layout.face_y + 0.65 * face,
            ),
            _region(
                portrait,
                centre_x + 0.2 * layout.face_width,
                centre_x + 0.32 * layout.face_width,
                layout.face_y + 0.55 * face,
                layout.face_y + 0.65 * face,
            ),
        ]
    )
    return float(np.median(cheeks @ _LUMA))


def visible_teeth(portrait: np.ndarray, layout: Layout) -> float:
    """Rows of upper teeth the portrait shows above its mouth line (0 when it shows none): how far pressed
    lips (m, b, p) must stretch the upper lip down to meet the lower one. Portrait and layout at the output size."""
    if not layout.teeth_showing:
        return 0.0
    face, lips = layout.face_height, max(layout.mouth_half_width, 1.0)
    skin = _skin_luma(portrait, layout)
    height, width = portrait.shape[:2]
    left = int(np.clip(round(layout.mouth_x - 0.5 * lips), 0, width - 1))
    right = int(np.clip(round(layout.mouth_x + 0.5 * lips), left + 1, width))
    line = int(np.clip(np.floor(layout.mouth_y - 0.5), 0, height - 1))  # the last pixel row above the line
    rows = 0
    for row in range(line, max(-1, line - round(0.15 * face)), -1):  # upwards from the line
        luma = portrait[row, left:right].astype(np.float64) @ _LUMA
        if ((luma > skin * _TEETH_BRIGHTER) & (luma > 110)).mean() < 0.5:
            break
        rows += 1
    return float(rows + 1) if rows else 0.0  # and the row half lip, half teeth above them


def mouth_texture(portrait: np.ndarray, layout: Layout, shape: MouthShape = MOUTH) -> np.ndarray:
    """(rows, columns, 3) uint8: row 0 is just under the upper lip, the middle column the mouth centre.

    portrait (H, W, 3) uint8 and layout at the output resolution.
    """
    face, lips = layout.face_height, max(layout.mouth_half_width, 1.0)
    rows = int(np.ceil(shape.max_drop * face * 1.25)) + 3
    half_columns = int(np.ceil(lips * 1.3)) + 2
    skin = _skin_luma(portrait, layout)
    light = float(np.clip(skin / _REFERENCE_SKIN, 0.5, 1.15))

    lips_region = _region(
        portrait,
        layout.mouth_x - 0.6 * lips,
        layout.mouth_x + 0.6 * lips,
        layout.mouth_y - 0.06 * face,
        layout.mouth_y + 0.06 * face,
    )
    luma = lips_region @ _LUMA
    bright = (luma > skin * _TEETH_BRIGHTER) & (luma > 110)
    if bright.sum() >= max(3, _TEETH_MIN_SHARE * bright.size):
        teeth_rgb = lips_region[bright].mean(axis=0) * 0.95  # a little shadow: they sit under the lip
    else:
        teeth_rgb = _TEETH_RGB * light

    depth = (np.arange(rows) + 0.5)[:, None]  # (rows, 1) pixels under the lip
    across = ((np.arange(2 * half_columns + 1) - half_columns) / lips)[None, :]  # (1, columns)
    # Cavity: darkest right behind the teeth, the tongue's warmer colour appearing as the jaw drops far,
    # and shadowed towards the corners.
    fraction = np.clip(depth / (shape.max_drop * face), 0.0, 1.0) ** 1.6
    cavity = (_CAVITY_RGB + (_TONGUE_RGB - _CAVITY_RGB) * fraction[..., None]) * light  # (rows, 1, 3)
    cavity = cavity * (1.0 - 0.35 * np.minimum(across * across, 1.0))[..., None]  # (rows, columns, 3)

    # Teeth: a band under the lip that curves up towards the corners, shaded there and right under the lip
    # (its shadow), with faint gaps between teeth.
    teeth_height = max(1.0, shape.teeth_height * face) * (1.0 - 0.3 * np.minimum(across * across, 1.0))
    coverage = np.clip(teeth_height - depth + 0.5, 0.0, 1.0) * 0.95  # (rows, columns)
    lip_shadow = 1.0 - 0.2 * np.clip(1.0 - depth / max(1.0, 0.3 * shape.teeth_height * face), 0.0, 1.0)
    shade = (1.0 - 0.35 * np.minimum(across * across, 1.0)) * lip_shadow
    pixel_width = max(0.5, 0.04 * lips)  # gap width in pixels, never thinner than half a pixel
    gaps = np.zeros_like(across)
    for edge in _TOOTH_EDGES:
        for side in (-edge, edge) if edge else (edge,):
            gaps = np.maximum(gaps, np.exp(-(((across - side) * lips / pixel_width) ** 2)))
    teeth = teeth_rgb * (shade * (1.0 - _TOOTH_GAP_DARKENING * gaps))[..., None]  # (rows, columns, 3)
    # A portrait that already shows its upper teeth opens under them: painted teeth would double them.
    texture = cavity + (teeth - cavity) * (coverage * (1.0 - layout.teeth_showing))[..., None]

    # A greyscale portrait gets a greyscale mouth: a red cavity would be the only colour in the picture.
    face_pixels = _region(
        portrait, layout.face_x, layout.face_x + layout.face_width, layout.face_y, layout.face_y + face
    )
    if np.abs(face_pixels - face_pixels.mean(axis=1, keepdims=True)).mean() < 1.5:
        texture = np.repeat((texture @ _LUMA)[..., None], 3, axis=2)
    painted: np.ndarray = np.clip(texture + 0.5, 0, 255).astype(np.uint8)
    return painted
