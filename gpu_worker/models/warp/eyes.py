"""Blinks: the upper eyelid slides down over the eye.

The lid is the portrait's own skin between brow and eye, stretched down to a moving lid edge; the eye
below the edge stays as it is (covered, not squashed), and the edge carries the upper lashes down with
it because the stretched skin ends at the lash line.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True)
class LidShape:
    # Lid arcs relative to the eye centre, in eye half-widths: the upper lid's edge above it, and the lower
    # lid's edge below it, which the upper lid reaches when shut.
    upper: float = 0.45
    lower: float = 0.45
    # The skin that stretches starts this far above the eye centre: below the brow, so the brow stays still.
    skin_top: float = 0.88
    # The shut lid's lashes: a dark line along the lid edge, this wide (eye half-widths) and this dark.
    lash_width: float = 0.12
    lash_darkening: float = 0.35
    # A shut lid is slightly darker than the lit skin above it (it faces down).
    lid_shading: float = 0.1


LIDS = LidShape()


class EyeLid:
    """One eye's lid: a small box around the eye, animated per frame."""

    def __init__(
        self, centre_x: float, centre_y: float, half_width: float, crop_shape: tuple[int, int], shape: LidShape = LIDS
    ) -> None:
        """Centre in crop pixel-centre coordinates; half_width in pixels."""
        self._shape = shape
        self._centre = (centre_x, centre_y)
        self._half_width = max(half_width, 1.5)
        height, width = crop_shape
        skin_top = centre_y - shape.skin_top * self._half_width
        x0 = max(0, int(np.floor(centre_x - self._half_width)))
        x1 = min(width, int(np.ceil(centre_x + self._half_width)) + 1)
        y0 = max(0, int(np.floor(skin_top)))
        y1 = min(height, int(np.ceil(centre_y + shape.lower * self._half_width)) + 2)
        self.box = (slice(y0, y1), slice(x0, x1))
        self._skin_top = skin_top
        self._rows = np.arange(y0, y1, dtype=np.float32)[:, None]  # (bh, 1)
        self._columns = np.arange(x0, x1, dtype=np.float32)  # (bw,)
        across = (self._columns - centre_x) / self._half_width
        arc = np.sqrt(np.clip(1.0 - across * across, 0.0, 1.0))
        self._upper = (centre_y - shape.upper * self._half_width * arc).astype(np.float32)  # (bw,)
        self._lower = (centre_y + shape.lower * self._half_width * arc).astype(np.float32)  # (bw,)
        self._arc = arc.astype(np.float32)  # (bw,) 0 at the eye's corners, where the lid has no height
        self._map_x = np.broadcast_to(self._columns[None, :], (y1 - y0, x1 - x0)).astype(np.float32)
        self._dirty = False

    def apply(self, closure: float, source: np.ndarray, work: np.ndarray) -> None:
        """Close the lid of `work` (h, w, 3) uint8 by `closure` in [0, 1]; 0 restores the portrait's eye."""
        rows, columns = self.box
        if closure <= 0.0:
            if self._dirty:
                work[rows, columns] = source[rows, columns]
                self._dirty = False
            return
        self._dirty = True
        shape = self._shape
        edge = self._upper + closure * (self._lower - self._upper)  # (bw,) where the lid's edge is now
        # Above the edge, the skin from skin_top down to the lid's resting edge is stretched to reach it.
        stretch = (self._upper - self._skin_top) / np.maximum(edge - self._skin_top, 1e-3)  # (bw,)
        map_y = self._skin_top + (self._rows - self._skin_top) * stretch[None, :]  # (bh, bw)
        lid = cv2.remap(
            source, self._map_x, map_y.astype(np.float32), cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
        ).astype(np.float32)
        above = edge[None, :] - self._rows  # (bh, bw) pixels above the edge
        lash = np.exp(-((above / max(shape.lash_width * self._half_width, 0.6)) ** 2))
        # Shading grows with closure and down the lid, and vanishes at the box's edges and the eye's corners,
        # so nothing outside the moving lid changes.
        down = np.clip((self._rows - self._skin_top) / np.maximum(edge - self._skin_top, 1e-3)[None, :], 0.0, 1.0)
        darkening = (closure * self._arc)[None, :] * (shape.lid_shading * down + shape.lash_darkening * lash)
        lid *= (1.0 - darkening)[:, :, None]
        coverage = np.clip(above + 0.5, 0.0, 1.0)[:, :, None]  # anti-aliased lid edge
        eye = source[rows, columns].astype(np.float32)
        work[rows, columns] = np.clip(eye + coverage * (lid - eye) + 0.5, 0.0, 255.0).astype(np.uint8)
