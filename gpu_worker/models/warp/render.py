"""Parameters → frames. The warp family has no latent image: its "super-resolution" renders each frame at
the output size straight from the motion parameters, and its decoder passes the frames through.

Per frame: the background is copied once, the mouth and eyelids are animated in a working copy of the
head crop, and one remap sways the head crop into the frame. Only the head crop is ever touched.
"""

from __future__ import annotations

import numpy as np

from gpu_worker.models.warp import parameters as p
from gpu_worker.models.warp.eyes import EyeLid
from gpu_worker.models.warp.head import HeadWarp
from gpu_worker.models.warp.mouth import MouthPose, MouthWarp
from gpu_worker.models.warp.reference import reference_layout
from gpu_worker.pipeline.module import Decoder, Reference, SuperResolution


class FaceRig:
    """Everything one chunk's frames share, built from the reference once per chunk (not per frame)."""

    def __init__(self, reference: Reference) -> None:
        self.portrait = reference["portrait"]  # (H, W, 3)
        layout = reference_layout(reference)
        x0, y0, x1, y1 = (int(value) for value in reference["head_box"])
        self._box = (slice(y0, y1), slice(x0, x1))
        self._source = np.ascontiguousarray(self.portrait[y0:y1, x0:x1])  # (h, w, 3) the still head
        self._work = self._source.copy()  # (h, w, 3) the head with this frame's mouth and eyelids
        support = reference["head_mask"] > 0.0
        self._head = HeadWarp(reference["head_box"], reference["head_coarse"], layout)
        teeth = float(reference["teeth_rows"][0]) if "teeth_rows" in reference else None
        self._mouth = MouthWarp(layout, (x0, y0), support, reference["mouth_texture"], teeth_rows=teeth)
        crop_shape = (y1 - y0, x1 - x0)
        self._eyes = [
            EyeLid(layout.left_eye_x - 0.5 - x0, layout.left_eye_y - 0.5 - y0, layout.eye_half_width, crop_shape),
            EyeLid(layout.right_eye_x - 0.5 - x0, layout.right_eye_y - 0.5 - y0, layout.eye_half_width, crop_shape),
        ]

    def render(self, parameters: np.ndarray, out: np.ndarray) -> None:
        """One frame into `out` (H, W, 3) uint8 from one parameter vector (PARAMETER_COUNT,)."""
        np.copyto(out, self.portrait)
        pose = MouthPose(*(float(parameters[index]) for index in (p.OPENING, p.WIDTH, p.PRESS, p.TUCK, p.PUCKER)))
        self._mouth.apply(pose, self._source, self._work)
        for eye in self._eyes:
            eye.apply(float(parameters[p.BLINK]), self._source, self._work)
        self._head.apply(
            float(parameters[p.ROLL]),
            float(parameters[p.SHIFT_X]),
            float(parameters[p.SHIFT_Y]),
            self._work,
            out[self._box],
        )


class WarpRenderer(SuperResolution):
    """Renders frames (T, H, W, 3) uint8 at the reference's output size from parameters (T, PARAMETER_COUNT).

    The frames land in a buffer reused from chunk to chunk: a fresh 110 MB array per 720p chunk costs more
    in page faults than the rendering itself. So the frames are valid until the next call, which is the
    pipeline's contract anyway (the sink consumes a chunk's frames before the next chunk starts).
    """

    def __init__(self) -> None:
        super().__init__()
        self._buffer = np.empty((0, 0, 0, 3), dtype=np.uint8)

    def upscale(self, reference: Reference, latents: np.ndarray) -> np.ndarray:
        """Frames for every parameter row; identical parameters give identical frames, bit for bit."""
        if latents.ndim != 2 or latents.shape[1] != p.PARAMETER_COUNT:
            raise ValueError(f"warp latents must be (T, {p.PARAMETER_COUNT}), got {latents.shape}")
        if not np.all(np.isfinite(latents)):
            raise ValueError("warp latents contain NaN or infinity")
        rig = FaceRig(reference)
        height, width = rig.portrait.shape[:2]
        count = latents.shape[0]
        if self._buffer.shape[0] < count or self._buffer.shape[1:3] != (height, width):
            self._buffer = np.empty((count, height, width, 3), dtype=np.uint8)  # (T, H, W, 3)
        frames = self._buffer[:count]
        for index, parameters in enumerate(latents):
            rig.render(parameters, frames[index])
        return frames


class PassThroughDecoder(Decoder):
    """The renderer already produced RGB frames at the output size."""

    def decode(self, reference: Reference, upscaled: np.ndarray) -> np.ndarray:
        """Frames (T, H, W, 3) uint8, unchanged."""
        if upscaled.dtype != np.uint8 or upscaled.ndim != 4 or upscaled.shape[3] != 3:
            raise ValueError(f"expected frames (T, H, W, 3) uint8, got {upscaled.shape} {upscaled.dtype}")
        return upscaled
