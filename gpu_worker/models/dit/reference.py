"""The dit family's reference encoder: the portrait, framed for the output, through the VAE encoder.

The portrait is cropped to the canvas's aspect ratio ("cover": never letterboxed) and resized to the
canvas, the output frame size rounded up to `DiTConfig.canvas_multiple` (frames are generated on the
canvas and cropped back to the output size at decode). It is encoded alone, as a one-frame video (the
VAE pads it to 4 copies of itself: one latent frame, the latent a still video starts with), twice: at the
canvas size (the super-resolution DiT's reference frame) and at 1/scale of it (the audio-to-video DiT's
reference tokens, in the same latent space as the low-resolution video). Resizing is done in torch, so this
module needs nothing beyond torch and numpy.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.models.dit.vae import VAEEncoder
from gpu_worker.pipeline.module import Reference, ReferenceEncoder
from gpu_worker.pipeline.types import OutputSpec, frame_size
from monologue.contracts import Resolution
from monologue.errors import InputError

MIN_SIDE = 16


def as_rgb(portrait: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 from greyscale (H, W) or (H, W, 1), RGB, or RGBA (alpha dropped); InputError otherwise."""
    if portrait.dtype != np.uint8:
        raise InputError(f"portrait must be uint8, got {portrait.dtype}")
    if portrait.ndim == 2:
        portrait = portrait[:, :, None]
    if portrait.ndim != 3 or portrait.shape[2] not in (1, 3, 4):
        raise InputError(f"portrait must be (H, W), (H, W, 1), (H, W, 3) or (H, W, 4), got {portrait.shape}")
    if min(portrait.shape[:2]) < MIN_SIDE:
        raise InputError(f"portrait of {portrait.shape[1]}x{portrait.shape[0]} is too small (under {MIN_SIDE} px)")
    if portrait.shape[2] == 1:
        return np.ascontiguousarray(np.repeat(portrait, 3, axis=2))
    return np.ascontiguousarray(portrait[:, :, :3])


def canvas_size(width: int, height: int, multiple: int) -> tuple[int, int]:
    """(width, height) rounded up to the multiple."""
    return -(-width // multiple) * multiple, -(-height // multiple) * multiple


def named_canvas(config: DiTConfig, resolution: str) -> tuple[int, int]:
    """(width, height) of the canvas frames are generated on at a named resolution, for a landscape portrait
    (a tall one gets the transposed canvas): what FLOP counts and compile warm-ups are sized for."""
    named = Resolution(resolution)
    if named is Resolution.SOURCE:
        raise ValueError("a canvas needs a named resolution (512, 720p, 1080p): 'source' depends on the portrait")
    width, height = frame_size(16 * 256, 9 * 256, OutputSpec(resolution=named))
    return canvas_size(width, height, config.canvas_multiple)


def cover(rgb: np.ndarray, width: int, height: int) -> Tensor:
    """The centre crop of `rgb` with the aspect width/height, resized to (3, height, width) in [-1, 1]."""
    source_height, source_width = rgb.shape[:2]
    if source_width * height > source_height * width:  # wider than the target: crop the sides
        crop_width, crop_height = max(1, round(source_height * width / height)), source_height
    else:
        crop_width, crop_height = source_width, max(1, round(source_width * height / width))
    x, y = (source_width - crop_width) // 2, (source_height - crop_height) // 2
    image = torch.from_numpy(np.array(rgb[y : y + crop_height, x : x + crop_width]))  # a writable copy
    image = image.permute(2, 0, 1)[None].float() / 127.5 - 1.0  # (1, 3, h, w)
    return resize(image, width, height)[0]


def resize(image: Tensor, width: int, height: int) -> Tensor:
    """(B, 3, h, w) → (B, 3, height, width), antialiased when shrinking."""
    if image.shape[-2:] == (height, width):
        return image
    resized = F.interpolate(image, size=(height, width), mode="bicubic", antialias=True, align_corners=False)
    return resized.clamp(-1.0, 1.0)


class DiTReference(TorchModule, ReferenceEncoder):
    """Keys: frame_size (2,) int64 [width, height]; canvas_size (2,) int64 [width, height]; preview (1,) int64;
    reference_latents (C, H/s, W/s) float32 at the canvas size; reference_latents_low (C, H/(s r), W/(s r))
    float32 at 1/r of it (s the VAE's stride, r the super-resolution scale)."""

    model_names = ("vae_encoder",)

    def check(self, portrait: np.ndarray) -> None:
        as_rgb(portrait)

    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        rgb = as_rgb(portrait)
        width, height = frame_size(rgb.shape[1], rgb.shape[0], output)
        canvas_width, canvas_height = canvas_size(width, height, self.config.canvas_multiple)
        scale = self.config.sr.scale
        encoder = self.model("vae_encoder", VAEEncoder)
        with self.running():
            image = cover(rgb, canvas_width, canvas_height).to(self.device)[None]  # (1, 3, H, W)
            low_image = resize(image, canvas_width // scale, canvas_height // scale)
            high = encoder.encode(image[:, :, None])[0, :, 0]  # (C, H/s, W/s): one frame, one latent
            low = encoder.encode(low_image[:, :, None])[0, :, 0]  # (C, H/(s r), W/(s r))
        return {
            "frame_size": np.array([width, height], dtype=np.int64),
            "canvas_size": np.array([canvas_width, canvas_height], dtype=np.int64),
            "preview": np.array([int(output.preview)], dtype=np.int64),
            "reference_latents": high.float().cpu().numpy(),
            "reference_latents_low": low.float().cpu().numpy(),
        }
