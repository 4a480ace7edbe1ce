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

Precision as the original's (multitalk_model.py, the `amp.autocast(dtype=torch.float32)` sections): the modulation
(the time embedding and `time_proj`) and the output head (`norm_out`, its scale/shift, `proj_out`) run in fp32
whatever the model's dtype, their parameters kept in fp32 (`FP32_PARAMETERS`, which checkpoint.convert leaves
uncast) and autocast off around them. The rotary tables are float64 (`Float64Rotary`, the original's float64
frequencies), applied to each head's values in float64 and rounded once.

Sequence parallelism (gpu_worker/distributed/sequence.py), as the dit family's A2V DiT does it: under `current_sp()`
each rank keeps a contiguous run of the patch tokens (`SequenceShard` over single tokens, so a latent frame may
straddle two ranks) and the rotary rows of those tokens, and runs the modulation, norms, feed-forward and the
text+image cross-attention (its context replicated: 257 + 512 tokens) on them alone. The self-attention goes through
`UlyssesAttention` (`_ulysses_self_attention`: WanAttnProcessor's steps, its RMS norm across heads on each rank's own
tokens before the exchange, which needs a token's whole width and nothing else); the audio cross-attention takes
each local token to its own latent frame's audio tokens, a frame cut by the split in two runs (`frame_runs`). The
output patches are all-gathered, so every rank returns the whole velocity. Without a group the path is unchanged.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager, nullcontext

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.normalization import FP32LayerNorm
from diffusers.models.transformers.transformer_wan import (
    WanAttention,
    WanRotaryPosEmbed,
    WanTimeTextImageEmbedding,
    WanTransformerBlock,
)
from torch import Tensor, nn

from gpu_worker.distributed.sequence import SequenceShard, UlyssesAttention, current_sp, gather_frames, model_group
from gpu_worker.models.infinitetalk.config import DiTConfig

Rotary = tuple[Tensor, Tensor]  # diffusers' (cos, sin), each (1, L, 1, head_dim) float64


def no_autocast(device: torch.device) -> AbstractContextManager[object]:
    """Autocast off on `device` (nothing to turn off where it has none: the meta device FLOPs are counted on)."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return nullcontext()


class Float64Rotary(WanRotaryPosEmbed):
    """diffusers' Wan rotary embedding with its tables kept in float64, as the original's rope_params and rope_apply
    (multitalk_model.py: complex128 frequencies, each head's values rotated in float64); diffusers computes them in
    float64 and rounds them to fp32. The rotation (`_rotate`, WanAttnProcessor's) then runs in float64 and rounds
    once to the values' dtype. MPS has no float64: there the tables stay fp32, as diffusers keeps them."""

    def __init__(self, head_dim: int, patch_size: tuple[int, int, int], max_seq_len: int, theta: float = 10000.0):
        super().__init__(head_dim, patch_size, max_seq_len, theta)
        dtype = torch.float32 if torch.backends.mps.is_available() else torch.float64
        angles = []
        for dim in (self.t_dim, self.h_dim, self.w_dim):
            inverse = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            angles.append(torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inverse).repeat_interleave(2, 1))
        angle = torch.cat(angles, dim=1)  # (max_seq_len, head_dim), pairs interleaved as diffusers lays them out
        self.register_buffer("freqs_cos", angle.cos().to(dtype), persistent=False)
        self.register_buffer("freqs_sin", angle.sin().to(dtype), persistent=False)


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


def frame_runs(first: int, count: int, per_frame: int) -> list[tuple[slice, slice]]:
    """Tokens [first, first + count) of a sequence of latent frames of `per_frame` tokens each → runs of (the
    run's tokens among these, its latent frames): a frame cut at either end of the range a run of its own, the
    whole frames between one run."""
    runs, token, end = [], first, first + count
    while token < end:
        frame = token // per_frame
        if token % per_frame or end < (frame + 1) * per_frame:  # a frame the range cuts
            stop, frames = min(end, (frame + 1) * per_frame), slice(frame, frame + 1)
        else:
            stop, frames = end // per_frame * per_frame, slice(frame, end // per_frame)
        runs.append((slice(token - first, stop - first), frames))
        token = stop
    return runs


class AudioCrossAttention(nn.Module):
    """Each latent frame's video tokens attend to that frame's audio tokens (one speaker)."""

    def __init__(self, dim: int, audio_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_linear = nn.Linear(dim, dim)
        self.kv_linear = nn.Linear(audio_dim, 2 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, hidden: Tensor, audio: Tensor, shard: SequenceShard | None = None) -> Tensor:
        """hidden (B, T S, D) for T latent frames of S tokens; audio (B, T, M, Da) → (B, T S, D). Under SP, hidden
        is `shard`'s tokens only (B, L_local, D), in runs of the frames they belong to (`frame_runs`)."""
        if shard is None:
            return self.proj(self._attend(self.q_linear(hidden), self.kv_linear(audio)))
        per_frame = sum(shard.token_counts) // audio.shape[1]
        query, key_value = self.q_linear(hidden), self.kv_linear(audio)  # (B, L_local, D), (B, T, M, 2 D)
        runs = frame_runs(shard.tokens.start, hidden.shape[1], per_frame)
        parts = [self._attend(query[:, tokens], key_value[:, frames]) for tokens, frames in runs]
        return self.proj(torch.cat(parts, dim=1) if parts else query)  # no tokens here: (B, 0, D)

    def _attend(self, query: Tensor, key_value: Tensor) -> Tensor:
        """query (B, n s, D) of n frames' (parts of frames') s tokens each, key_value (B, n, M, 2 D) → (B, n s, D)."""
        batch, length, dim = query.shape
        frames, tokens = key_value.shape[1], key_value.shape[2]
        query = query.reshape(batch * frames, length // frames, self.heads, -1).transpose(1, 2)  # (B n, H, s, Dh)
        key_value = key_value.reshape(batch * frames, tokens, 2, self.heads, -1)  # (B n, M, 2, H, Dh)
        key, value = key_value.permute(2, 0, 3, 1, 4).unbind(0)  # each (B n, H, M, Dh)
        attended = F.scaled_dot_product_attention(query, key, value)  # (B n, H, s, Dh)
        return attended.transpose(1, 2).reshape(batch, length, dim)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """WanAttnProcessor's rotary step (interleaved pairs), x (B, L, H, Dh), cos/sin (1, L, 1, Dh)."""
    first, second = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = first * cos - second * sin
    out[..., 1::2] = first * sin + second * cos
    return out.type_as(x)


def _dispatch(query: Tensor, key: Tensor, value: Tensor) -> Tensor:
    """diffusers' attention dispatch (its active backend, as WanAttnProcessor calls it) on (B, H, L, Dh) tensors."""
    out: Tensor = dispatch_attention_fn(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2))
    return out.transpose(1, 2)


def _ulysses_self_attention(attn: WanAttention, hidden: Tensor, rotary: Rotary, attend: UlyssesAttention) -> Tensor:
    """`attn` (a self-attention: WanAttnProcessor without the image keys) on this rank's tokens (B, L_local, D): the
    projections, the RMS norms across heads (a token's whole width, which its rank holds) and the rotary here, for
    every head at once (the norms need them all, so unlike the dit family's layers no group is projected on demand),
    the attention over every token through Ulysses, one head group's exchange at a time, and the output projection
    summed over the head groups' columns, each as soon as its group is back (see UlyssesAttention)."""
    query = attn.norm_q(attn.to_q(hidden)).unflatten(2, (attn.heads, -1))  # (B, L_local, H, Dh)
    key = attn.norm_k(attn.to_k(hidden)).unflatten(2, (attn.heads, -1))
    value = attn.to_v(hidden).unflatten(2, (attn.heads, -1))
    query, key = _rotate(query, *rotary), _rotate(key, *rotary)
    query, key, value = (x.transpose(1, 2) for x in (query, key, value))  # (B, H, L_local, Dh)
    out_proj, head_dim = attn.to_out[0], query.shape[-1]

    def output(heads: slice, out: Tensor) -> Tensor:  # (B, heads in the run, L_local, Dh) → (B, L_local, D), no bias
        columns = slice(heads.start * head_dim, heads.stop * head_dim)
        return F.linear(out.transpose(1, 2).flatten(2).type_as(query), out_proj.weight[:, columns])

    shares = attend.projected(lambda heads: (query[:, heads], key[:, heads], value[:, heads]), attn.heads, output)
    result: Tensor = attn.to_out[1](shares + out_proj.bias)
    return result


class InfiniteTalkBlock(WanTransformerBlock):
    """diffusers' Wan block (self-attention, text+image cross-attention, feed-forward) with the audio step."""

    def __init__(self, config: DiTConfig) -> None:
        dim = config.dim
        super().__init__(dim, config.ffn_dim, config.num_heads, "rms_norm_across_heads", True, config.eps, dim)
        self.audio_cross_attn = AudioCrossAttention(dim, config.output_dim, config.num_heads)
        # WanLayerNorm with affine (multitalk_model.py line 271): computed in fp32, as FP32LayerNorm does.
        self.norm_x: nn.Module = FP32LayerNorm(dim, config.eps) if config.norm_input_visual else nn.Identity()

    def forward(  # type: ignore[override]
        self,
        hidden: Tensor,
        context: Tensor,
        modulation: Tensor,
        rotary: Rotary,
        audio: Tensor,
        attend: UlyssesAttention | None = None,
        shard: SequenceShard | None = None,
    ) -> Tensor:
        """hidden (B, L, D); context (B, 257 + 512, D); modulation (B, 6, D); audio (B, T, M, Da). Under SP
        (`attend` and `shard`), hidden and rotary are `shard`'s tokens only."""
        shift, scale, gate, ffn_shift, ffn_scale, ffn_gate = (self.scale_shift_table + modulation.float()).chunk(6, 1)
        normed = (self.norm1(hidden.float()) * (1 + scale) + shift).type_as(hidden)
        if attend is None:
            attended = self.attn1(normed, None, None, rotary)
        else:
            attended = _ulysses_self_attention(self.attn1, normed, rotary, attend)
        hidden = (hidden.float() + attended * gate).type_as(hidden)
        hidden = hidden + self.attn2(self.norm2(hidden.float()).type_as(hidden), context, None, None)
        hidden = hidden + self.audio_cross_attn(self.norm_x(hidden).type_as(hidden), audio, shard)
        normed = (self.norm3(hidden.float()) * (1 + ffn_scale) + ffn_shift).type_as(hidden)
        return (hidden.float() + self.ffn(normed).float() * ffn_gate).type_as(hidden)


class InfiniteTalkDiT(nn.Module):
    """Noisy latents + mask + encoded reference video → the flow velocity, conditioned on the timestep, text, the
    CLIP image tokens and the audio windows."""

    # Parameter names (prefixes) stored in fp32 whatever the model's dtype: the modulation and the output head.
    FP32_PARAMETERS = (
        "condition_embedder.time_embedder.",
        "condition_embedder.time_proj.",
        "scale_shift_table",
        "proj_out.",
    )

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        dim = config.dim
        self.rope = Float64Rotary(config.head_dim, config.patch_size, 1024)
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
        time, modulation = self.modulation(timestep)
        text = self.condition_embedder.text_embedder(text)
        image = self.condition_embedder.image_embedder(image)
        context = torch.cat([image, text], dim=1)  # image tokens first, as the processor splits them off
        first, later = latent_audio_windows(audio, self.config.audio_window, self.config.vae_scale)
        audio_tokens = self.audio_proj(first, later).to(hidden.dtype)  # (B, T, tokens, width)
        attend, shard = None, None
        sp = current_sp()
        if sp is not None:  # this rank's run of tokens and their rotary rows; a frame may straddle two ranks
            sp = model_group("the InfiniteTalk DiT", self.config.num_heads, sp)
            shard = SequenceShard.split(sp, hidden.shape[1])
            hidden, rotary = hidden[:, shard.tokens], (rotary[0][:, shard.tokens], rotary[1][:, shard.tokens])
            attend = shard.attend(_dispatch)
        for block in self.blocks:
            hidden = block(hidden, context, modulation, rotary, audio_tokens, attend, shard)
        hidden = self.head(hidden, time)  # (B, L, p_t p_h p_w out) fp32; under SP (B, L_local, ...)
        if shard is not None and sp is not None:  # every rank's tokens in order: (B, L, p_t p_h p_w out)
            hidden = gather_frames(hidden, 1, shard.token_counts, sp)
        hidden = hidden.reshape(batch, frames // p_t, height // p_h, width // p_w, p_t, p_h, p_w, -1)
        hidden = hidden.permute(0, 7, 1, 4, 2, 5, 3, 6)  # (B, out, T', p_t, H', p_h, W', p_w)
        return hidden.flatten(6, 7).flatten(4, 5).flatten(2, 3).float()

    def modulation(self, timestep: Tensor) -> tuple[Tensor, Tensor]:
        """timestep (B,) → the time embedding (B, D) and the blocks' modulation (B, 6, D), both fp32 (autocast off,
        fp32 parameters), as the original's time_embedding and time_projection."""
        embedder = self.condition_embedder
        with no_autocast(timestep.device):
            time = embedder.time_embedder(embedder.timesteps_proj(timestep).float())
            modulation = embedder.time_proj(embedder.act_fn(time))
        return time, modulation.unflatten(1, (6, -1))

    def head(self, hidden: Tensor, time: Tensor) -> Tensor:
        """The output norm, its scale/shift from the time embedding (B, D) and `proj_out`, in fp32 as the
        original's head: hidden (B, L, D) in the model's dtype → (B, L, p_t p_h p_w out) fp32."""
        with no_autocast(hidden.device):
            shift, scale = (self.scale_shift_table.float() + time.float().unsqueeze(1)).chunk(2, dim=1)
            normed = self.norm_out(hidden.float()) * (1 + scale) + shift
            out: Tensor = self.proj_out(normed)  # its parameters fp32 (FP32_PARAMETERS)
            return out
