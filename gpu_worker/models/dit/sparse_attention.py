"""Frame-aligned window-sparse attention for the super-resolution DiT.

The sequence is frames laid end to end, the reference frame first: `[ref][f0][f1]…`, each frame padded
to `tokens_per_frame`, a multiple of `block_size`. A video frame's queries attend to the frames within
± `window` and to the reference frame; the reference frame attends to itself only (so its tokens are
the same in every chunk). Because blocks never straddle a frame edge, every (query block, key block)
pair is wholly allowed or wholly masked: the kernel skips masked blocks and never evaluates a mask
inside a block (`BlockMask.kv_num_blocks`, the count of partial blocks, is zero).

Four implementations of the same function, chosen by `SRConfig.attention`:
- `flex`: `torch.compile(flex_attention)` with a block mask. The production path on CUDA (Triton kernels;
  ../shared/GPU_NOTES.md measured 426 useful TFLOP/s on an H200 with 3584-token frames at ±1). On the
  CPU build of torch 2.13 it compiles too, through Inductor's C++ template, and matches `dense`, but the
  first call per sequence length takes 13-20 s: not the CPU default (one small test compiles it).
- `flex_eager`: the same call without compilation. Torch runs an unfused reference implementation
  that materialises the whole score matrix (and warns; we silence that one warning on purpose). Slow,
  but it runs the real block mask on CPU: the tests compare it with `dense`.
- `dense`: SDPA with the equivalent boolean (L, L) mask: the definition, quadratic in memory.
- `windowed`: SDPA per query frame over its key window, the CPU default: exact, memory linear in the
  window, no compilation.
`auto` is `flex` on CUDA with 128-token blocks (the h200 preset) and `windowed` otherwise (CPU, and the
tiny preset's 16-token blocks, smaller than a Triton tile).

`window_stats` reports the blocks skipped and the useful FLOPs (only allowed query-key pairs count),
so a benchmark divides by the kernel time to get useful TFLOP/s (`python -m
gpu_worker.models.dit.bench_attention`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from gpu_worker.models.dit.config import AttentionBackend

_EAGER_WARNING = "flex_attention called without torch.compile"


@dataclass(frozen=True)
class FrameWindow:
    """The layout of one SR sequence: `frames` frames (the reference first) of `tokens_per_frame` tokens."""

    frames: int
    tokens_per_frame: int
    window: int
    block_size: int

    def __post_init__(self) -> None:
        if self.tokens_per_frame % self.block_size:
            raise ValueError(
                f"tokens per frame ({self.tokens_per_frame}) must be a multiple of the block size "
                f"({self.block_size}), so no attention block straddles a frame edge"
            )

    @property
    def length(self) -> int:
        return self.frames * self.tokens_per_frame

    def frame_allowed(self, device: torch.device | str = "cpu") -> Tensor:
        """(frames, frames) bool: may query frame i attend to key frame j."""
        index = torch.arange(self.frames, device=device)
        query, key = index[:, None], index[None, :]
        return (key == 0) | ((query > 0) & ((query - key).abs() <= self.window))

    def dense_mask(self, device: torch.device | str = "cpu") -> Tensor:
        """(L, L) bool, the frame mask expanded to tokens."""
        per_frame = self.tokens_per_frame
        return self.frame_allowed(device).repeat_interleave(per_frame, 0).repeat_interleave(per_frame, 1)

    def key_spans(self, query_frame: int) -> list[tuple[int, int]]:
        """The key frames of one query frame as [start, end) runs: the reference and the window."""
        if query_frame == 0:
            return [(0, 1)]
        first, end = max(1, query_frame - self.window), min(self.frames, query_frame + self.window + 1)
        return [(0, end)] if first == 1 else [(0, 1), (first, end)]


def _mask_mod(layout: FrameWindow) -> Any:
    per_frame, window = layout.tokens_per_frame, layout.window

    def allowed(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        query_frame, key_frame = query // per_frame, key // per_frame
        return (key_frame == 0) | ((query_frame > 0) & ((query_frame - key_frame).abs() <= window))

    return allowed


@lru_cache(maxsize=16)
def block_mask(layout: FrameWindow, device: str) -> BlockMask:
    """FlexAttention's block mask for a layout (cached: a chunk's layers and steps share one)."""
    return create_block_mask(
        _mask_mod(layout), None, None, layout.length, layout.length, device=device, BLOCK_SIZE=layout.block_size
    )


@lru_cache(maxsize=1)
def _compiled_flex() -> Any:
    # One compiled function for the process; Dynamo recompiles it once per new sequence length (N chunks,
    # I chunks and the last chunk: a handful of shapes per session).
    return torch.compile(flex_attention, dynamic=False)


def window_attention(
    query: Tensor, key: Tensor, value: Tensor, layout: FrameWindow, backend: AttentionBackend
) -> Tensor:
    """query, key, value (B, heads, L, head_dim) with L = layout.length → (B, heads, L, head_dim)."""
    if backend == "auto":
        # Triton's flex kernels tile by 64-128 and refuse sparse blocks smaller than their tile.
        backend = "flex" if query.is_cuda and layout.block_size % 128 == 0 else "windowed"
    if backend == "flex":
        mask = block_mask(layout, str(query.device))
        out: Tensor = _compiled_flex()(query, key, value, block_mask=mask)
        return out
    if backend == "flex_eager":
        mask = block_mask(layout, str(query.device))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EAGER_WARNING)
            eager: Tensor = flex_attention(query, key, value, block_mask=mask)
        return eager
    if backend == "dense":
        return F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask(query.device))
    if backend == "windowed":
        return _windowed(query, key, value, layout)
    raise ValueError(f"unknown attention backend {backend!r}; known: auto, flex, flex_eager, dense, windowed")


def _windowed(query: Tensor, key: Tensor, value: Tensor, layout: FrameWindow) -> Tensor:
    per_frame = layout.tokens_per_frame
    outputs = []
    for frame in range(layout.frames):
        spans = [slice(start * per_frame, end * per_frame) for start, end in layout.key_spans(frame)]
        keys = torch.cat([key[:, :, span] for span in spans], dim=2)  # (B, heads, window keys, head_dim)
        values = torch.cat([value[:, :, span] for span in spans], dim=2)
        rows = query[:, :, frame * per_frame : (frame + 1) * per_frame]
        outputs.append(F.scaled_dot_product_attention(rows, keys, values))
    return torch.cat(outputs, dim=2)


@dataclass(frozen=True)
class SparsityStats:
    blocks: int  # (query block, key block) pairs in the full score matrix
    computed_blocks: int
    skipped_fraction: float
    useful_flops: float  # 4 B H D x allowed (query, key) pairs: QK^T and PV, forward only
    dense_flops: float  # the same for dense attention over the whole sequence


def window_stats(layout: FrameWindow, batch: int, heads: int, head_dim: int) -> SparsityStats:
    """What a window-sparse forward skips and what it still computes (for useful TFLOP/s)."""
    allowed_frames = int(layout.frame_allowed().sum())
    per_frame_blocks = layout.tokens_per_frame // layout.block_size
    blocks = (layout.frames * per_frame_blocks) ** 2
    computed = allowed_frames * per_frame_blocks**2
    pairs = allowed_frames * layout.tokens_per_frame**2
    per_pair = 4.0 * batch * heads * head_dim
    return SparsityStats(
        blocks=blocks,
        computed_blocks=computed,
        skipped_fraction=1.0 - computed / blocks,
        useful_flops=per_pair * pairs,
        dense_flops=per_pair * layout.length**2,
    )
