"""The audio-to-video DiT: a chunk's low-resolution latents from noise, trained with flow matching.

It works on the VAE's latent grid: one latent frame per `VAEConfig.temporal_stride` (4) video frames, so
time positions (RoPE, boundary offsets) count latents; only the audio keeps the video frame rate.

One token sequence per chunk, `[noisy chunk frames | clean boundary frames | reference frame]`:
- the chunk's noisy latents, patchified (what the model denoises; only these produce output);
- clean boundary latents of the neighbouring chunks: for an N chunk the previous N chunk's last frames,
  for an I chunk both anchors (the N chunk before and the one after), at their true frame offsets, so
  motion continues across the seam and an I chunk lands on its right anchor;
- the portrait's latents, all of its patches ("rich" reference tokens: identity and texture, not a
  pooled vector), at a fixed time (`A2VConfig.reference_position`).
Self-attention is dense over the whole sequence. Clean tokens are modulated as t = 0 (per-segment
adaLN), noisy ones at the sampling time. Audio and text enter by cross-attention from the noisy tokens
only: latent j's tokens see the audio tokens of its video frames [4 j, 4 j + 4) widened by `audio_window`
video frames either side, and every text token.
Classifier-free guidance swaps the audio for learned null tokens and drops the text.

Sequence parallelism (gpu_worker/distributed/sequence.py): under `current_sp()` each rank keeps a
contiguous, equal run of the sequence's tokens (the whole concatenation `[noisy | boundary | reference]`
split by tokens, so a frame may straddle two ranks; RoPE rows and cross-attention mask rows are per token and
sliced alike), runs everything on those tokens and self-attends through Ulysses all-to-alls; cross-attention
runs locally against the replicated audio and text (their keys and values are small). The noisy tokens'
outputs are all-gathered, so every rank returns the whole velocity.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_worker.distributed.sequence import SequenceShard, current_sp, gather_frames, model_group
from gpu_worker.models.dit.config import DiTConfig
from gpu_worker.models.dit.flow import VelocityFn
from gpu_worker.models.dit.layers import (
    MLP,
    AttendFn,
    Attention,
    CrossAttention,
    Rope,
    grid_positions,
    patchify,
    rope_table,
    timestep_embedding,
    unpatchify,
)

_NOISY, _BOUNDARY, _REFERENCE = 0, 1, 2
_TIME_FEATURES = 256


@dataclass(frozen=True)
class A2VConditioning:
    """Everything the DiT sees besides the noisy latents (all on the model's device)."""

    reference: Tensor  # (B, C, h, w) the portrait's low-resolution latents
    boundary: Tensor  # (B, C, Tb, h, w) clean latents of neighbouring chunks; Tb may be 0
    boundary_times: Tensor  # (Tb,) their latent frames relative to the chunk's first latent (negative: before it)
    audio: Tensor  # (B, Ta, K, Da) K audio tokens per *video* frame of the audio window
    audio_times: Tensor  # (Ta,) those video frames relative to the chunk's first video frame
    text: Tensor  # (B, Lt, Dt) prompt tokens; Lt may be 0
    text_mask: Tensor  # (B, Lt) bool, True for real tokens
    keep_audio: Tensor  # (B,) bool; False: the unconditional branch (null audio, no text)

    def with_unconditional(self) -> A2VConditioning:
        """This batch followed by its unconditional copy (for one batched guidance pass)."""

        def twice(x: Tensor) -> Tensor:
            return torch.cat([x, x])

        return replace(
            self,
            reference=twice(self.reference),
            boundary=twice(self.boundary),
            audio=twice(self.audio),
            text=twice(self.text),
            text_mask=twice(self.text_mask),
            keep_audio=torch.cat([self.keep_audio, torch.zeros_like(self.keep_audio)]),
        )


# (noisy (B, C, T, h, w), t (B,), conditioning) → velocity: the DiT's forward, or its compiled step.
StepFn = Callable[[Tensor, Tensor, A2VConditioning], Tensor]


def _segments(values: Tensor, noisy: int, length: int) -> Tensor:
    """(B, 2, D) per-segment values → (B, L, D): the first `noisy` tokens take [:, 0], the rest [:, 1]."""
    return torch.cat([values[:, :1].expand(-1, noisy, -1), values[:, 1:].expand(-1, length - noisy, -1)], dim=1)


class A2VBlock(nn.Module):
    """adaLN-Zero DiT block with cross-attention to the audio and text tokens."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attention = Attention(dim, heads)
        self.cross_norm = nn.LayerNorm(dim)
        self.cross_attention = CrossAttention(dim, heads)
        self.mlp_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.mlp = MLP(dim, mlp_ratio)
        self.modulation = nn.Linear(dim, 6 * dim)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def forward(
        self,
        x: Tensor,
        time: Tensor,
        noisy: int,
        rope: Rope,
        condition: Tensor,
        cross_mask: Tensor,
        attend: AttendFn | None = None,
    ) -> Tensor:
        """x (B, L, D); time (B, 2, D) the noisy and clean segments' embeddings; condition (B, Lc, D).
        `attend`: the self-attention (None: dense SDPA; under SP, Ulysses around it)."""
        length = x.shape[1]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = (
            _segments(part, noisy, length) for part in self.modulation(time).chunk(6, dim=-1)
        )
        x = x + gate_a * self.attention(self.attention_norm(x) * (1 + scale_a) + shift_a, rope, attend=attend)
        chunk = x[:, :noisy]
        chunk = chunk + self.cross_attention(self.cross_norm(chunk), condition, cross_mask)
        x = torch.cat([chunk, x[:, noisy:]], dim=1)
        out: Tensor = x + gate_m * self.mlp(self.mlp_norm(x) * (1 + scale_m) + shift_m)
        return out


class AudioToVideoDiT(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        a2v, channels = config.a2v, config.latent_channels
        self.config = a2v
        self.channels = channels
        self.stride = config.vae.temporal_stride  # video frames per latent frame
        self.embed = nn.Linear(channels * a2v.patch**2, a2v.dim)
        self.token_type = nn.Parameter(torch.zeros(3, a2v.dim))  # noisy, boundary, reference
        self.time_mlp = nn.Sequential(nn.Linear(_TIME_FEATURES, a2v.dim), nn.SiLU(), nn.Linear(a2v.dim, a2v.dim))
        self.audio_proj = nn.Linear(config.audio.dim, a2v.dim)
        self.text_proj = nn.Linear(config.text.dim, a2v.dim)
        self.null_audio = nn.Parameter(torch.zeros(config.audio.tokens_per_frame, a2v.dim))
        self.blocks = nn.ModuleList(A2VBlock(a2v.dim, a2v.heads, a2v.mlp_ratio) for _ in range(a2v.layers))
        self.norm_out = nn.LayerNorm(a2v.dim, elementwise_affine=False, eps=1e-6)
        self.modulation_out = nn.Linear(a2v.dim, 2 * a2v.dim)
        self.head = nn.Linear(a2v.dim, channels * a2v.patch**2)
        nn.init.normal_(self.token_type, std=0.02)
        for layer in (self.modulation_out, self.head):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, noisy: Tensor, t: Tensor, cond: A2VConditioning) -> Tensor:
        """noisy (B, C, T, h, w) latents at flow time t (B,) → velocity (B, C, T, h, w)."""
        a2v = self.config
        batch, _, frames, height, width = noisy.shape
        rows, columns = height // a2v.patch, width // a2v.patch
        chunk = self.embed(patchify(noisy, a2v.patch)) + self.token_type[_NOISY]  # (B, T, N, D)
        boundary = self.embed(patchify(cond.boundary, a2v.patch)) + self.token_type[_BOUNDARY]  # (B, Tb, N, D)
        reference = self.embed(patchify(cond.reference[:, :, None], a2v.patch)) + self.token_type[_REFERENCE]
        x = torch.cat([chunk.flatten(1, 2), boundary.flatten(1, 2), reference.flatten(1, 2)], dim=1)  # (B, L, D)
        noisy_tokens = frames * rows * columns

        device = noisy.device
        times = torch.cat(
            [
                torch.arange(frames, device=device, dtype=torch.float32),
                cond.boundary_times.float(),
                torch.full((1,), a2v.reference_position, device=device),
            ]
        )
        rope = rope_table(grid_positions(times, rows, columns), a2v.dim // a2v.heads, a2v.rope_theta)

        # The noisy segment at t, the clean segments at t = 0: (B, 2, D).
        both = torch.stack([t.float(), torch.zeros_like(t, dtype=torch.float32)], dim=1)
        time = F.silu(self.time_mlp(timestep_embedding(both, _TIME_FEATURES).to(x.dtype)))

        condition, cross_mask = self._condition(cond, frames, rows * columns)
        attend: AttendFn | None = None
        sp = current_sp()
        if sp is not None:
            sp = model_group("the audio-to-video DiT", a2v.heads, sp)
            shard = SequenceShard.split(sp, x.shape[1])  # by tokens: a frame may straddle two ranks
            tokens = shard.tokens
            x, rope = x[:, tokens], (rope[0][tokens], rope[1][tokens])
            # The noisy tokens come first, so this rank's noisy tokens are a prefix of its own.
            noisy_tokens = shard.counts_within(0, noisy_tokens)[sp.rank]
            cross_mask = cross_mask[:, :, tokens.start : tokens.start + noisy_tokens]
            attend = shard.attend(_dense)
        for block in self.blocks:
            x = block(x, time, noisy_tokens, rope, condition, cross_mask, attend)

        shift, scale = self.modulation_out(time[:, 0]).chunk(2, dim=-1)  # each (B, D)
        out = self.norm_out(x[:, :noisy_tokens]) * (1 + scale[:, None]) + shift[:, None]
        patches = self.head(out)  # (B, noisy tokens here, C p p)
        if sp is not None:  # every rank's noisy tokens in order: (B, T N, C p p)
            patches = gather_frames(patches, 1, shard.counts_within(0, frames * rows * columns), sp)
        patches = patches.view(batch, frames, rows * columns, self.head.out_features)
        return unpatchify(patches, a2v.patch, self.channels, height, width)

    def _condition(self, cond: A2VConditioning, frames: int, per_frame: int) -> tuple[Tensor, Tensor]:
        """Audio and text tokens (B, Ta K + Lt, D) and the cross-attention mask (B, 1, T N, Ta K + Lt)."""
        batch, _, per_audio_frame = cond.audio.shape[:3]
        audio = self.audio_proj(cond.audio)  # (B, Ta, K, D)
        keep = cond.keep_audio.view(batch, 1, 1, 1)
        audio = torch.where(keep, audio, self.null_audio.to(audio.dtype).expand_as(audio)).flatten(1, 2)
        text = self.text_proj(cond.text)  # (B, Lt, D)

        # Latent j covers video frames [stride j, stride j + stride): it hears them, ± audio_window frames.
        first = torch.arange(frames, device=audio.device, dtype=torch.float32)[:, None] * self.stride  # (T, 1)
        audio_times = cond.audio_times.float().repeat_interleave(per_audio_frame)[None]  # (1, Ta K)
        window = self.config.audio_window
        near = (audio_times >= first - window) & (audio_times <= first + self.stride - 1 + window)  # (T, Ta K)
        near = near.repeat_interleave(per_frame, dim=0)  # (T N, Ta K)
        text_mask = cond.text_mask & cond.keep_audio[:, None]  # (B, Lt): the unconditional branch drops text
        mask = torch.cat(
            [
                near[None].expand(batch, -1, -1),
                text_mask[:, None, :].expand(-1, near.shape[0], -1),
            ],
            dim=2,
        )
        return torch.cat([audio, text], dim=1), mask[:, None]


def _dense(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(query, key, value)


def guided_velocity(model: StepFn, cond: A2VConditioning, guidance_scale: float) -> VelocityFn:
    """The sampler's velocity: the conditional prediction, or with guidance above 1, the unconditional one
    pushed towards it (both in one batch of 2 B). `model` is the DiT or its compiled step (gpu_worker/compiled.py)."""
    if guidance_scale == 1.0:
        return lambda x, t: model(x, t, cond)
    doubled = cond.with_unconditional()

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        conditional, unconditional = model(torch.cat([x, x]), torch.cat([t, t]), doubled).chunk(2)
        guided: Tensor = unconditional + guidance_scale * (conditional - unconditional)
        return guided

    return velocity
