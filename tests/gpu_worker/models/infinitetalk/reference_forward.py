"""An independent forward of the InfiniteTalk DiT in plain PyTorch, on the original checkpoint's tensor names.

Written from InfiniteTalk's `wan/modules/multitalk_model.py` (WanModel.forward, WanAttentionBlock, WanSelfAttention,
WanI2VCrossAttention, Head, MLPProj, AudioProjModel, rope_params/rope_apply, sinusoidal_embedding_1d) and
`wan/modules/attention.py` (SingleStreamAttention: the one-speaker path of `audio_cross_attn`), with nothing from
diffusers and nothing from gpu_worker but the config dataclass. It reads the tensors under the names the original
modules give them (`time_projection.1`, `cross_attn.k_img`, `audio_cross_attn.kv_linear`, ...), straight from the
files the original loads (the Wan shards, then the adapter file over them: multitalk.py lines 212-224), so the
project's rename map, layout and diffusers-based model are checked against a second reading of the original, not
against themselves. `OriginalState` records which tensors the forward read: every file tensor must be read once
the forward has run, and a name the files lack is a KeyError.

Everything runs in float32 but the rotary embedding, which the original computes in float64 (complex128).
A batch is independent samples (the original runs one speaker per sample: `human_num == 1`).
"""

from __future__ import annotations

from pathlib import Path

import safetensors.torch
import torch
import torch.nn.functional as F
from torch import Tensor

from gpu_worker.models.infinitetalk.config import DiTConfig

# The original's folder layout (multitalk.py lines 212-224; generate_infinitetalk.py's --infinitetalk_dir).
WAN_FOLDER = "Wan2.1-I2V-14B-480P"
ADAPTER_FILE = "InfiniteTalk/single/infinitetalk.safetensors"


class OriginalState:
    """The original checkpoint's tensors by their original names, remembering which ones were read."""

    def __init__(self, tensors: dict[str, Tensor]) -> None:
        self.tensors = tensors
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> Tensor:
        self.read.add(key)
        return self.tensors[key]

    def unread(self) -> set[str]:
        return set(self.tensors) - self.read


def read_original(root: Path) -> OriginalState:
    """The DiT's tensors as the original loads them: every Wan shard, then the adapter file (its tensors win), in
    float32."""
    files = [*sorted((root / WAN_FOLDER).glob("diffusion_pytorch_model-*.safetensors")), root / ADAPTER_FILE]
    merged: dict[str, Tensor] = {}
    for path in files:
        merged.update(safetensors.torch.load_file(path))
    return OriginalState({key: value.float() for key, value in merged.items()})


def _linear(w: OriginalState, name: str, x: Tensor) -> Tensor:
    return F.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])


def _layer_norm(x: Tensor, eps: float, w: OriginalState | None = None, name: str = "") -> Tensor:
    """LayerNorm over the last axis, with the affine parameters `name`.weight/.bias when `w` is given."""
    weight, bias = (w[f"{name}.weight"], w[f"{name}.bias"]) if w is not None else (None, None)
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """WanRMSNorm: over the whole width (every head at once)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _heads(x: Tensor, heads: int) -> Tensor:
    """(B, L, D) → (B, H, L, D / H)."""
    return x.reshape(*x.shape[:-1], heads, -1).transpose(1, 2)


def _attend(query: Tensor, key: Tensor, value: Tensor, heads: int) -> Tensor:
    """Softmax attention with 1/sqrt(head width) scaling: (B, Lq, D), (B, Lk, D), (B, Lk, D) → (B, Lq, D)."""
    q, k, v = _heads(query, heads), _heads(key, heads), _heads(value, heads)
    weights = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)  # (B, H, Lq, Lk)
    return (weights @ v).transpose(1, 2).flatten(2)


def sinusoid(dim: int, timestep: Tensor) -> Tensor:
    """sinusoidal_embedding_1d: cosines then sines of t / 10000^(i / half), in float64 → float32 (B, dim)."""
    half = dim // 2
    angle = timestep.double()[:, None] * torch.pow(10000.0, -torch.arange(half, dtype=torch.float64) / half)
    return torch.cat([angle.cos(), angle.sin()], dim=1).float()


def rotary(config: DiTConfig, frames: int, height: int, width: int) -> Tensor:
    """rope_params per axis (the head's complex pairs split frames : rows : columns as c - 2(c // 3) : c // 3 :
    c // 3, c = head_dim / 2), laid out per token in (frame, row, column) order → (L, head_dim / 2) complex128."""
    pairs = config.head_dim // 2
    sizes = (pairs - 2 * (pairs // 3), pairs // 3, pairs // 3)
    per_axis = []
    for size, count in zip(sizes, (frames, height, width), strict=True):
        inverse = 1.0 / torch.pow(10000.0, torch.arange(0, 2 * size, 2, dtype=torch.float64) / (2 * size))
        angle = torch.outer(torch.arange(count, dtype=torch.float64), inverse)  # (count, size)
        per_axis.append(torch.polar(torch.ones_like(angle), angle))
    f_axis = per_axis[0][:, None, None].expand(frames, height, width, -1)
    h_axis = per_axis[1][None, :, None].expand(frames, height, width, -1)
    w_axis = per_axis[2][None, None, :].expand(frames, height, width, -1)
    return torch.cat([f_axis, h_axis, w_axis], dim=-1).reshape(frames * height * width, pairs)


def _rotate(x: Tensor, freqs: Tensor, heads: int) -> Tensor:
    """rope_apply: each head's adjacent pairs (x[2i], x[2i + 1]) as one complex number times the token's angle,
    in float64 → float32. x (B, L, D), freqs (L, head_dim / 2)."""
    pairs = torch.view_as_complex(x.double().reshape(*x.shape[:-1], heads, -1, 2))  # (B, L, H, head_dim / 2)
    return torch.view_as_real(pairs * freqs[:, None]).flatten(2).float()


def self_attention(w: OriginalState, name: str, x: Tensor, freqs: Tensor, c: DiTConfig) -> Tensor:
    """WanSelfAttention: q, k RMS-normed over the width, rotated; attention over every token; `o`."""
    query = _rotate(_rms_norm(_linear(w, f"{name}.q", x), w[f"{name}.norm_q.weight"], c.eps), freqs, c.num_heads)
    key = _rotate(_rms_norm(_linear(w, f"{name}.k", x), w[f"{name}.norm_k.weight"], c.eps), freqs, c.num_heads)
    value = _linear(w, f"{name}.v", x)
    return _linear(w, f"{name}.o", _attend(query, key, value, c.num_heads))


def text_image_attention(w: OriginalState, name: str, x: Tensor, text: Tensor, image: Tensor, c: DiTConfig) -> Tensor:
    """WanI2VCrossAttention: one query, attending to the text (k, v) and, separately, to the CLIP tokens (k_img,
    v_img); the two results summed before `o`."""
    query = _rms_norm(_linear(w, f"{name}.q", x), w[f"{name}.norm_q.weight"], c.eps)
    key = _rms_norm(_linear(w, f"{name}.k", text), w[f"{name}.norm_k.weight"], c.eps)
    key_img = _rms_norm(_linear(w, f"{name}.k_img", image), w[f"{name}.norm_k_img.weight"], c.eps)
    from_text = _attend(query, key, _linear(w, f"{name}.v", text), c.num_heads)
    from_image = _attend(query, key_img, _linear(w, f"{name}.v_img", image), c.num_heads)
    return _linear(w, f"{name}.o", from_text + from_image)


def audio_attention(w: OriginalState, name: str, x: Tensor, audio: Tensor, c: DiTConfig) -> Tensor:
    """SingleStreamAttention: latent frame t's tokens attend to frame t's audio tokens only. kv_linear's output is
    (2, heads, head_dim) per token: the first half of its width the keys, the second the values.
    x (B, T S, D), audio (B, T, M, Da) → (B, T S, D)."""
    batch, frames = audio.shape[:2]
    query = _linear(w, f"{name}.q_linear", x).reshape(batch * frames, -1, c.dim)  # (B T, S, D)
    key, value = _linear(w, f"{name}.kv_linear", audio).flatten(0, 1).chunk(2, dim=-1)  # each (B T, M, D)
    out = _attend(query, key, value, c.num_heads).reshape(batch, -1, c.dim)
    return _linear(w, f"{name}.proj", out)


def audio_tokens(w: OriginalState, audio: Tensor, c: DiTConfig) -> Tensor:
    """AudioProjModel on WanModel.forward's windows. The first latent stands for the first video frame: its whole
    window. Each later latent stands for `vae_scale` frames: the first one's window up to and including its centre,
    the centres of the ones between, the last one's window from its centre on. audio (B, F, W, K, C) with
    F = 1 + vae_scale (T - 1) → (B, T, context_tokens, output_dim)."""
    centre, stride = c.audio_window // 2, c.vae_scale
    latents = 1 + (audio.shape[1] - 1) // stride
    later = []
    for t in range(1, latents):
        group = audio[:, 1 + stride * (t - 1) : 1 + stride * t]  # (B, stride, W, K, C)
        pieces = [group[:, 0, : centre + 1]]
        pieces += [group[:, i, centre : centre + 1] for i in range(1, stride - 1)]
        pieces.append(group[:, stride - 1, centre:])
        later.append(torch.cat(pieces, dim=1).flatten(1))  # (B, (W + stride - 1) K C)
    first = torch.relu(_linear(w, "audio_proj.proj1", audio[:, 0].flatten(1)))[:, None]  # (B, 1, I)
    rest = torch.relu(_linear(w, "audio_proj.proj1_vf", torch.stack(later, dim=1)))  # (B, T - 1, I)
    hidden = torch.relu(_linear(w, "audio_proj.proj2", torch.cat([first, rest], dim=1)))
    tokens = _linear(w, "audio_proj.proj3", hidden).reshape(*hidden.shape[:-1], c.context_tokens, c.output_dim)
    return _layer_norm(tokens, 1e-5, w, "audio_proj.norm") if c.norm_output_audio else tokens  # nn.LayerNorm


def block(w: OriginalState, n: int, x: Tensor, e0: Tensor, inputs: dict[str, Tensor], c: DiTConfig) -> Tensor:
    """WanAttentionBlock: modulated self-attention, text+image cross-attention after norm3, the audio
    cross-attention after norm_x, modulated feed-forward. `inputs`: freqs, text, image, audio (tokens)."""
    name = f"blocks.{n}"
    shift, scale, gate, ffn_shift, ffn_scale, ffn_gate = (w[f"{name}.modulation"] + e0).unbind(1)  # each (B, D)
    normed = _layer_norm(x, c.eps) * (1 + scale[:, None]) + shift[:, None]
    x = x + self_attention(w, f"{name}.self_attn", normed, inputs["freqs"], c) * gate[:, None]
    normed = _layer_norm(x, c.eps, w, f"{name}.norm3")
    x = x + text_image_attention(w, f"{name}.cross_attn", normed, inputs["text"], inputs["image"], c)
    normed = _layer_norm(x, c.eps, w, f"{name}.norm_x") if c.norm_input_visual else x
    x = x + audio_attention(w, f"{name}.audio_cross_attn", normed, inputs["audio"], c)
    normed = _layer_norm(x, c.eps) * (1 + ffn_scale[:, None]) + ffn_shift[:, None]
    hidden = F.gelu(_linear(w, f"{name}.ffn.0", normed), approximate="tanh")
    return x + _linear(w, f"{name}.ffn.2", hidden) * ffn_gate[:, None]


def reference_forward(
    w: OriginalState, c: DiTConfig, latents: Tensor, timestep: Tensor, text: Tensor, image: Tensor, audio: Tensor
) -> Tensor:
    """WanModel.forward. latents (B, in_dim, T, H, W) (noise, mask and reference latents already stacked, as the
    original's `x` and `y`); timestep (B,); text (B, text_len, text_dim); image (B, 257, image_dim) CLIP tokens (the
    original concatenates them before the text and splits them off again at 257);
    audio (B, 1 + vae_scale (T - 1), audio_window, audio_blocks, audio_channels) → (B, out_dim, T, H, W)."""
    p_t, p_h, p_w = c.patch_size
    x = F.conv3d(latents, w["patch_embedding.weight"], w["patch_embedding.bias"], stride=c.patch_size)
    frames, height, width = x.shape[2:]
    x = x.flatten(2).transpose(1, 2)  # (B, L, D), tokens in (frame, row, column) order
    e = _linear(w, "time_embedding.2", F.silu(_linear(w, "time_embedding.0", sinusoid(c.freq_dim, timestep))))
    e0 = _linear(w, "time_projection.1", F.silu(e)).reshape(-1, 6, c.dim)  # (B, 6, D)
    text = _linear(w, "text_embedding.2", F.gelu(_linear(w, "text_embedding.0", text), approximate="tanh"))
    image = _layer_norm(image, 1e-5, w, "img_emb.proj.0")  # MLPProj: nn.LayerNorm's default eps
    image = _linear(w, "img_emb.proj.3", F.gelu(_linear(w, "img_emb.proj.1", image)))
    image = _layer_norm(image, 1e-5, w, "img_emb.proj.4")
    inputs = {"freqs": rotary(c, frames, height, width), "text": text, "image": image}
    inputs["audio"] = audio_tokens(w, audio, c)
    for n in range(c.num_layers):
        x = block(w, n, x, e0, inputs, c)
    shift, scale = (w["head.modulation"] + e[:, None]).unbind(1)  # Head: (1, 2, D) + (B, 1, D)
    out = _linear(w, "head.head", _layer_norm(x, c.eps) * (1 + scale[:, None]) + shift[:, None])
    # unpatchify: (B, f h w, p_t p_h p_w c) → (B, c, f p_t, h p_h, w p_w)
    out = out.reshape(out.shape[0], frames, height, width, p_t, p_h, p_w, c.out_dim)
    out = torch.einsum("bfhwpqrc->bcfphqwr", out)
    return out.reshape(out.shape[0], c.out_dim, frames * p_t, height * p_h, width * p_w)
