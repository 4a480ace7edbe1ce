"""Where the face, eyes and mouth are in a portrait: found once per session, then only scaled.

Haar cascades give the face box (the largest face) and usually the eyes; the lips are measured in the
pixels where geometry says they are (see `lips`).
"""

from __future__ import annotations

import threading
from dataclasses import astuple, dataclass, fields
from math import ceil

import cv2
import numpy as np

from gpu_worker.models.warp.lips import find_lips
from monologue.errors import NoFaceFound


@dataclass(frozen=True)
class DetectionConfig:
    # Detection runs on a copy with this long side: Haar cascades are scale-aware, a fixed working size
    # keeps the cost flat for huge photos and lets small ones (200 px) still find their face.
    work_long_side: int = 640
    # Faces smaller than this share of the image's short side are too small to animate convincingly
    # (and such tiny hits are mostly false positives on textures).
    min_face_share: float = 0.08
    face_cascades: tuple[str, ...] = ("haarcascade_frontalface_default.xml", "haarcascade_frontalface_alt2.xml")
    eye_cascade: str = "haarcascade_eye.xml"
    # Eye centres and half-width relative to the face box, measured on frontal portraits; the fallback
    # when the eye cascade misses, and the expectation its hits are checked against.
    eye_across: float = 0.30
    eye_down: float = 0.37
    eye_half_width: float = 0.095
    # A cascade eye further than this from where an eye should be is a brow, a nostril or hair.
    eye_tolerance_x: float = 0.13
    eye_tolerance_y: float = 0.10
    # The visible eye is narrower than the cascade's box, which includes the lids and some brow.
    eye_box_to_half_width: float = 0.36
    # Faces found past the first pass are enlarged to this size to look for their eyes (at 70 px the eyes are
    # too small for the eye cascade; real faces then show both, textures mistaken for faces do not).
    confirm_face_px: int = 200
    # How many overlapping cascade hits make a face. The first pass asks many (its hits are not checked again);
    # the passes past it ask fewer, because their eyes confirm each face: a face of 8-9 % of a 720-px picture
    # gets only 4 to 7 hits at full size, and with 8 asked of it a clearly visible face was refused (with 3,
    # grass passed for a face; tests/gpu_worker/models/test_warp_faces.py holds both lines).
    min_neighbours: int = 8
    confirm_min_neighbours: int = 4
    # The cascades' box of one face varies by ±5 % with its background (56-66 px for a 60-px face): the passes
    # past the first search down to this share of the stated minimum, so a face at the minimum is not refused
    # for a box a few pixels short of it.
    confirm_size_slack: float = 0.9


DETECTION = DetectionConfig()


@dataclass(frozen=True)
class Layout:
    """Face, eyes and mouth in one image's pixel coordinates (floats; x right, y down)."""

    face_x: float
    face_y: float
    face_width: float
    face_height: float
    left_eye_x: float  # the eye on the image's left
    left_eye_y: float
    right_eye_x: float
    right_eye_y: float
    eye_half_width: float
    mouth_x: float  # centre of the line where the mouth opens (under the upper lip, or the upper teeth)
    mouth_y: float
    mouth_half_width: float  # centre to either corner
    mouth_rise: float  # how much lower the corners are than the centre (negative: a smile)
    teeth_showing: float  # 1.0 when the portrait shows its upper teeth above mouth_y, else 0.0

    def mapped(self, offset_x: float, offset_y: float, scale_x: float, scale_y: float) -> Layout:
        """The same layout after cropping at (offset_x, offset_y) and resizing by (scale_x, scale_y)."""
        return Layout(
            face_x=(self.face_x - offset_x) * scale_x,
            face_y=(self.face_y - offset_y) * scale_y,
            face_width=self.face_width * scale_x,
            face_height=self.face_height * scale_y,
            left_eye_x=(self.left_eye_x - offset_x) * scale_x,
            left_eye_y=(self.left_eye_y - offset_y) * scale_y,
            right_eye_x=(self.right_eye_x - offset_x) * scale_x,
            right_eye_y=(self.right_eye_y - offset_y) * scale_y,
            eye_half_width=self.eye_half_width * scale_x,
            mouth_x=(self.mouth_x - offset_x) * scale_x,
            mouth_y=(self.mouth_y - offset_y) * scale_y,
            mouth_half_width=self.mouth_half_width * scale_x,
            mouth_rise=self.mouth_rise * scale_y,
            teeth_showing=self.teeth_showing,
        )

    @property
    def face_centre(self) -> tuple[float, float]:
        return self.face_x + self.face_width / 2, self.face_y + self.face_height / 2

    def to_array(self) -> np.ndarray:
        """(14,) float64 in field order, for the reference dict."""
        return np.array(astuple(self), dtype=np.float64)

    @classmethod
    def from_array(cls, values: np.ndarray) -> Layout:
        """Inverse of `to_array`; a wrong length raises, so a stale reference fails loudly."""
        names = [field.name for field in fields(cls)]
        if values.shape != (len(names),):
            raise ValueError(f"layout needs {len(names)} values, got shape {values.shape}")
        return cls(**{name: float(value) for name, value in zip(names, values, strict=True)})


_THREAD = threading.local()


def _cascade(name: str) -> cv2.CascadeClassifier:
    """The calling thread's own classifier (parsing a cascade's XML is slow: once per thread). One classifier
    used by two threads at once finds other faces (its detection buffers are shared), so two sessions that
    start together on a node would get other layouts, and other frames, than either alone."""
    classifiers: dict[str, cv2.CascadeClassifier] = _THREAD.__dict__.setdefault("classifiers", {})
    if name not in classifiers:
        folder: str = cv2.data.haarcascades  # type: ignore[attr-defined]  # missing from OpenCV's stubs
        classifier = cv2.CascadeClassifier(folder + name)
        if classifier.empty():
            raise RuntimeError(f"OpenCV cascade {name} is missing from {folder}")
        classifiers[name] = classifier
    return classifiers[name]


def _by_size(boxes: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Boxes largest first; ties broken by position so the answer never depends on detection order."""
    candidates = [(int(x), int(y), int(w), int(h)) for x, y, w, h in np.asarray(boxes).reshape(-1, 4)]
    return sorted(candidates, key=lambda box: (box[2] * box[3], -box[1], -box[0]), reverse=True)


def _matched_eyes(
    equalised: np.ndarray, face: tuple[int, int, int, int], config: DetectionConfig
) -> list[tuple[float, float, float] | None]:
    """The cascade's eye nearest where each eye should be, (centre x, centre y, half-width) in working pixels,
    or None where no hit is close enough."""
    x, y, w, h = face
    top, bottom = y + round(0.12 * h), y + round(0.62 * h)
    roi = np.ascontiguousarray(equalised[top:bottom, x : x + w])
    size = max(8, round(0.12 * w))
    hits = _cascade(config.eye_cascade).detectMultiScale(
        roi, scaleFactor=1.1, minNeighbors=4, minSize=(size, size), maxSize=(round(0.45 * w), round(0.45 * w))
    )
    found: list[tuple[float, float, float] | None] = []
    for expected_x, expected_y in _expected_eyes(face, config):
        best: tuple[float, float, float, float] | None = None
        for hit_x, hit_y, hit_w, hit_h in np.asarray(hits).reshape(-1, 4):
            centre_x, centre_y = x + hit_x + hit_w / 2, top + hit_y + hit_h / 2
            off_x, off_y = abs(centre_x - expected_x), abs(centre_y - expected_y)
            if off_x > config.eye_tolerance_x * w or off_y > config.eye_tolerance_y * h:
                continue
            distance = off_x * off_x + off_y * off_y
            if best is None or distance < best[0]:
                best = (distance, centre_x, centre_y, hit_w * config.eye_box_to_half_width)
        found.append(None if best is None else best[1:])
    return found


def _expected_eyes(face: tuple[int, int, int, int], config: DetectionConfig) -> list[tuple[float, float]]:
    x, y, w, h = face
    return [
        (x + config.eye_across * w, y + config.eye_down * h),
        (x + (1 - config.eye_across) * w, y + config.eye_down * h),
    ]


def _find_eyes(
    equalised: np.ndarray, face: tuple[int, int, int, int], config: DetectionConfig
) -> tuple[tuple[float, float], tuple[float, float], float]:
    """(left centre, right centre, half-width) in working pixels; geometry fills in what the cascade misses."""
    x, _, w, _ = face
    expected = _expected_eyes(face, config)
    found = _matched_eyes(equalised, face, config)
    left, right = found
    mid_x = x + w / 2
    # One eye found: a frontal face is close to symmetric, so mirror it rather than trust pure geometry.
    if left is None and right is not None:
        left = (2 * mid_x - right[0], right[1], right[2])
    if right is None and left is not None:
        right = (2 * mid_x - left[0], left[1], left[2])
    if left is None or right is None:
        half_width = config.eye_half_width * w
        return expected[0], expected[1], half_width
    # Both eyes share one half-width: a blink that closes one eye more than the other looks like a wink.
    half_width = float(np.clip((left[2] + right[2]) / 2, 0.07 * w, 0.13 * w))
    return (left[0], left[1]), (right[0], right[1]), half_width


def detect_layout(image: np.ndarray, config: DetectionConfig = DETECTION) -> Layout:
    """Face, eyes and mouth of the largest frontal face in an RGB (H, W, 3) uint8 portrait; deterministic.

    Detection runs on a copy with a `work_long_side` long side first; where that finds nothing (a small face in
    a wide picture, 36 px at that size, is below what the strict cascades find), on copies twice as large up
    to the picture's own size. Raises NoFaceFound, naming the smallest face it accepts, when none is found.
    """
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"portrait must be (H, W, 3) uint8 RGB, got {image.shape} {image.dtype}")
    height, width = image.shape[:2]
    long_side, smallest = config.work_long_side, 0.0
    while True:
        size = min(long_side, max(height, width)) if long_side > config.work_long_side else long_side
        # Passes past the first confirm their face by its eyes: at full size the cascades also see faces in
        # brick walls and cell tissue, whose "eyes" the eye cascade does not find.
        found, smallest = _detect_at(image, size / max(height, width), config, confirm=size > config.work_long_side)
        if found is not None:
            return found
        if size >= max(height, width):
            break
        long_side *= 2
    short = min(height, width)
    raise NoFaceFound(
        "portrait: no face found; send a front-facing portrait where the face is clearly visible and at least "
        f"{ceil(smallest)} px tall ({100 * smallest / short:.0f}% of this {width}x{height} picture's shorter side)"
    )


def _detect_at(
    image: np.ndarray, scale: float, config: DetectionConfig, *, confirm: bool
) -> tuple[Layout | None, float]:
    """The layout found on a copy scaled by `scale` (None if no face), and the smallest face (in the
    picture's own pixels) that pass accepts; with `confirm`, only a face whose two eyes are found counts."""
    height, width = image.shape[:2]
    work_size = (max(1, round(width * scale)), max(1, round(height * scale)))
    if work_size == (width, height):
        work = image
    else:
        work = cv2.resize(image, work_size, interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    grey = cv2.cvtColor(work, cv2.COLOR_RGB2GRAY)
    equalised = cv2.equalizeHist(grey)
    min_face = max(24, round(config.min_face_share * min(grey.shape)))
    search = max(24, round(min_face * config.confirm_size_slack)) if confirm else min_face
    face: tuple[int, int, int, int] | None = None
    for name in config.face_cascades:
        boxes = _cascade(name).detectMultiScale(
            equalised,
            scaleFactor=1.1,
            minNeighbors=config.confirm_min_neighbours if confirm else config.min_neighbours,
            minSize=(search, search),
        )
        candidates = _by_size(np.asarray(boxes))
        face = next((box for box in candidates if not confirm or _eyes_confirm(grey, box, config)), None)
        if face is not None:
            break
    if face is None:
        return None, min_face / scale
    saturation = cv2.cvtColor(work, cv2.COLOR_RGB2HSV)[:, :, 1]
    return _layout(equalised, grey, saturation, face, scale, config), min_face / scale


def _eyes_confirm(grey: np.ndarray, face: tuple[int, int, int, int], config: DetectionConfig) -> bool:
    """Both eyes where a face has them, found by the eye cascade on the face enlarged to `confirm_face_px`."""
    x, y, w, h = face
    margin = w // 2
    x0, y0 = max(0, x - margin), max(0, y - margin)
    x1, y1 = min(grey.shape[1], x + w + margin), min(grey.shape[0], y + h + margin)
    factor = config.confirm_face_px / w
    crop = cv2.resize(grey[y0:y1, x0:x1], None, fx=factor, fy=factor, interpolation=cv2.INTER_CUBIC)
    box = (round((x - x0) * factor), round((y - y0) * factor), round(w * factor), round(h * factor))
    return all(eye is not None for eye in _matched_eyes(cv2.equalizeHist(crop), box, config))


def _layout(
    equalised: np.ndarray,
    grey: np.ndarray,
    saturation: np.ndarray,
    face: tuple[int, int, int, int],
    scale: float,
    config: DetectionConfig,
) -> Layout:
    """The layout of a face box found in working pixels, in the picture's own pixels."""
    left_eye, right_eye, eye_half_width = _find_eyes(equalised, face, config)
    lips = find_lips(grey, saturation, face)
    fx, fy, fw, fh = face
    return Layout(
        face_x=fx / scale,
        face_y=fy / scale,
        face_width=fw / scale,
        face_height=fh / scale,
        left_eye_x=float(left_eye[0]) / scale,
        left_eye_y=float(left_eye[1]) / scale,
        right_eye_x=float(right_eye[0]) / scale,
        right_eye_y=float(right_eye[1]) / scale,
        eye_half_width=float(eye_half_width) / scale,
        mouth_x=lips.x / scale,
        mouth_y=lips.y / scale,
        mouth_half_width=lips.half_width / scale,
        mouth_rise=lips.rise / scale,
        teeth_showing=1.0 if lips.teeth_showing else 0.0,
    )
