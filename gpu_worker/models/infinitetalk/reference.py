"""The reference: the portrait framed as the original frames it, its CLIP tokens and its VAE latent.

InfiniteTalk picks the size bucket whose aspect ratio is nearest the portrait's, resizes the portrait to cover it
(bilinear, sides rounded up) and centre-crops (`wan/multitalk.py` resize_and_centercrop, lines 54-92, and lines
437-451); `resolution` picks the table (source and 512: the 480-class buckets; 720p and 1080p: the 720-class
ones), a width and height asked for are the bucket (one of either class), and preview halves the bucket. The frames
are the bucket's size. The portrait in [-1, 1] is the I2V condition of every clip (kept as pixels: each clip encodes
it with its own length), its CLIP tokens are the DiT's image context, and its one-frame latent is the first clip's
first latent (multitalk.py line 577).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from gpu_worker.models.dit.reference import as_rgb
from gpu_worker.models.infinitetalk.config import InfiniteTalkConfig, bucket
from gpu_worker.models.infinitetalk.encoders import encode_image
from gpu_worker.models.infinitetalk.runtime import WanModule
from gpu_worker.models.infinitetalk.vae import encode
from gpu_worker.pipeline.module import Reference, ReferenceEncoder
from gpu_worker.pipeline.types import OutputSpec
from monologue.contracts import Resolution


def canvas(config: InfiniteTalkConfig, width: int, height: int, output: OutputSpec) -> tuple[int, int, bool]:
    """(width, height, 720-class) of the frames for a portrait of width x height: the size asked for (one of the
    buckets: `RenderOptions` refuses any other), else the nearest bucket of the resolution's class."""
    if output.size is not None:
        canvas_width, canvas_height = output.size
        large = (canvas_height, canvas_width) in config.buckets_720.values()
    else:
        large = output.resolution in (Resolution.HD_720, Resolution.HD_1080)
        canvas_width, canvas_height = bucket(width, height, config.buckets_720 if large else config.buckets_480)
    if output.preview:  # half, kept on the DiT's grid (VAE stride 8 x patch 2)
        canvas_width, canvas_height = canvas_width // 32 * 16, canvas_height // 32 * 16
    return canvas_width, canvas_height, large


def cover(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """resize_and_centercrop: scale to cover (sides rounded up, bilinear), then torchvision's centre crop."""
    source_height, source_width = rgb.shape[:2]
    scale = max(height / source_height, width / source_width)
    resized_height, resized_width = math.ceil(scale * source_height), math.ceil(scale * source_width)
    resized = np.asarray(Image.fromarray(rgb).resize((resized_width, resized_height), resample=Image.BILINEAR))
    top, left = round((resized_height - height) / 2.0), round((resized_width - width) / 2.0)
    return np.ascontiguousarray(resized[top : top + height, left : left + width])


class InfiniteTalkReference(WanModule, ReferenceEncoder):
    """Keys: frame_size, canvas_size (2,) int64 [width, height]; preview, large (1,) int64; pixels (H, W, 3) uint8;
    clip (257, image_dim) float32; latent (z, 1, H/8, W/8) float32."""

    model_names = ("clip", "vae")

    def check(self, portrait: np.ndarray) -> None:
        as_rgb(portrait)

    def encode(self, portrait: np.ndarray, output: OutputSpec) -> Reference:
        rgb = as_rgb(portrait)
        width, height, large = canvas(self.settings, rgb.shape[1], rgb.shape[0], output)
        pixels = cover(rgb, width, height)
        with self.running():
            image = self.tensor(pixels).permute(2, 0, 1)[None] / 255.0 * 2.0 - 1.0  # (1, 3, H, W) in [-1, 1]
            clip = encode_image(self.models["clip"], image, self.settings.clip.image_size)[0]  # type: ignore[arg-type]
            latent = encode(self.models["vae"], image[:, :, None])[0]  # type: ignore[arg-type]  # (z, 1, h, w)
        size = np.array([width, height], dtype=np.int64)
        return {
            "frame_size": size,
            "canvas_size": size.copy(),
            "preview": np.array([int(output.preview)], dtype=np.int64),
            "large": np.array([int(large)], dtype=np.int64),
            "pixels": pixels,
            "clip": clip.float().cpu().numpy(),
            "latent": latent.float().cpu().numpy(),
        }


def reference_image(reference: Reference, device: torch.device | str) -> torch.Tensor:
    """The portrait as (1, 3, H, W) float32 in [-1, 1] (multitalk.py lines 449-450)."""
    pixels = torch.from_numpy(np.array(reference["pixels"], dtype=np.uint8)).to(device)  # a writable copy
    return pixels.permute(2, 0, 1)[None].float() / 255.0 * 2.0 - 1.0
