"""A simple, real audio-driven talking photo: loudness opens the jaw of a still portrait.

A placeholder model: pure numpy in, numpy out, cheap enough for a CPU, deterministic, and exact wherever it
does not animate, so chunks rendered by different workers stitch together without seams.
"""

from __future__ import annotations

import cv2
import numpy as np

from gpu_worker.face import FaceRegion

FPS = 25

# Loudness mapping: quieter than the floor keeps the mouth shut, louder than the ceiling opens it fully.
_FLOOR_DBFS = -45.0
_CEILING_DBFS = -15.0
# RMS window: two frames wide, so each frame hears its neighbours' edges and the motion is not jittery.
_WINDOW_FRAMES = 2.0
# The loudness is read this many frames ahead, because lips move slightly before the sound comes out.
_LOOK_AHEAD_FRAMES = 0.6
# Smoothing over neighbouring frames (offsets -1, 0, +1, +2); the forward tilt adds a little more look-ahead.
_SMOOTHING = np.array([0.2, 0.4, 0.3, 0.1], dtype=np.float64)
_SMOOTHING_OFFSETS = np.arange(-1, 3)
_BLOCK_FRAMES = 256

# Rendering, relative to the face box height: how far the jaw drops at full opening.
_MAX_DROP = 0.11
# Below the mouth the jaw moves rigidly down to about the chin, then the neck absorbs the motion.
_CHIN_BELOW_MOUTH = 0.38
# The cheeks stretch over this distance either side of the mouth line, so they never show a torn row.
_CHEEK_SPAN = 0.16
# Cavity colours: shadowed under the upper lip, a warmer red-brown towards the tongue.
_CAVITY_TOP_RGB = np.array([30.0, 9.0, 9.0], dtype=np.float32)
_CAVITY_BOTTOM_RGB = np.array([96.0, 34.0, 32.0], dtype=np.float32)


def _frame_loudness(audio: np.ndarray, *, rate: int, fps: int, frames: np.ndarray) -> np.ndarray:
    """Opening in [0, 1] from the loudness around each frame; outside the audio counts as silence."""
    half = round(_WINDOW_FRAMES * rate / fps / 2)
    window = np.hanning(2 * half + 2)[1:-1].astype(np.float64)  # (2 * half,) without the zero end points
    window /= window.sum()
    centres = np.round((frames + 0.5 + _LOOK_AHEAD_FRAMES) * rate / fps).astype(np.int64)  # (F,)
    mean_square = np.empty(frames.size, dtype=np.float64)  # (F,)
    # Blocks bound the memory of the (frames, window) gather; rows are summed independently, so the values
    # do not depend on how frames are grouped, which is what keeps chunks identical to the whole.
    for start in range(0, frames.size, _BLOCK_FRAMES):
        offsets = np.arange(-half, half)[None, :]
        indices = centres[start : start + _BLOCK_FRAMES, None] + offsets  # (B, 2 * half)
        inside = (indices >= 0) & (indices < audio.shape[0])
        samples = np.where(inside, audio[np.clip(indices, 0, max(0, audio.shape[0] - 1))], 0.0)
        mean_square[start : start + _BLOCK_FRAMES] = (samples.astype(np.float64) ** 2 * window).sum(axis=1)
    decibels = 10.0 * np.log10(np.maximum(mean_square, 1e-20))
    return np.clip((decibels - _FLOOR_DBFS) / (_CEILING_DBFS - _FLOOR_DBFS), 0.0, 1.0)


def mouth_openings(audio: np.ndarray, *, rate: int, fps: int, first_frame: int, n_frames: int) -> np.ndarray:
    """How open the mouth is, (n_frames,) float32 in [0, 1], for frames [first_frame, first_frame + n_frames).

    `audio` is the whole session (float32 mono in [-1, 1]); every value depends only on the audio near its
    frame, so a chunk computed alone equals the same slice of the whole video.
    """
    if audio.ndim != 1:
        raise ValueError(f"audio must be mono (N,), got shape {audio.shape}")
    if rate <= 0 or fps <= 0 or n_frames < 0 or first_frame < 0:
        raise ValueError(f"bad timing: rate={rate} fps={fps} first_frame={first_frame} n_frames={n_frames}")
    if n_frames == 0:
        return np.zeros(0, dtype=np.float32)
    lo = first_frame + int(_SMOOTHING_OFFSETS[0])
    hi = first_frame + n_frames + int(_SMOOTHING_OFFSETS[-1])
    loudness = _frame_loudness(audio, rate=rate, fps=fps, frames=np.arange(lo, hi, dtype=np.float64))
    openings = np.zeros(n_frames, dtype=np.float64)
    for weight, offset in zip(_SMOOTHING, _SMOOTHING_OFFSETS, strict=True):
        start = offset - _SMOOTHING_OFFSETS[0]
        openings += weight * loudness[start : start + n_frames]
    return np.clip(openings, 0.0, 1.0).astype(np.float32)


def _smoothstep(values: np.ndarray) -> np.ndarray:
    """0 -> 0 and 1 -> 1 with zero slope at both ends, so warped regions meet still ones without a crease."""
    clipped: np.ndarray = np.clip(values, 0.0, 1.0)
    eased: np.ndarray = clipped * clipped * (3.0 - 2.0 * clipped)
    return eased


class TalkingPhoto:
    """Animates one portrait: drops the jaw and shows a dark mouth cavity in proportion to the opening."""

    def __init__(self, portrait: np.ndarray, face: FaceRegion) -> None:
        if portrait.ndim != 3 or portrait.shape[2] != 3 or portrait.dtype != np.uint8:
            raise ValueError(f"portrait must be (H, W, 3) uint8, got {portrait.shape} {portrait.dtype}")
        self._portrait = portrait.copy()  # (H, W, 3)
        height, width = portrait.shape[:2]
        self._box = face.animated_box(width, height)
        x0, y0, x1, y1 = self._box
        self._crop = self._portrait[y0:y1, x0:x1].copy()  # (h, w, 3)

        # Everything is in crop coordinates from here on.
        self._mouth_x = float(face.mouth_x - x0)
        self._mouth_y = float(face.mouth_y - y0)
        self._mouth_half_width = max(face.mouth_width / 2.0, 1.0)
        self._max_drop = _MAX_DROP * face.height
        self._cheek_span = max(_CHEEK_SPAN * face.height, 1.0)
        self._feather_pixels = max(1.5, face.height / 70.0)
        self._rows = np.arange(y1 - y0, dtype=np.float32)  # (h,)
        self._columns = np.arange(x1 - x0, dtype=np.float32)  # (w,)
        self._grid_x = np.broadcast_to(self._columns[None, :], (self._rows.size, self._columns.size)).copy()

        # Horizontal falloff: the jaw moves as a whole under the mouth and fades out over the cheeks,
        # reaching zero inside the box so its left and right edges never move.
        jaw_half_width = self._mouth_half_width * 1.6
        edge_distance = max(min(self._mouth_x, self._columns.size - 1 - self._mouth_x), jaw_half_width + 1.0)
        across = (np.abs(self._columns - self._mouth_x) - jaw_half_width) / (edge_distance - jaw_half_width)
        self._horizontal = (1.0 - _smoothstep(across)).astype(np.float32)  # (w,)

        # Vertical profile: the skin between nose and chin stretches smoothly around the mouth line, the chin
        # moves rigidly, and below it the neck absorbs the motion down to the box bottom.
        chin = self._mouth_y + _CHIN_BELOW_MOUTH * face.height
        below = (self._rows - chin) / max(self._rows.size - 1 - chin, 1.0)
        neck = 1.0 - _smoothstep(below)
        self._neck_fade = neck.astype(np.float32)  # (h,)
        around = (self._rows - self._mouth_y + self._cheek_span) / (2.0 * self._cheek_span)
        self._cheek_ramp = (_smoothstep(around) * neck).astype(np.float32)  # (h,)

    def _cavity_half_width(self, opening: float) -> float:
        """The lips part a little wider as the jaw drops."""
        return self._mouth_half_width * (0.8 + 0.12 * opening)

    def _frame_crop(self, opening: float) -> np.ndarray:
        """The animated crop (h, w, 3) uint8 for one opening in (0, 1]."""
        drop = opening * self._max_drop
        # Lip gap per column (w,): full height under the mouth centre, closing to nothing at the corners,
        # so the torn part of the warp is exactly the elliptical cavity drawn over it afterwards.
        across = (self._columns - self._mouth_x) / self._cavity_half_width(opening)
        gap = drop * np.sqrt(np.clip(1.0 - across * across, 0.0, 1.0))  # (w,)
        top = self._mouth_y + 0.5 * (drop - gap)  # (w,)
        # Inverse map (source row = output row - shift): inside the gap the mouth line is stretched, the rest
        # of the drop is spread smoothly over the cheeks, and nothing above the cheek span moves.
        torn = np.clip(self._rows[:, None] - top[None, :], 0.0, gap[None, :]) * self._neck_fade[:, None]
        smooth = self._cheek_ramp[:, None] * (drop - gap)[None, :]
        shift = (torn + smooth) * self._horizontal[None, :]  # (h, w)
        map_y = (self._rows[:, None] - shift).astype(np.float32)
        warped = cv2.remap(self._crop, self._grid_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        return self._draw_cavity(warped, opening, drop)

    def _draw_cavity(self, crop: np.ndarray, opening: float, drop: float) -> np.ndarray:
        """Blend a soft dark ellipse into the gap the jaw opened between the lips."""
        half_height = 0.5 * drop
        if half_height < 0.5:
            return crop
        half_width = self._cavity_half_width(opening)
        centre_y = self._mouth_y + half_height
        x0 = max(0, int(self._mouth_x - half_width) - 1)
        x1 = min(crop.shape[1], int(self._mouth_x + half_width) + 2)
        y0 = max(0, int(centre_y - half_height) - 1)
        y1 = min(crop.shape[0], int(centre_y + half_height) + 2)
        dx = (self._columns[x0:x1] - self._mouth_x) / half_width  # (w',)
        dy = (self._rows[y0:y1] - centre_y) / half_height  # (h',)
        radius = np.sqrt(dx[None, :] ** 2 + dy[:, None] ** 2)  # (h', w')
        # Feathered edge in pixels that grows with the face, so small mouths stay crisp and large ones soft.
        feather = min(0.5, self._feather_pixels / half_height)
        alpha = (np.clip((1.0 - radius) / feather, 0.0, 1.0) * 0.95)[..., None]  # (h', w', 1)
        # Darkest just under the upper lip, warmer lower down where the tongue catches light.
        depth = np.clip(0.5 + 0.5 * dy, 0.0, 1.0)[:, None, None] ** 1.5  # (h', 1, 1)
        colour = _CAVITY_TOP_RGB + (_CAVITY_BOTTOM_RGB - _CAVITY_TOP_RGB) * depth  # (h', 1, 3)
        region = crop[y0:y1, x0:x1].astype(np.float32)
        blended = region + alpha * (colour - region)
        crop[y0:y1, x0:x1] = np.clip(blended + 0.5, 0.0, 255.0).astype(np.uint8)
        return crop

    def render(self, openings: np.ndarray) -> np.ndarray:
        """Frames (T, H, W, 3) uint8 for openings (T,) in [0, 1]; opening 0 is the portrait, bit for bit."""
        if openings.ndim != 1:
            raise ValueError(f"openings must be (T,), got shape {openings.shape}")
        values = np.clip(np.nan_to_num(openings.astype(np.float64), nan=0.0), 0.0, 1.0)
        frames = np.repeat(self._portrait[None], values.size, axis=0)  # (T, H, W, 3)
        x0, y0, x1, y1 = self._box
        for index, opening in enumerate(values):
            # Zero skips the warp entirely, which is what makes a closed mouth bit-identical to the portrait.
            if opening > 0.0:
                frames[index, y0:y1, x0:x1] = self._frame_crop(float(opening))
        return frames
