"""Head sway: a small rotation and translation of the head region, feathered into the still background.

The head's weight (1 on the head, falling smoothly to 0 around it) is sampled on a coarse grid once per
session; each frame scales that grid by the pose and upsamples it into a per-pixel displacement. Where
the weight is exactly 0 the displacement is exactly 0, so those pixels are the portrait's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from gpu_worker.models.warp.layout import Layout


@dataclass(frozen=True)
class HeadShape:
    # The head as an ellipse relative to the face box, from the top of the hair to the chin and out to the
    # hair at the temples (measured on frontal portraits).
    centre_down: float = 0.33  # face heights below the face box top
    half_height: float = 0.72  # face heights
    half_width: float = 0.80  # face widths
    # The weight fades over this many ellipse radii outside it: a few pixels of sway spread over a wide band
    # of background never show as an edge.
    feather: float = 0.45
    # The neck bends with the head: full weight at the chin, none by `neck_bottom` (face heights below the
    # face box top), and only over the neck's width so the shoulders stay put.
    neck_top: float = 1.0
    neck_bottom: float = 1.6
    neck_half_width: float = 0.38  # face widths
    neck_feather: float = 0.28  # face widths
    # The head turns about the base of the neck, so the chin moves less than the crown, as in life.
    pivot_down: float = 1.35
    # Grid pitch in face heights: the weight changes over tenths of a face, so this sampling loses nothing
    # and turns a per-pixel computation into a few hundred nodes.
    node_pitch: float = 0.1
    # Rows per remap call: bands let the remap skip the crop's corners, which the weight never reaches.
    band_rows: int = 16


HEAD = HeadShape()


def _smoothstep(values: np.ndarray) -> np.ndarray:
    """0 → 0, 1 → 1 with zero slope at both ends, so a fade has no visible crease."""
    clipped = np.clip(values, 0.0, 1.0)
    eased: np.ndarray = clipped * clipped * (3.0 - 2.0 * clipped)
    return eased


def _weight(x: np.ndarray, y: np.ndarray, layout: Layout, shape: HeadShape) -> np.ndarray:
    """Head weight at frame positions (pixel centres), broadcasting x and y."""
    centre_x = layout.face_x + layout.face_width / 2
    centre_y = layout.face_y + shape.centre_down * layout.face_height
    radius = np.hypot(
        (x + 0.5 - centre_x) / (shape.half_width * layout.face_width),
        (y + 0.5 - centre_y) / (shape.half_height * layout.face_height),
    )
    head = 1.0 - _smoothstep((radius - 1.0) / shape.feather)
    below = (y + 0.5 - layout.face_y - shape.neck_top * layout.face_height) / (
        (shape.neck_bottom - shape.neck_top) * layout.face_height
    )
    across = (np.abs(x + 0.5 - centre_x) - shape.neck_half_width * layout.face_width) / (
        shape.neck_feather * layout.face_width
    )
    # Only below the middle of the head, where the ellipse is still at full weight, so the union is smooth.
    neck = (1.0 - _smoothstep(below)) * (1.0 - _smoothstep(across)) * (y + 0.5 >= centre_y)
    return np.maximum(head, neck)


def head_region(layout: Layout, width: int, height: int, shape: HeadShape = HEAD) -> tuple[np.ndarray, np.ndarray]:
    """(box, coarse weight) for a frame of width x height: box = [x0, y0, x1, y1] int64, the only pixels
    animation may change; coarse (rows, columns) float32, the head weight on the grid `upsample` expects."""
    centre_x = layout.face_x + layout.face_width / 2
    centre_y = layout.face_y + shape.centre_down * layout.face_height
    reach_x = max(
        shape.half_width * (1 + shape.feather) * layout.face_width,
        (shape.neck_half_width + shape.neck_feather) * layout.face_width,
    )
    reach_up = shape.half_height * (1 + shape.feather) * layout.face_height
    bottom = max(centre_y + reach_up, layout.face_y + shape.neck_bottom * layout.face_height)
    x0, x1 = max(0, int(np.floor(centre_x - reach_x))), min(width, int(np.ceil(centre_x + reach_x)))
    y0, y1 = max(0, int(np.floor(centre_y - reach_up))), min(height, int(np.ceil(bottom)))
    if x1 - x0 < 2 or y1 - y0 < 2:
        raise ValueError(f"the head region {x0},{y0},{x1},{y1} is empty in a {width}x{height} frame")
    pitch = max(2.0, shape.node_pitch * layout.face_height)
    columns, rows = max(3, round((x1 - x0) / pitch) + 1), max(3, round((y1 - y0) / pitch) + 1)
    node_x, node_y = node_positions(x1 - x0, y1 - y0, columns, rows)
    coarse = _weight(node_x[None, :] + x0, node_y[:, None] + y0, layout, shape).astype(np.float32)
    # Where the box is inside the frame its edge must not move; where the frame cuts the head off, the
    # frame's edge moves with the head, as it would in a close-up.
    if x0 > 0:
        coarse[:, 0] = 0.0
    if x1 < width:
        coarse[:, -1] = 0.0
    if y0 > 0:
        coarse[0, :] = 0.0
    if y1 < height:
        coarse[-1, :] = 0.0
    return np.array([x0, y0, x1, y1], dtype=np.int64), coarse


def node_positions(width: int, height: int, columns: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Pixel positions (crop pixel centres) of the coarse nodes, exactly as cv2.resize places them."""
    node_x = (np.arange(columns) + 0.5) * (width / columns) - 0.5
    node_y = (np.arange(rows) + 0.5) * (height / rows) - 0.5
    return node_x, node_y


def upsample(coarse: np.ndarray, width: int, height: int) -> np.ndarray:
    """The per-pixel (height, width) weight the renderer uses: exactly 0 wherever nothing moves."""
    full: np.ndarray = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)
    return full


class HeadWarp:
    """Per chunk: precomputed grids for one head region; per frame: one remap of the head crop."""

    def __init__(self, box: np.ndarray, coarse: np.ndarray, layout: Layout, shape: HeadShape = HEAD) -> None:
        x0, y0, x1, y1 = (int(value) for value in box)
        width, height = x1 - x0, y1 - y0
        self._size = (width, height)
        self._weight = coarse[:, :, None].astype(np.float32)  # (r, c, 1)
        node_x, node_y = node_positions(width, height, coarse.shape[1], coarse.shape[0])
        pivot_x = layout.face_x + layout.face_width / 2 - 0.5 - x0
        pivot_y = layout.face_y + shape.pivot_down * layout.face_height - 0.5 - y0
        # Node offsets from the pivot (r, c), for the rotation's displacement.
        self._node_x = np.broadcast_to(node_x[None, :] - pivot_x, coarse.shape).astype(np.float32)
        self._node_y = np.broadcast_to(node_y[:, None] - pivot_y, coarse.shape).astype(np.float32)
        self._face_height = layout.face_height
        grid_y, grid_x = np.mgrid[0:height, 0:width].astype(np.float32)
        self._grid = np.dstack([grid_x, grid_y])  # (h, w, 2) identity map
        self._displacement = np.zeros((height, width, 2), dtype=np.float32)
        self._map = self._grid.copy()
        self._bands = self._moving_bands(upsample(coarse, width, height), shape.band_rows)

    @staticmethod
    def _moving_bands(weight: np.ndarray, band_rows: int) -> list[tuple[slice, slice]]:
        """Row bands, each cut to the columns where anything can move."""
        bands = []
        for top in range(0, weight.shape[0], band_rows):
            rows = slice(top, min(weight.shape[0], top + band_rows))
            moving = np.flatnonzero(weight[rows].max(axis=0) > 0.0)
            if moving.size:
                bands.append((rows, slice(int(moving[0]), int(moving[-1]) + 1)))
        return bands

    def apply(self, roll: float, shift_x: float, shift_y: float, source: np.ndarray, out: np.ndarray) -> None:
        """Write the swayed head crop into `out` (h, w, 3) uint8, which already holds the portrait's pixels.

        roll in radians, shifts in face heights; `source` (h, w, 3) is the crop with the face animated.
        """
        cos, sin = np.float32(np.cos(roll)), np.float32(np.sin(roll))
        shift_x_pixels = np.float32(shift_x * self._face_height)
        shift_y_pixels = np.float32(shift_y * self._face_height)
        # Backward map: each output pixel reads from the inverse rotation about the pivot, minus the shift.
        coarse = np.empty((*self._weight.shape[:2], 2), dtype=np.float32)  # (r, c, 2)
        coarse[..., 0] = (cos - 1) * self._node_x + sin * self._node_y - shift_x_pixels
        coarse[..., 1] = (cos - 1) * self._node_y - sin * self._node_x - shift_y_pixels
        coarse *= self._weight
        cv2.resize(coarse, self._size, dst=self._displacement, interpolation=cv2.INTER_LINEAR)
        for rows, columns in self._bands:
            cv2.add(self._displacement[rows, columns], self._grid[rows, columns], dst=self._map[rows, columns])
            cv2.remap(  # type: ignore[call-overload]  # OpenCV's stubs miss map2=None (a two-channel map1)
                source,
                self._map[rows, columns],
                None,
                cv2.INTER_LINEAR,
                dst=out[rows, columns],
                borderMode=cv2.BORDER_REPLICATE,
            )
