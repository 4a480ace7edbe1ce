"""Frame-window block-sparse attention: every implementation computes the dense masked attention, the
block mask built from the frame table has create_block_mask's blocks in memory proportional to the blocks,
padding to a compile bucket changes no real frame, and the reported sparsity is what the kernel skips."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, create_block_mask
from torch.utils._python_dispatch import TorchDispatchMode

from gpu_worker.models.dit.config import TINY, AttentionBackend, preset
from gpu_worker.models.dit.layers import randomise
from gpu_worker.models.dit.sparse_attention import FrameWindow, block_mask, window_attention, window_stats
from gpu_worker.models.dit.sr import SuperResolutionDiT, padded_tokens


def _qkv(layout: FrameWindow, heads: int = 2, head_dim: int = 16) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    return tuple(torch.randn(1, heads, layout.length, head_dim, generator=generator) for _ in range(3))


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("backend", ["flex_eager", "windowed"])
def test_sparse_backends_equal_dense_sdpa_with_the_same_mask(window: int, backend: AttentionBackend) -> None:
    layout = FrameWindow(frames=6, tokens_per_frame=32, window=window, block_size=16)
    query, key, value = _qkv(layout)
    dense = F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask())
    sparse = window_attention(query, key, value, layout, backend)
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)


def _full_blocks(mask: BlockMask, side: str) -> tuple[list[int], list[list[int]]]:
    """The full-block count of each query (side "kv") or key (side "q") block and the blocks it lists,
    sorted: the order within a row is free."""
    counts, indices = getattr(mask, f"full_{side}_num_blocks"), getattr(mask, f"full_{side}_indices")
    assert counts is not None and indices is not None
    rows = [sorted(row[:count].tolist()) for count, row in zip(counts[0, 0].tolist(), indices[0, 0], strict=True)]
    return counts[0, 0].tolist(), rows


@pytest.mark.parametrize(
    "layout",
    [
        FrameWindow(frames=6, tokens_per_frame=32, window=1, block_size=16),
        FrameWindow(frames=5, tokens_per_frame=48, window=2, block_size=16),
        FrameWindow(frames=3, tokens_per_frame=32, window=1, block_size=16, padding_frames=3),
        FrameWindow(frames=1, tokens_per_frame=16, window=1, block_size=16, padding_frames=2),
    ],
    ids=str,
)
def test_the_frame_table_mask_has_create_block_masks_blocks(layout: FrameWindow) -> None:
    """The reference evaluates the dense token mask on every pair; ours lists the same blocks, all full."""
    dense = layout.dense_mask()
    expected = create_block_mask(
        lambda b, h, q, k: dense[q, k],
        None,
        None,
        layout.length,
        layout.length,
        device="cpu",
        BLOCK_SIZE=layout.block_size,
    )
    actual = block_mask(layout, "cpu")
    assert int(expected.kv_num_blocks.sum()) == int(actual.kv_num_blocks.sum()) == 0
    assert actual.seq_lengths == (layout.length, layout.length)
    assert _full_blocks(actual, "kv") == _full_blocks(expected, "kv")
    assert _full_blocks(actual, "q") == _full_blocks(expected, "q")  # the transpose, for the backward pass
    assert torch.equal(actual.to_dense(), expected.to_dense())


def test_every_block_is_wholly_in_or_out_of_the_mask() -> None:
    layout = FrameWindow(frames=6, tokens_per_frame=32, window=1, block_size=16)
    mask = block_mask(layout, "cpu")
    assert int(mask.kv_num_blocks.sum()) == 0, "a partial block means a block straddles a frame edge"
    assert mask.sparsity() == pytest.approx(100 * window_stats(layout, 1, 1, 16).skipped_fraction)


class _Allocations(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Every tensor an operator creates (views excluded): the largest, and the total, an upper bound on the
    peak of what is alive at once."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.largest_numel = 0
        self.total_bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            for tensor in out if isinstance(out, tuple | list) else [out]:
                if isinstance(tensor, torch.Tensor):
                    self.largest_numel = max(self.largest_numel, tensor.numel())
                    self.total_bytes += tensor.numel() * tensor.element_size()
        return out


def test_the_720p_n_chunk_mask_is_built_in_megabytes_not_the_length_squared() -> None:
    """The pre-compression 720p N chunk: 46 latent frames of 92x160 (3680 tokens + 32 registers = 29 blocks)
    and the reference, L = 174,464. create_block_mask made (L, L) tensors (170-230 GiB); this allocates 24 MiB
    in all, the largest tensor a (blocks x blocks) int32 table. On meta too: no L x L tensor is even planned."""
    config = preset("h200")
    with torch.device("meta"):
        model = SuperResolutionDiT(config)
    layout = model.layout(46, 736 // config.vae.stride, 1280 // config.vae.stride)
    assert layout == FrameWindow(47, 3712, 1, 128)
    for device in ("meta", "cpu"):
        block_mask.cache_clear()
        with _Allocations() as allocations:
            mask = block_mask(layout, device)
        blocks = (47 * 29) ** 2
        assert allocations.largest_numel <= blocks < layout.length**2 // 10_000
        assert allocations.total_bytes < 64 * 2**20
    assert mask.sparsity() == pytest.approx(100 * window_stats(layout, 1, 1, 128).skipped_fraction)
    block_mask.cache_clear()  # 24 MiB the rest of the suite has no use for


@pytest.mark.parametrize("backend", ["flex_eager", "windowed"])
def test_padding_to_a_bucket_changes_no_real_frame(backend: AttentionBackend) -> None:
    """Four real frames padded to seven: real queries never see the padding, padding rows are finite."""
    real = FrameWindow(frames=4, tokens_per_frame=32, window=1, block_size=16)
    query, key, value = _qkv(real)
    expected = window_attention(query, key, value, real, "windowed")
    padded = window_attention(query, key, value, real, backend, buckets=(2, 7, 9))
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)
    layout = real.padded_to(7)
    noise = torch.randn(1, 2, layout.length - real.length, 16)
    for fill in (0.0, 1.0):  # whatever the padding holds (zeros, as `_flex` pads, or noise)
        padded_query, padded_key, padded_value = (torch.cat([x, fill * noise], dim=2) for x in (query, key, value))
        out = window_attention(padded_query, padded_key, padded_value, layout, backend)
        torch.testing.assert_close(out[:, :, : real.length], expected, atol=1e-5, rtol=1e-5)
        assert bool(out.isfinite().all())


def test_a_sequence_past_the_largest_bucket_names_the_setting() -> None:
    layout = FrameWindow(frames=5, tokens_per_frame=16, window=1, block_size=16)
    query, key, value = _qkv(layout)
    with pytest.raises(ValueError, match=r"SRConfig\.frame_buckets"):
        window_attention(query, key, value, layout, "flex_eager", buckets=(2, 4))


def test_tokens_per_frame_off_the_block_grid_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of the block size"):
        FrameWindow(frames=3, tokens_per_frame=40, window=1, block_size=16)


def test_window_stats_for_the_gpu_notes_layout() -> None:
    """9 video frames of 3584 tokens at ±1 plus the reference: 68 of 100 frame pairs skipped."""
    layout = FrameWindow(frames=10, tokens_per_frame=3584, window=1, block_size=128)
    stats = window_stats(layout, batch=1, heads=24, head_dim=128)
    # Computed frame pairs: the reference with itself (1), each video frame with the reference (9) and with
    # its neighbours within ±1 (9 + 2 x 8).
    assert stats.computed_blocks == 35 * 28**2
    assert stats.skipped_fraction == pytest.approx(0.65)
    assert stats.useful_flops == pytest.approx(4 * 24 * 128 * 35 * 3584**2)
    assert stats.dense_flops == pytest.approx(4 * 24 * 128 * (10 * 3584) ** 2)
    # Padding frames (each attends to itself) are computed but do no useful work.
    padded = window_stats(layout.padded_to(12), batch=1, heads=24, head_dim=128)
    assert padded.computed_blocks == 37 * 28**2
    assert (padded.useful_flops, padded.dense_flops) == (stats.useful_flops, stats.dense_flops)


def test_h200_frames_pad_to_whole_128_blocks() -> None:
    """720p: canvas 1280x736, latents 160x92, 2x2 patches = 3680 tokens, padded to 29 blocks of 128."""
    config = preset("h200")
    assert config.canvas_multiple == 32
    latent_height, latent_width = 736 // config.vae.stride, 1280 // config.vae.stride
    real = (latent_height // config.sr.patch) * (latent_width // config.sr.patch)
    assert (real, padded_tokens(real, config.sr.block_size)) == (3680, 29 * 128)


@pytest.mark.parametrize("backend", ["dense", "flex_eager"])
def test_super_resolution_dit_gives_the_same_latents_on_every_backend(backend: AttentionBackend) -> None:
    """Frames of 6x4 tokens are padded with 8 registers to 2 blocks of 16; flex pads 6 frames to 9."""
    models = {}
    names: tuple[AttentionBackend, ...] = ("windowed", backend)
    for name in names:
        config = preset("tiny", sr=replace(TINY.sr, attention=name, frame_buckets=(3, 9)))
        model = SuperResolutionDiT(config).eval()
        randomise(model, 3)
        models[name] = model
    generator = torch.Generator().manual_seed(1)
    low = torch.randn(1, 4, 5, 6, 4, generator=generator)  # (B, C, T, h, w)
    reference = torch.randn(1, 4, 12, 8, generator=generator)  # (B, C, H, W)
    assert models["windowed"].layout(5, 12, 8).tokens_per_frame == 32
    assert models[backend].bucket(5) == 9
    with torch.inference_mode():
        expected = models["windowed"](low, reference)
        actual = models[backend](low, reference)
    assert expected.shape == (1, 4, 5, 12, 8)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.gpu  # skips without CUDA (tests/conftest.py)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit
def test_compiled_flex_attention_on_cuda_equals_dense_in_bf16() -> None:
    layout = FrameWindow(frames=5, tokens_per_frame=256, window=1, block_size=128)
    query, key, value = (tensor.cuda().bfloat16() for tensor in _qkv(layout, heads=4, head_dim=128))
    dense = F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask("cuda"))
    for buckets in ((), (7,)):
        sparse = window_attention(query, key, value, layout, "flex", buckets)
        torch.testing.assert_close(sparse.float(), dense.float(), atol=2e-2, rtol=2e-2)
