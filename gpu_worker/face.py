"""Find the face and mouth in a portrait, once per session, so every frame animates the same region."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cache

import cv2
import numpy as np

from monologue.errors import NoFaceFound

# Faces smaller than this (in portrait pixels) are too small to animate convincingly.
MIN_FACE_PIXELS = 80
# Detection runs on a copy no larger than this; Haar cascades are scale-aware already, and a bounded size
# keeps both the cost and the false-positive rate of huge portraits in check.
_WORK_SIZE = 800
_FACE_CASCADES = ("haarcascade_frontalface_default.xml", "haarcascade_frontalface_alt2.xml")
_SMILE_CASCADE = "haarcascade_smile.xml"
# Mouth geometry relative to the Haar face box, measured on frontal portraits (skimage's astronaut).
_MOUTH_DOWN = 0.81
_MOUTH_WIDE = 0.40
_MOUTH_TALL = 0.13
# How far a smile-cascade hit may sit from the geometric guess before it is ignored as a false positive.
_SMILE_TOLERANCE_X = 0.08
_SMILE_TOLERANCE_Y = 0.10


@dataclass(frozen=True)
class FaceRegion:
    """Where the face and its (closed) mouth are, in portrait pixels."""

    x: int
    y: int
    width: int
    height: int
    mouth_x: int
    mouth_y: int
    mouth_width: int
    mouth_height: int

    def to_dict(self) -> dict[str, int]:
        """Plain ints, so the region can travel through JSON between workers."""
        return {key: int(value) for key, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, int]) -> FaceRegion:
        """Inverse of `to_dict`; unknown or missing keys raise TypeError, so schema drift fails loudly."""
        return cls(**{key: int(value) for key, value in data.items()})

    def animated_box(self, image_width: int, image_height: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1): the only pixels the animation may change, clamped to the image.

        Wide enough for the jaw and cheeks, from below the nose to below the chin, so the displacement
        field can fall to zero inside it and everything outside stays the portrait's own pixels.
        """
        x0 = self.mouth_x - round(0.62 * self.width)
        x1 = self.mouth_x + round(0.62 * self.width)
        y0 = self.mouth_y - round(0.30 * self.height)
        y1 = self.mouth_y + round(0.85 * self.height)
        return (
            max(0, min(image_width, x0)),
            max(0, min(image_height, y0)),
            max(0, min(image_width, x1)),
            max(0, min(image_height, y1)),
        )


@cache
def _cascade(name: str) -> cv2.CascadeClassifier:
    """Loading a cascade parses a large XML file; do it once per process."""
    folder: str = cv2.data.haarcascades  # type: ignore[attr-defined]  # missing from OpenCV's stubs
    classifier = cv2.CascadeClassifier(folder + name)
    if classifier.empty():
        raise RuntimeError(f"OpenCV cascade {name} is missing from {folder}")
    return classifier


def _largest(boxes: np.ndarray) -> tuple[int, int, int, int] | None:
    """Largest box, ties broken by position so the answer never depends on detection order."""
    if len(boxes) == 0:
        return None
    x, y, w, h = max(
        ((int(x), int(y), int(w), int(h)) for x, y, w, h in boxes),
        key=lambda box: (box[2] * box[3], -box[1], -box[0]),
    )
    return x, y, w, h


def _find_mouth(grey: np.ndarray, face: tuple[int, int, int, int], guess: tuple[float, float]) -> tuple[float, float]:
    """Refine the geometric mouth centre with the smile cascade, but only when it agrees with geometry.

    The smile cascade fires on many textures, so a hit far from where a mouth should be is ignored.
    """
    x, y, w, h = face
    top = y + h // 2
    bottom = min(grey.shape[0], y + h + h // 6)
    roi = cv2.equalizeHist(np.ascontiguousarray(grey[top:bottom, x : x + w]))
    hits = _cascade(_SMILE_CASCADE).detectMultiScale(
        roi, scaleFactor=1.1, minNeighbors=12, minSize=(max(1, w // 4), max(1, h // 10))
    )
    guess_x, guess_y = guess
    best: tuple[float, float, float] | None = None
    for hit_x, hit_y, hit_w, hit_h in hits:
        centre_x = x + hit_x + hit_w / 2
        centre_y = top + hit_y + hit_h / 2
        off_x, off_y = abs(centre_x - guess_x), abs(centre_y - guess_y)
        if off_x > _SMILE_TOLERANCE_X * w or off_y > _SMILE_TOLERANCE_Y * h:
            continue
        distance = (centre_x - guess_x) ** 2 + (centre_y - guess_y) ** 2
        if best is None or distance < best[0]:
            best = (distance, centre_x, centre_y)
    if best is None:
        return guess
    return best[1], best[2]


def detect_face(image: np.ndarray) -> FaceRegion:
    """Largest frontal face in an RGB portrait (H, W, 3) uint8, with its mouth; deterministic."""
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"portrait must be (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
    height, width = image.shape[:2]
    scale = min(1.0, _WORK_SIZE / max(height, width))
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
    if scale < 1.0:
        grey = cv2.resize(grey, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
    equalised = cv2.equalizeHist(grey)
    min_face = max(24, round(MIN_FACE_PIXELS * scale))

    face: tuple[int, int, int, int] | None = None
    for name in _FACE_CASCADES:
        boxes = _cascade(name).detectMultiScale(
            equalised, scaleFactor=1.1, minNeighbors=8, minSize=(min_face, min_face)
        )
        face = _largest(np.asarray(boxes).reshape(-1, 4))
        if face is not None:
            break
    if face is None:
        raise NoFaceFound(
            f"portrait: no face found; send a front-facing portrait where the face is at least "
            f"{MIN_FACE_PIXELS} px tall"
        )

    fx, fy, fw, fh = face
    guess = (fx + fw / 2, fy + _MOUTH_DOWN * fh)
    mouth_x, mouth_y = _find_mouth(grey, face, guess)
    return FaceRegion(
        x=round(fx / scale),
        y=round(fy / scale),
        width=round(fw / scale),
        height=round(fh / scale),
        mouth_x=round(mouth_x / scale),
        mouth_y=round(mouth_y / scale),
        mouth_width=max(2, round(_MOUTH_WIDE * fw / scale)),
        mouth_height=max(2, round(_MOUTH_TALL * fh / scale)),
    )
