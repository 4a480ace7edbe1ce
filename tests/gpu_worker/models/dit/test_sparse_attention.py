"""Frame-window block-sparse attention: every implementation computes the dense masked attention, the
block layout never splits a frame, and the reported sparsity is what the kernel skips."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

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


def test_every_block_is_wholly_in_or_out_of_the_mask() -> None:
    layout = FrameWindow(frames=6, tokens_per_frame=32, window=1, block_size=16)
    mask = block_mask(layout, "cpu")
    assert int(mask.kv_num_blocks.sum()) == 0, "a partial block means a block straddles a frame edge"
    assert mask.sparsity() == pytest.approx(100 * window_stats(layout, 1, 1, 16).skipped_fraction)


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


def test_h200_frames_pad_to_whole_128_blocks() -> None:
    """720p: canvas 1280x736, latents 160x92, 2x2 patches = 3680 tokens, padded to 29 blocks of 128."""
    config = preset("h200")
    assert config.canvas_multiple == 32
    latent_height, latent_width = 736 // config.vae.stride, 1280 // config.vae.stride
    real = (latent_height // config.sr.patch) * (latent_width // config.sr.patch)
    assert (real, padded_tokens(real, config.sr.block_size)) == (3680, 29 * 128)


@pytest.mark.parametrize("backend", ["dense", "flex_eager"])
def test_super_resolution_dit_gives_the_same_latents_on_every_backend(backend: AttentionBackend) -> None:
    """Frames of 6x4 tokens are padded with 8 registers to 2 blocks of 16."""
    models = {}
    names: tuple[AttentionBackend, ...] = ("windowed", backend)
    for name in names:
        config = preset("tiny", sr=replace(TINY.sr, attention=name))
        model = SuperResolutionDiT(config).eval()
        randomise(model, 3)
        models[name] = model
    generator = torch.Generator().manual_seed(1)
    low = torch.randn(1, 4, 5, 6, 4, generator=generator)  # (B, C, T, h, w)
    reference = torch.randn(1, 4, 12, 8, generator=generator)  # (B, C, H, W)
    assert models["windowed"].layout(5, 12, 8).tokens_per_frame == 32
    with torch.inference_mode():
        expected = models["windowed"](low, reference)
        actual = models[backend](low, reference)
    assert expected.shape == (1, 4, 5, 12, 8)
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-4)


# Compiling FlexAttention on CPU takes ~20 s: worth it, as this is the only run of the compiled path in CI.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit
def test_compiled_flex_attention_on_cpu_equals_dense() -> None:
    layout = FrameWindow(frames=4, tokens_per_frame=32, window=1, block_size=16)
    query, key, value = _qkv(layout)
    dense = F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask())
    torch.testing.assert_close(window_attention(query, key, value, layout, "flex"), dense, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit
def test_compiled_flex_attention_on_cuda_equals_dense_in_bf16() -> None:
    layout = FrameWindow(frames=5, tokens_per_frame=256, window=1, block_size=128)
    query, key, value = (tensor.cuda().bfloat16() for tensor in _qkv(layout, heads=4, head_dim=128))
    dense = F.scaled_dot_product_attention(query, key, value, attn_mask=layout.dense_mask("cuda"))
    sparse = window_attention(query, key, value, layout, "flex")
    torch.testing.assert_close(sparse.float(), dense.float(), atol=2e-2, rtol=2e-2)
