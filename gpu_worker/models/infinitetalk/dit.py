"""InfiniteTalk's DiT: Wan2.1-I2V-14B as diffusers builds it, with InfiniteTalk's audio adapter in every block.

The parts are diffusers' (`diffusers.models.transformers.transformer_wan`: the rotary embedding, the patch
embedding, the time/text/image condition embedder, WanTransformerBlock's attentions, norms and feed-forward,
the output norm and projection), under the same attribute names as WanTransformer3DModel, so its checkpoint
keys are diffusers' (rename.py maps the original ones). What diffusers lacks is InfiniteTalk's
(`wan/modules/multitalk_model.py`):

- `audio_proj` (AudioProjModel, lines 366-437): per latent frame, the wav2vec2 windows of the frames it stands
  for → `context_tokens` audio tokens. The first latent is the first frame alone (its 5-frame window, `proj1`);
  every later latent gathers its 4 frames as the first frame's window up to the centre, the middle frames'
  centres and the last frame's window from the centre (lines 655-665: 3 + 1 + 1 + 3 = 8 frames, `proj1_vf`).
- per block, after the text/image cross-attention, `norm_x` then `audio_cross_attn` (SingleStreamAttention,
  attention.py lines 191-280): each latent frame's tokens attend only to that frame's audio tokens. The
  original's 1-D RoPE and attention-map routing serve two speakers only (attention.py line 324: one person takes
  the plain path), so the self-attention's reference attention map (line 169) is never used and not computed.

The forward is ours (diffusers' WanTransformer3DModel.forward has no place for the audio), the same steps.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from diffusers.models.normalization import FP32LayerNorm
from diffusers.models.transformers.transformer_wan import (
    WanRotaryPosEmbed,
    WanTimeTextImageEmbedding,
    WanTransformerBlock,
)
from torch import Tensor, nn

from gpu_worker.models.infinitetalk.config import DiTConfig


class AudioProjection(nn.Module):
    """wav2vec2 windows → audio tokens per latent frame (AudioProjModel)."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        per_frame = config.audio_blocks * config.audio_channels
        self.tokens, self.width = config.context_tokens, config.output_dim
        self.proj1 = nn.Linear(config.audio_window * per_frame, config.intermediate_dim)
        self.proj1_vf = nn.Linear((config.audio_window + config.vae_scale - 1) * per_frame, config.intermediate_dim)
        self.proj2 = nn.Linear(config.intermediate_dim, config.intermediate_dim)
        self.proj3 = nn.Linear(config.intermediate_dim, config.context_tokens * config.output_dim)
        self.norm: nn.Module = FP32LayerNorm(config.output_dim) if config.norm_output_audio else nn.Identity()

    def forward(self, first: Tensor, later: Tensor) -> Tensor:
        """first (B, 1, W, K, C), later (B, T - 1, W', K, C) → (B, T, tokens, width)."""
        first = torch.relu(self.proj1(first.flatten(2)))  # (B, 1, I)
        later = torch.relu(self.proj1_vf(later.flatten(2)))  # (B, T - 1, I)
        hidden = torch.relu(self.proj2(torch.cat([first, later], dim=1)))  # (B, T, I)
        tokens = self.proj3(hidden).unflatten(-1, (self.tokens, self.width))  # (B, T, tokens, width)
        return self.norm(tokens)


def latent_audio_windows(audio: Tensor, window: int, stride: int) -> tuple[Tensor, Tensor]:
    """Per-frame windows (B, F, W, K, C), F = 1 + stride (T - 1) → (first (B, 1, W, K, C), later (B, T - 1, W', K, C))
    as multitalk_model.py lines 655-665 gather them."""
    middle = window // 2
    first, later = audio[:, :1], audio[:, 1:].unflatten(1, (-1, stride))  # later: (B, T - 1, stride, W, K, C)
    head = later[:, :, :1, : middle + 1].flatten(2, 3)  # the first frame's window up to its centre
    centres = later[:, :, 1:-1, middle : middle + 1].flatten(2, 3)
    tail = later[:, :, -1:, middle:].flatten(2, 3)  # the last frame's window from its centre on
    return first, torch.cat([head, centres, tail], dim=2)


class AudioCrossAttention(nn.Module):
    """Each latent frame's video tokens attend to that frame's audio tokens (one speaker)."""

    def __init__(self, dim: int, audio_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(audio_dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden: Tensor, audio: Tensor) -> Tensor:
        """hidden (B, T S, D) for T latent frames of S tokens; audio (B, T, M, Da) → (B, T S, D)."""
        batch, length, dim = hidden.shape
        frames, tokens = audio.shape[1], audio.shape[2]
        query = self.q_linear(hidden).view(batch * frames, length // frames, self.heads, -1).transpose(1, 2)
        key_value = self.kv_linear(audio).view(batch * frames, tokens, 2, self.heads, -1)  # (B T, M, 2, H, Dh)
        key, value = key_value.permute(2, 0, 3, 1, 4).unbind(0)  # each (B T, H, M, Dh)
        attended = F.scaled_dot_product_attention(query, key, value)  # (B T, H, S, Dh)
        return self.proj(attended.transpose(1, 2).reshape(batch, length, dim))


class InfiniteTalkBlock(WanTransformerBlock):
    """diffusers' Wan block (self-attention, text+image cross-attention, feed-forward) with the audio step."""

    def __init__(self, config: DiTConfig) -> None:
        dim = config.dim
        super().__init__(dim, config.ffn_dim, config.num_heads, "rms_norm_across_heads", True, config.eps, dim)
        self.audio_cross_attn = AudioCrossAttention(dim, config.output_dim, config.num_heads)
        # WanLayerNorm with affine (multitalk_model.py line 271): computed in fp32, as FP32LayerNorm does.
        self.norm_x: nn.Module = FP32LayerNorm(dim, config.eps) if config.norm_input_visual else nn.Identity()

    def forward(  # type: ignore[override]
        self, hidden: Tensor, context: Tensor, modulation: Tensor, rotary: tuple[Tensor, Tensor], audio: Tensor
    ) -> Tensor:
        """hidden (B, L, D); context (B, 257 + 512, D); modulation (B, 6, D); audio (B, T, M, Da)."""
        shift, scale, gate, ffn_shift, ffn_scale, ffn_gate = (self.scale_shift_table + modulation.float()).chunk(6, 1)
        normed = (self.norm1(hidden.float()) * (1 + scale) + shift).type_as(hidden)
        hidden = (hidden.float() + self.attn1(normed, None, None, rotary) * gate).type_as(hidden)
        hidden = hidden + self.attn2(self.norm2(hidden.float()).type_as(hidden), context, None, None)
        hidden = hidden + self.audio_cross_attn(self.norm_x(hidden).type_as(hidden), audio)
        normed = (self.norm3(hidden.float()) * (1 + ffn_scale) + ffn_shift).type_as(hidden)
        return (hidden.float() + self.ffn(normed).float() * ffn_gate).type_as(hidden)


class InfiniteTalkDiT(nn.Module):
    """Noisy latents + mask + encoded reference video → the flow velocity, conditioned on the timestep, text, the
    CLIP image tokens and the audio windows."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.rope = WanRotaryPosEmbed(config.head_dim, config.patch_size, 1024)
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.condition_embedder = WanTimeTextImageEmbedding(
            dim=dim,
            time_freq_dim=config.freq_dim,
            time_proj_dim=6 * dim,
            text_embed_dim=config.text_dim,
            image_embed_dim=config.image_dim,
        )
        self.blocks = nn.ModuleList([InfiniteTalkBlock(config) for _ in range(config.num_layers)])
        self.norm_out = FP32LayerNorm(dim, config.eps, elementwise_affine=False)
        self.proj_out = nn.Linear(dim, config.out_dim * math.prod(config.patch_size))
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        self.audio_proj = AudioProjection(config)

    def forward(self, latents: Tensor, timestep: Tensor, text: Tensor, image: Tensor, audio: Tensor) -> Tensor:
        """latents (B, in_dim, T, H, W); timestep (B,) in [0, 1000]; text (B, 512, text_dim); image (B, 257,
        image_dim); audio (B, 1 + 4 (T - 1), window, K, C) → (B, out_dim, T, H, W) float32."""
        batch, _, frames, height, width = latents.shape
        p_t, p_h, p_w = self.config.patch_size
        rotary = self.rope(latents)
        hidden = self.patch_embedding(latents).flatten(2).transpose(1, 2).contiguous()  # (B, L, D)
        time, modulation, text, image = self.condition_embedder(timestep, text, image)
        modulation = modulation.unflatten(1, (6, -1))  # (B, 6, D)
        context = torch.cat([image, text], dim=1)  # image tokens first, as the processor splits them off
        first, later = latent_audio_windows(audio, self.config.audio_window, self.config.vae_scale)
        audio_tokens = self.audio_proj(first, later).to(hidden.dtype)  # (B, T, tokens, width)
        for block in self.blocks:
            hidden = block(hidden, context, modulation, rotary, audio_tokens)
        shift, scale = (self.scale_shift_table + time.unsqueeze(1)).chunk(2, dim=1)
        hidden = (self.norm_out(hidden.float()) * (1 + scale) + shift).type_as(hidden)
        hidden = self.proj_out(hidden)  # (B, L, p_t p_h p_w out)
        hidden = hidden.reshape(batch, frames // p_t, height // p_h, width // p_w, p_t, p_h, p_w, -1)
        hidden = hidden.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, out, T', p_t, H', p_h, W', p_w)
        return hidden.flatten(6, 7).flatten(4, 5).flatten(2, 3).float()
