"""The super-resolution DiT: low-resolution latents → output-resolution latents in one pass.

The low-resolution latents are upsampled (nearest) and the transformer predicts the residual detail,
attending, frame by frame, to the frames within ± `window` and to the reference frame (the portrait's
own output-resolution latents): the reference supplies identity detail (eyes, teeth, hair) that the
low-resolution video no longer has, and the window keeps neighbouring frames consistent.

Each frame's tokens are padded with learned registers to a multiple of the attention block size, so
FlexAttention's blocks align with frame edges (see sparse_attention.py). Registers are ordinary tokens
(they attend and are attended to, like ViT registers); their outputs are dropped.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.layers import TransformerBlock, grid_positions, patchify, rope_table, unpatchify
from gpu_worker.models.dit.sparse_attention import FrameWindow, window_attention


def padded_tokens(real: int, block_size: int) -> int:
    """Tokens per frame after padding `real` patch tokens with registers to a multiple of the block."""
    return -(-real // block_size) * block_size


class SuperResolutionDiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config.sr
        sr, channels = config.sr, config.latent_channels
        self.channels = channels
        self.embed = nn.Linear(channels * sr.patch**2, sr.dim)
        self.reference_type = nn.Parameter(torch.zeros(sr.dim))
        self.video_type = nn.Parameter(torch.zeros(sr.dim))
        self.registers = nn.Parameter(torch.zeros(sr.block_size, sr.dim))
        self.blocks = nn.ModuleList(TransformerBlock(sr.dim, sr.heads, sr.mlp_ratio) for _ in range(sr.layers))
        self.norm_out = nn.LayerNorm(sr.dim)
        self.head = nn.Linear(sr.dim, channels * sr.patch**2)
        nn.init.normal_(self.registers, std=0.02)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def layout(self, frames: int, height: int, width: int) -> FrameWindow:
        """The attention layout for `frames` video frames of output latents (height, width)."""
        sr = self.config
        real = (height // sr.patch) * (width // sr.patch)
        return FrameWindow(frames + 1, padded_tokens(real, sr.block_size), sr.window, sr.block_size)

    def forward(self, low: Tensor, reference: Tensor) -> Tensor:
        """low (B, C, T, h, w), reference (B, C, H, W) with H = scale h → latents (B, C, T, H, W)."""
        sr = self.config
        batch, _, frames = low.shape[:3]
        height, width = reference.shape[-2:]
        base = low.repeat_interleave(sr.scale, dim=3).repeat_interleave(sr.scale, dim=4)  # (B, C, T, H, W)
        if base.shape[-2:] != (height, width):
            raise ValueError(
                f"low-resolution latents {tuple(low.shape)} do not upscale to the reference's {height}x{width}"
            )
        sequence = torch.cat([reference[:, :, None], base], dim=2)  # (B, C, 1 + T, H, W)
        tokens = self.embed(patchify(sequence, sr.patch))  # (B, 1 + T, P_real, D)
        types = torch.cat([self.reference_type[None], self.video_type[None].expand(frames, -1)])  # (1 + T, D)
        tokens = tokens + types[None, :, None]
        layout = self.layout(frames, height, width)
        real = tokens.shape[2]
        registers = self.registers[: layout.tokens_per_frame - real].expand(batch, frames + 1, -1, -1)
        tokens = torch.cat([tokens, registers], dim=2)  # (B, 1 + T, P, D)

        rows, columns = height // sr.patch, width // sr.patch
        times = torch.arange(frames + 1, device=low.device)
        positions = grid_positions(times, rows, columns).view(frames + 1, real, 3)  # (1 + T, P_real, 3)
        # Registers sit at their frame's time and at no particular place in it.
        register_positions = torch.zeros(frames + 1, layout.tokens_per_frame - real, 3, device=low.device)
        register_positions[..., 0] = times[:, None]
        positions = torch.cat([positions, register_positions], dim=1).view(-1, 3)  # (L, 3)
        rope = rope_table(positions, sr.dim // sr.heads, sr.rope_theta)

        def attend(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
            return window_attention(query, key, value, layout, sr.attention)

        x = tokens.view(batch, layout.length, -1)  # (B, L, D)
        for block in self.blocks:
            x = block(x, rope, attend=attend)
        out = self.head(self.norm_out(x)).view(batch, frames + 1, layout.tokens_per_frame, -1)
        detail = unpatchify(out[:, 1:, :real], sr.patch, self.channels, height, width)  # (B, C, T, H, W)
        return base + detail
