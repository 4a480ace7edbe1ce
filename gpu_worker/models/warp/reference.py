"""The warp family's reference: the portrait framed for the output, and everything frames reuse.

The portrait is cropped to the output's aspect ratio around the face ("cover": the frame is always full,
never letterboxed: bars beside a face read as a broken video) and resized once to the exact output size; the face
layout, the head's weight and the inner-mouth texture are computed at that size, so rendering a frame only warps
pixels. An output shape that would cut the face (a tall narrow strip from a wide picture with a large face)
gets a larger crop instead, reaching past the picture; past it, the picture's edge is stretched outward and
blurred (`framing`), so the face is whole and the frame still has no bars.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cv2
import numpy as np

from gpu_worker.models.warp.head import head_region, upsample
from gpu_worker.models.warp.layout import Layout, detect_layout
from gpu_worker.models.warp.texture import mouth_texture, visible_teeth
from gpu_worker.pipeline.module import Reference, ReferenceEncoder
from gpu_worker.pipeline.types import OutputSpec, frame_size


@dataclass(frozen=True)
class CropBox:
    """A crop of the portrait in its own pixels: [x, x + width) x [y, y + height)."""

    x: int
    y: int
    width: int
    height: int


def cover_crop(width: int, height: int, aspect: float, centre_x: float, centre_y: float) -> CropBox:
    """The largest box of the given aspect (width / height) inside the image, centred on (centre_x,
    centre_y) as far as the image allows."""
    if width / height > aspect:
        crop_height = height
        crop_width = min(width, max(1, round(height * aspect)))
    else:
        crop_width = width
        crop_height = min(height, max(1, round(width / aspect)))
    x = int(np.clip(round(centre_x - crop_width / 2), 0, width - crop_width))
    y = int(np.clip(round(centre_y - crop_height / 2), 0, height - crop_height))
    return CropBox(x, y, crop_width, crop_height)


# Room the face box must have inside the frame, either side, in face widths (heights): less, and the output's
# shape cuts into the face, which the animation of lips and eyes then cannot show.
FACE_ROOM = 0.15
# Blur of the strip past the picture, as a share of the crop's longer side: soft enough that no detail of the
# stretched edge reads as content.
PAD_BLUR = 0.02


def framing(width: int, height: int, aspect: float, face: Layout) -> CropBox:
    """The crop of a width x height picture for an output of the given aspect (width / height): `cover_crop`
    centred on the face, or, when that would leave the face less than FACE_ROOM either side, the smallest box of
    the aspect that does not, centred on the face and reaching past the picture (`cut` fills the rest)."""
    centre_x, centre_y = face.face_centre
    box = cover_crop(width, height, aspect, centre_x, centre_y)
    room = 1 + 2 * FACE_ROOM
    grow = max(face.face_width * room / box.width, face.face_height * room / box.height)
    if grow <= 1:
        return box
    crop_width, crop_height = math.ceil(box.width * grow), math.ceil(box.height * grow)
    return CropBox(_place(centre_x, crop_width, width), _place(centre_y, crop_height, height), crop_width, crop_height)


def _place(centre: float, crop: int, side: int) -> int:
    """The crop's start on one axis: centred on `centre`, inside the picture where the crop fits it, else
    covering the whole picture."""
    return int(np.clip(round(centre - crop / 2), min(0, side - crop), max(0, side - crop)))


def cut(rgb: np.ndarray, crop: CropBox) -> np.ndarray:
    """The crop's pixels of `rgb`; where the crop reaches past the picture, its edge stretched and blurred."""
    height, width = rgb.shape[:2]
    x0, y0 = max(crop.x, 0), max(crop.y, 0)
    x1, y1 = min(crop.x + crop.width, width), min(crop.y + crop.height, height)
    inside = rgb[y0:y1, x0:x1]
    top, left = y0 - crop.y, x0 - crop.x
    bottom, right = crop.y + crop.height - y1, crop.x + crop.width - x1
    if not (top or left or bottom or right):
        return inside
    padded = cv2.copyMakeBorder(inside, top, bottom, left, right, cv2.BORDER_REPLICATE)
    blurred = cv2.GaussianBlur(padded, (0, 0), sigmaX=PAD_BLUR * max(crop.width, crop.height))
    blurred[top : top + inside.shape[0], left : left + inside.shape[1]] = inside
    return blurred


def as_rgb(portrait: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 from greyscale (H, W) or (H, W, 1), RGB, or RGBA (alpha dropped)."""
    if portrait.dtype != np.uint8:
        raise ValueError(f"portrait must be uint8, got {portrait.dtype}")
    if portrait.ndim == 2:
        portrait = portrait[:, :, None]
    if portrait.ndim != 3 or portrait.shape[2] not in (1, 3, 4):
        raise ValueError(f"portrait must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got {portrait.shape}")
    if portrait.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(portrait, 3, axis=2))
    return np.ascontiguousarray(portrait[:, :, :3])


class WarpReference(ReferenceEncoder):
    """Portrait → framed, resized portrait with its face layout, head weight and inner-mouth texture.

    Keys: frame_size (2,) int64 [width, height]; portrait (H, W, 3) uint8; layout (14,) float64 (see
    Layout, output pixels); head_box (4,) int64 [x0, y0, x1, y1], the only pixels that ever change;
    head_coarse (r, c) float32, the head's weight on a coarse grid over head_box; head_mask (y1-y0, x1-x0)
    float32, that weight per pixel (0 exactly where pixels never change); mouth_texture (rows, columns, 3)
    uint8, the inner mouth shown between the lips; teeth_rows (1,) float64, the upper teeth the portrait shows
    above the mouth line, in rows (pressed lips cover them; references stored before visemes lack it).
    """

    def check(self, portrait: np.ndarray) -> None:
        detect_layout(as_rgb(portrait))

    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        """Frame and analyse the portrait once; raises NoFaceFound when it has no usable face."""
        rgb = as_rgb(portrait)
        found = detect_layout(rgb)
        source_height, source_width = rgb.shape[:2]
        width, height = frame_size(source_width, source_height, output)
        crop = framing(source_width, source_height, width / height, found)
        cropped = cut(rgb, crop)
        shrinking = width * height < crop.width * crop.height
        framed = cv2.resize(cropped, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_CUBIC)
        layout = found.mapped(crop.x, crop.y, width / crop.width, height / crop.height)
        box, coarse = head_region(layout, width, height)
        x0, y0, x1, y1 = (int(value) for value in box)
        return {
            "frame_size": np.array([width, height], dtype=np.int64),
            "portrait": np.ascontiguousarray(framed),
            "layout": layout.to_array(),
            "head_box": box,
            "head_coarse": coarse,
            "head_mask": upsample(coarse, x1 - x0, y1 - y0),
            "mouth_texture": mouth_texture(framed, layout),
            "teeth_rows": np.array([visible_teeth(framed, layout)], dtype=np.float64),
        }


def reference_layout(reference: Reference) -> Layout:
    """The face layout stored in a reference, in output pixels."""
    return Layout.from_array(reference["layout"])
