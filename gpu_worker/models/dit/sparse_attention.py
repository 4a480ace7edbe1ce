"""Frame-aligned window-sparse attention for the super-resolution DiT.

The sequence is frames laid end to end, the reference frame first: `[ref][f0][f1]…`, each frame padded
to `tokens_per_frame`, a multiple of `block_size`. A video frame's queries attend to the frames within
± `window` and to the reference frame; the reference frame attends to itself only (so its tokens are
the same in every chunk). Because blocks never straddle a frame edge, every (query block, key block)
pair is wholly allowed or wholly masked: the kernel skips masked blocks and never evaluates a mask
inside a block (`BlockMask.kv_num_blocks`, the count of partial blocks, is zero).

The block mask is built from the (frames x frames) table of allowed frame pairs, never from the (L x L)
token mask: `create_block_mask` run eagerly evaluates the mask on every token pair (with int64
intermediates: 170-230 GiB for a 720p N chunk of ~174k tokens). Here each query block's key blocks are
the allowed frames' blocks in ascending order, written straight into `BlockMask.from_kv_blocks`'s
(blocks x blocks) int32 index tables: 24 MiB allocated in all and ~35 ms on one CPU core for the 720p layout
of 47 frames of 29 blocks (L = 174,464), 2.4 MiB for a 40-frame N chunk at 4x temporal compression (15).

Compile buckets. The compiled kernel is specialised to one sequence length (`dynamic=False`), and after
Dynamo's recompile limit (8) torch silently falls back to eager flex, which materialises the score matrix.
So the `flex` path pads every sequence to the smallest of `SRConfig.frame_buckets` (frame counts, the
reference included) that holds it: the padding frames' keys are masked for every real query, each padding
frame's queries attend only to their own frame (zeros: nothing is NaN), and their outputs are dropped.
Chunks of different lengths in one bucket share a compiled kernel (the mask's tensors have the same shapes;
`mask_mod` reads the frame table as a captured tensor, not as constants), and `sr.warm_up` compiles every
bucket when a node loads the model (raising the recompile limit to hold them all), so no render compiles.
A sequence longer than the largest bucket is an error naming the setting.

Four implementations of the same function, chosen by `SRConfig.attention`:
- `flex`: `torch.compile(flex_attention)` with the block mask, padded to a bucket. The production path on
  CUDA (Triton kernels; ../shared/GPU_NOTES.md measured 426 useful TFLOP/s on an H200 with 3584-token frames
  at ±1). On the CPU build of torch 2.13 it compiles too, through Inductor's C++ template, and matches
  `dense`, but the first call per bucket takes 13-20 s: not the CPU default (one small test compiles it).
- `flex_eager`: the same call without compilation (padded too when buckets are given). Torch runs an
  unfused reference implementation that materialises the whole score matrix, applying `mask_mod` to every
  pair and ignoring the block tables (it warns; we silence that one warning on purpose). Slow, but it runs
  the real mask on CPU: the tests compare it with `dense`, and the block tables with `create_block_mask`'s.
- `dense`: SDPA with the equivalent boolean (L, L) mask: the definition, quadratic in memory.
- `windowed`: SDPA per query frame over its key window, the CPU default: exact, unpadded, memory linear in
  the window, no compilation.
`auto` is `flex` on CUDA with 128-token blocks (the h200 preset) and `windowed` otherwise (CPU, and the
tiny preset's 16-token blocks, smaller than a Triton tile).

`window_stats` reports the blocks skipped and the useful FLOPs (only allowed query-key pairs of real
frames count), so a benchmark divides by the kernel time to get useful TFLOP/s (`python -m
gpu_worker.models.dit.bench_attention`).
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from gpu_worker.models.dit.config import AttentionBackend

_EAGER_WARNING = "flex_attention called without torch.compile"
# torch 2.11 and 2.13 both take these; an older torch infers the lengths (L is whole blocks) and computes
# the query-side tables itself (by transposing through dense (blocks x blocks) int64 temporaries).
_FROM_KV_BLOCKS = frozenset(inspect.signature(BlockMask.from_kv_blocks).parameters)


@dataclass(frozen=True)
class FrameWindow:
    """The layout of one SR sequence: `frames` real frames (the reference first) of `tokens_per_frame`
    tokens, then `padding_frames` masked frames that round the sequence up to a compile bucket."""

    frames: int
    tokens_per_frame: int
    window: int
    block_size: int
    padding_frames: int = 0

    def __post_init__(self) -> None:
        if self.tokens_per_frame % self.block_size:
            raise ValueError(
                f"tokens per frame ({self.tokens_per_frame}) must be a multiple of the block size "
                f"({self.block_size}), so no attention block straddles a frame edge"
            )

    @property
    def total_frames(self) -> int:
        return self.frames + self.padding_frames

    @property
    def length(self) -> int:
        """Tokens in the sequence the kernel sees, padding included."""
        return self.total_frames * self.tokens_per_frame

    @property
    def real_length(self) -> int:
        return self.frames * self.tokens_per_frame

    @property
    def blocks_per_frame(self) -> int:
        return self.tokens_per_frame // self.block_size

    def padded_to(self, total_frames: int) -> FrameWindow:
        """The same real frames followed by padding up to `total_frames`."""
        if total_frames < self.frames:
            raise ValueError(f"cannot pad {self.frames} frames down to {total_frames}")
        return replace(self, padding_frames=total_frames - self.frames)

    def frame_allowed(self, device: torch.device | str = "cpu") -> Tensor:
        """(total_frames, total_frames) bool: may query frame i attend to key frame j. Real frames never see
        padding frames; a padding frame sees only itself."""
        index = torch.arange(self.total_frames, device=device)
        query, key = index[:, None], index[None, :]
        in_window = (key == 0) | ((query > 0) & ((query - key).abs() <= self.window))
        real_query, real_key = query < self.frames, key < self.frames
        return (real_query & real_key & in_window) | (~real_query & (query == key))

    def dense_mask(self, device: torch.device | str = "cpu") -> Tensor:
        """(L, L) bool, the frame mask expanded to tokens."""
        per_frame = self.tokens_per_frame
        return self.frame_allowed(device).repeat_interleave(per_frame, 0).repeat_interleave(per_frame, 1)

    def key_spans(self, query_frame: int) -> list[tuple[int, int]]:
        """The key frames of one query frame as [start, end) runs: the reference and the window."""
        if query_frame == 0 or query_frame >= self.frames:
            return [(query_frame, query_frame + 1)]
        first, end = max(1, query_frame - self.window), min(self.frames, query_frame + self.window + 1)
        return [(0, end)] if first == 1 else [(0, 1), (first, end)]


def bucket_frames(frames: int, buckets: Sequence[int]) -> int:
    """The compile bucket (a frame count, the reference included) that a sequence of `frames` frames is
    padded to: the smallest that holds it."""
    fitting = [bucket for bucket in buckets if bucket >= frames]
    if not fitting:
        raise ValueError(
            f"an SR sequence of {frames} latent frames (reference and decoder context included) is longer than "
            f"the largest of SRConfig.frame_buckets {tuple(buckets)}: add a larger bucket or use shorter chunks"
        )
    return min(fitting)


def _mask_mod(allowed: Tensor, tokens_per_frame: int) -> Any:
    # The frame table is captured as a tensor, so layouts of one bucket share a compiled kernel (a captured
    # int would be a constant Dynamo guards on).
    def mask(batch: Tensor, head: Tensor, query: Tensor, key: Tensor) -> Tensor:
        return allowed[query // tokens_per_frame, key // tokens_per_frame]

    return mask


def _frame_blocks(allowed: Tensor, per_frame: int) -> tuple[Tensor, Tensor]:
    """Block counts (nb,) and block indices (nb, nb) int32 of every row of the (F, F) table expanded to
    blocks: the allowed key frames' blocks in ascending order, then the rest (never read)."""
    frames = allowed.shape[0]
    counts = (allowed.sum(-1, dtype=torch.int32) * per_frame).repeat_interleave(per_frame)
    order = torch.argsort((~allowed).to(torch.int8), dim=-1, stable=True)  # allowed frames first
    within = torch.arange(per_frame, device=allowed.device)
    indices = (order[:, :, None] * per_frame + within).reshape(frames, frames * per_frame).to(torch.int32)
    return counts, indices.repeat_interleave(per_frame, dim=0)


@lru_cache(maxsize=32)
def block_mask(layout: FrameWindow, device: str) -> BlockMask:
    """FlexAttention's block mask for a layout (cached: a chunk's layers share one), every computed block
    full. Memory: three (blocks x blocks) int32 tables (kv, q, and the shared all-zero partial ones)."""
    allowed = layout.frame_allowed(device)
    per_frame = layout.blocks_per_frame
    kv_counts, kv_indices = _frame_blocks(allowed, per_frame)
    no_counts = torch.zeros_like(kv_counts)[None, None]
    no_indices = torch.zeros_like(kv_indices)[None, None]
    options: dict[str, Any] = {"BLOCK_SIZE": layout.block_size, "mask_mod": _mask_mod(allowed, layout.tokens_per_frame)}
    if "seq_lengths" in _FROM_KV_BLOCKS:
        options["seq_lengths"] = (layout.length, layout.length)
    if "compute_q_blocks" not in _FROM_KV_BLOCKS:
        return BlockMask.from_kv_blocks(no_counts, no_indices, kv_counts[None, None], kv_indices[None, None], **options)
    mask = BlockMask.from_kv_blocks(
        no_counts, no_indices, kv_counts[None, None], kv_indices[None, None], compute_q_blocks=False, **options
    )
    # The query side (which query blocks read a key block; the backward pass uses it) is the transposed table.
    q_counts, q_indices = _frame_blocks(allowed.T, per_frame)
    mask.q_num_blocks, mask.q_indices = no_counts, no_indices
    mask.full_q_num_blocks, mask.full_q_indices = q_counts[None, None], q_indices[None, None]
    return mask


@lru_cache(maxsize=1)
def _compiled_flex() -> Any:
    # One compiled function for the process; Dynamo compiles it once per bucket (see the module docstring).
    return torch.compile(flex_attention, dynamic=False)


def resolve_backend(backend: AttentionBackend, device: torch.device, block_size: int) -> AttentionBackend:
    """`auto` → `flex` on CUDA with 128-multiple blocks (Triton's flex kernels tile by 64-128 and refuse
    sparse blocks smaller than their tile), else `windowed`; any other backend is itself."""
    if backend != "auto":
        return backend
    return "flex" if device.type == "cuda" and block_size % 128 == 0 else "windowed"


def window_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    layout: FrameWindow,
    backend: AttentionBackend,
    buckets: Sequence[int] = (),
) -> Tensor:
    """query, key, value (B, heads, L, head_dim) with L = layout.length → (B, heads, L, head_dim).

    With `buckets`, the flex paths pad the sequence to the layout's bucket (see `bucket_frames`)."""
    backend = resolve_backend(backend, query.device, layout.block_size)
    if backend in ("flex", "flex_eager"):
        return _flex(query, key, value, layout, compiled=backend == "flex", buckets=buckets)
    if backend == "dense":
        return F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask(query.device))
    if backend == "windowed":
        return _windowed(query, key, value, layout)
    raise ValueError(f"unknown attention backend {backend!r}; known: auto, flex, flex_eager, dense, windowed")


def _flex(
    query: Tensor, key: Tensor, value: Tensor, layout: FrameWindow, compiled: bool, buckets: Sequence[int]
) -> Tensor:
    length = query.shape[2]
    if buckets:
        layout = layout.padded_to(bucket_frames(layout.total_frames, buckets))
    # Always contiguous, so every call of a bucket presents the compiled kernel the same strides.
    query, key, value = (_padded(tensor, layout.length) for tensor in (query, key, value))
    mask = block_mask(layout, str(query.device))
    if compiled:
        out: Tensor = _compiled_flex()(query, key, value, block_mask=mask)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_EAGER_WARNING)
            out = flex_attention(query, key, value, block_mask=mask)
    return out[:, :, :length]


def _padded(tensor: Tensor, length: int) -> Tensor:
    """(B, heads, L, head_dim) → (B, heads, length, head_dim), contiguous, zeros after L."""
    if tensor.shape[2] == length:
        return tensor.contiguous()
    out = tensor.new_zeros(*tensor.shape[:2], length, tensor.shape[3])
    out[:, :, : tensor.shape[2]] = tensor
    return out


def _windowed(query: Tensor, key: Tensor, value: Tensor, layout: FrameWindow) -> Tensor:
    per_frame = layout.tokens_per_frame
    outputs = []
    for frame in range(layout.total_frames):
        spans = [slice(start * per_frame, end * per_frame) for start, end in layout.key_spans(frame)]
        keys = torch.cat([key[:, :, span] for span in spans], dim=2)  # (B, heads, window keys, head_dim)
        values = torch.cat([value[:, :, span] for span in spans], dim=2)
        rows = query[:, :, frame * per_frame : (frame + 1) * per_frame]
        outputs.append(F.scaled_dot_product_attention(rows, keys, values))
    return torch.cat(outputs, dim=2)


@dataclass(frozen=True)
class SparsityStats:
    blocks: int  # (query block, key block) pairs in the full score matrix, padding included
    computed_blocks: int
    skipped_fraction: float
    useful_flops: float  # 4 B H D x allowed (query, key) pairs of real frames: QK^T and PV, forward only
    dense_flops: float  # the same for dense attention over the real frames


def window_stats(layout: FrameWindow, batch: int, heads: int, head_dim: int) -> SparsityStats:
    """What a window-sparse forward skips and what it still computes (for useful TFLOP/s)."""
    allowed = layout.frame_allowed()
    per_frame_blocks = layout.blocks_per_frame
    blocks = (layout.total_frames * per_frame_blocks) ** 2
    computed = int(allowed.sum()) * per_frame_blocks**2
    pairs = int(allowed[: layout.frames, : layout.frames].sum()) * layout.tokens_per_frame**2
    per_pair = 4.0 * batch * heads * head_dim
    return SparsityStats(
        blocks=blocks,
        computed_blocks=computed,
        skipped_fraction=1.0 - computed / blocks,
        useful_flops=per_pair * pairs,
        dense_flops=per_pair * layout.real_length**2,
    )
