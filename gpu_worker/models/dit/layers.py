"""Transformer pieces the dit family's models share: rotary positions over (time, row, column), attention
with query/key normalisation, the MLP, a pre-norm block, timestep embeddings and (un)patchifying.

The layers read nothing from the host (no numpy, no `.item()`, no clock): every forward is tensor
operations only, so it runs the same under torch.compile, FSDP2 and autocast. `randomise` (seeded smoke
weights) and `parameter_count` are the only host-side helpers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_worker.distributed.sequence import Attend, UlyssesAttention

# (query, key, value) each (B, heads, L, head_dim) → (B, heads, L, head_dim). The SR DiT passes its
# block-sparse attention here, and under sequence parallelism both DiTs pass Ulysses around their attention;
# everyone else uses plain SDPA.
AttendFn = Attend
Rope = tuple[Tensor, Tensor]  # (cos, sin), each (L, head_dim / 2)


def rope_axes(head_dim: int, axes: int) -> tuple[int, ...]:
    """Split a head's dimensions between position axes, each an even count. With three axes (time, row,
    column) time gets a quarter and the two spatial axes share the rest."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
    if axes == 1:
        return (head_dim,)
    first = 2 * max(1, head_dim // 8)
    rest = head_dim - first
    per_axis = 2 * (rest // (2 * (axes - 1)))
    sizes = [first] + [per_axis] * (axes - 1)
    sizes[0] += head_dim - sum(sizes)
    return tuple(sizes)


def rope_table(positions: Tensor, head_dim: int, theta: float) -> Rope:
    """positions (L, axes) float → (cos, sin) each (L, head_dim / 2)."""
    angles = []
    for axis, size in enumerate(rope_axes(head_dim, positions.shape[1])):
        exponents = torch.arange(0, size, 2, device=positions.device, dtype=torch.float32) / size
        frequencies = theta**-exponents  # (size / 2,)
        angles.append(positions[:, axis, None].float() * frequencies)  # (L, size / 2)
    table = torch.cat(angles, dim=1)  # (L, head_dim / 2)
    return table.cos(), table.sin()


def apply_rope(x: Tensor, rope: Rope) -> Tensor:
    """Rotate (B, heads, L, head_dim) by the table (half-split convention: first half pairs with second)."""
    cos, sin = (part.to(x.dtype) for part in rope)
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class Attention(nn.Module):
    """Multi-head self-attention with RMS-normalised queries and keys (keeps logits bounded in bf16)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} does not split into {heads} heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.query_norm = nn.RMSNorm(dim // heads)
        self.key_norm = nn.RMSNorm(dim // heads)
        self.out = nn.Linear(dim, dim)

    def forward(
        self, x: Tensor, rope: Rope | None, mask: Tensor | None = None, attend: AttendFn | None = None
    ) -> Tensor:
        if isinstance(attend, UlyssesAttention):
            return self._sequence_parallel(x, rope, attend)
        batch, length, dim = x.shape
        query, key, value = self._project(x, rope, slice(0, self.heads))
        if attend is not None:
            out = attend(query, key, value)
        else:
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        result: Tensor = self.out(out.transpose(1, 2).reshape(batch, length, dim))
        return result

    def _sequence_parallel(self, x: Tensor, rope: Rope | None, attend: UlyssesAttention) -> Tensor:
        """Under SP: projected one head group at a time, and the output projection summed over the groups'
        columns, each as soon as its group is back (see UlyssesAttention)."""
        batch, length, dim = x.shape
        head_dim = dim // self.heads

        def output(heads: slice, out: Tensor) -> Tensor:  # (B, heads in the run, L, hd) → (B, L, D), no bias
            columns = slice(heads.start * head_dim, heads.stop * head_dim)
            return F.linear(out.transpose(1, 2).reshape(batch, length, -1), self.out.weight[:, columns])

        shares = attend.projected(lambda heads: self._project(x, rope, heads), self.heads, output)
        return shares + self.out.bias.to(shares.dtype)

    def _project(self, x: Tensor, rope: Rope | None, heads: slice) -> tuple[Tensor, Tensor, Tensor]:
        """(query, key, value) of a run of heads, each (B, heads in the run, L, head_dim), normalised and rotated."""
        batch, length, dim = x.shape
        head_dim, count = dim // self.heads, heads.stop - heads.start
        if count == self.heads:
            qkv = self.qkv(x)
        else:  # the run's rows of the q, k and v weights (each `dim` rows, head-major)
            parts = [
                slice(part * dim + heads.start * head_dim, part * dim + heads.stop * head_dim) for part in range(3)
            ]
            weight, bias = self.qkv.weight, self.qkv.bias
            qkv = torch.cat([F.linear(x, weight[rows], bias[rows]) for rows in parts], dim=-1)
        query, key, value = qkv.view(batch, length, 3, count, head_dim).permute(2, 0, 3, 1, 4)  # (B, h, L, hd)
        query, key = self.query_norm(query), self.key_norm(key)
        if rope is not None:
            query, key = apply_rope(query, rope), apply_rope(key, rope)
        # Under autocast the norms come out in fp32 and the values in bf16; FlexAttention wants one dtype.
        return query.to(value.dtype), key.to(value.dtype), value


class CrossAttention(nn.Module):
    """Queries from the video tokens, keys and values from conditioning tokens (audio, text)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key_value = nn.Linear(dim, 2 * dim)
        self.query_norm = nn.RMSNorm(dim // heads)
        self.key_norm = nn.RMSNorm(dim // heads)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: Tensor, context: Tensor, mask: Tensor) -> Tensor:
        """x (B, Lq, D), context (B, Lk, D), mask (B, 1, Lq, Lk) bool (True: attend) → (B, Lq, D)."""
        batch, length, dim = x.shape
        head_dim = dim // self.heads
        query = self.query(x).view(batch, length, self.heads, head_dim).transpose(1, 2)  # (B, heads, Lq, hd)
        key_value = self.key_value(context).view(batch, context.shape[1], 2, self.heads, head_dim)
        key, value = key_value.permute(2, 0, 3, 1, 4)  # each (B, heads, Lk, hd)
        query, key = self.query_norm(query).to(value.dtype), self.key_norm(key).to(value.dtype)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
        result: Tensor = self.out(out.transpose(1, 2).reshape(batch, length, dim))
        return result


class MLP(nn.Module):
    def __init__(self, dim: int, ratio: float) -> None:
        super().__init__()
        hidden = int(dim * ratio)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down(F.gelu(self.up(x), approximate="tanh"))
        return out


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + MLP (the encoders' and the SR DiT's block)."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float = 4.0) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, heads)
        self.mlp_norm = nn.LayerNorm(dim)
        self.mlp = MLP(dim, mlp_ratio)

    def forward(
        self, x: Tensor, rope: Rope | None, mask: Tensor | None = None, attend: AttendFn | None = None
    ) -> Tensor:
        x = x + self.attention(self.attention_norm(x), rope, mask, attend)
        out: Tensor = x + self.mlp(self.mlp_norm(x))
        return out


def timestep_embedding(t: Tensor, dim: int, max_period: float = 10_000.0) -> Tensor:
    """Flow time t in [0, 1], shape (...,) → sinusoidal features (..., dim) of 1000 t (DiT's convention)."""
    half = dim // 2
    frequencies = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = 1000.0 * t.float()[..., None] * frequencies  # (..., half)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def patchify(x: Tensor, patch: int) -> Tensor:
    """(B, C, T, H, W) → (B, T, (H/p)(W/p), C p p), row-major patches."""
    batch, channels, frames, height, width = x.shape
    x = x.view(batch, channels, frames, height // patch, patch, width // patch, patch)
    x = x.permute(0, 2, 3, 5, 1, 4, 6)  # (B, T, H/p, W/p, C, p, p)
    return x.reshape(batch, frames, (height // patch) * (width // patch), channels * patch * patch)


def unpatchify(tokens: Tensor, patch: int, channels: int, height: int, width: int) -> Tensor:
    """(B, T, (H/p)(W/p), C p p) → (B, C, T, H, W); the inverse of `patchify`."""
    batch, frames = tokens.shape[:2]
    x = tokens.reshape(batch, frames, height // patch, width // patch, channels, patch, patch)
    x = x.permute(0, 4, 1, 2, 5, 3, 6)  # (B, C, T, H/p, p, W/p, p)
    return x.reshape(batch, channels, frames, height, width)


def grid_positions(frames: Tensor, rows: int, columns: int) -> Tensor:
    """Positions (T * rows * columns, 3) of (time, row, column) for a patch grid on each given frame time."""
    device = frames.device
    row = torch.arange(rows, device=device, dtype=torch.float32)
    column = torch.arange(columns, device=device, dtype=torch.float32)
    time, row_grid, column_grid = torch.meshgrid(frames.float(), row, column, indexing="ij")
    return torch.stack([time, row_grid, column_grid], dim=-1).reshape(-1, 3)


def randomise(model: nn.Module, seed: int) -> None:
    """Redraw every parameter from a seeded generator (fan-in scaled normals; norms at 1): a smoke-test
    model where, unlike a freshly initialised DiT (zero final layers), every input reaches the output.
    Deterministic: the same seed gives the same weights on every machine."""
    generator = torch.Generator().manual_seed(seed)
    norms = (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)
    with torch.no_grad():
        for _, module in sorted(model.named_modules(), key=lambda item: item[0]):
            for name, parameter in sorted(module.named_parameters(recurse=False), key=lambda item: item[0]):
                if isinstance(module, norms):
                    values = torch.ones(parameter.shape) if name == "weight" else torch.zeros(parameter.shape)
                elif parameter.ndim >= 2:
                    fan_in = parameter[0].numel()
                    values = torch.randn(parameter.shape, generator=generator) / math.sqrt(fan_in)
                else:
                    values = 0.02 * torch.randn(parameter.shape, generator=generator)
                parameter.copy_(values)


def parameter_count(model: nn.Module) -> int:
    return sum(parameter.numel() for parameter in model.parameters())
