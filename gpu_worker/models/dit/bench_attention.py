"""Times one frame-window sparse attention call and prints useful TFLOP/s, the figure GPU_NOTES.md
compares kernels by (only allowed query-key pairs count as work).

    python -m gpu_worker.models.dit.bench_attention --frames 9 --tokens 3584 --heads 24 --backend flex

Defaults are the GPU_NOTES layout: 9 video frames of 3584 tokens (+ the reference frame), ±1 frame,
128-token blocks, bf16 on CUDA (fp32 on CPU, where `auto` means the windowed SDPA path).
"""

from __future__ import annotations

import argparse
import time

import torch

from gpu_worker.models.dit.sparse_attention import FrameWindow, window_attention, window_stats


def main(argv: list[str] | None = None) -> None:
    """Time one window-sparse attention call and print useful TFLOP/s (the GPU_NOTES benchmark)."""
    parser = argparse.ArgumentParser(description="Time frame-window sparse attention; print useful TFLOP/s.")
    parser.add_argument("--frames", type=int, default=9, help="video frames (the reference frame is added)")
    parser.add_argument("--tokens", type=int, default=3584, help="tokens per frame")
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--backend", default="auto", choices=["auto", "flex", "flex_eager", "dense", "windowed"])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    layout = FrameWindow(args.frames + 1, args.tokens, args.window, args.block)
    shape = (1, args.heads, layout.length, args.head_dim)
    query, key, value = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    window_attention(query, key, value, layout, args.backend)  # compile and warm up
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(args.repeats):
        window_attention(query, key, value, layout, args.backend)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / args.repeats
    stats = window_stats(layout, 1, args.heads, args.head_dim)
    print(
        f"{args.backend} on {device}: {seconds * 1000:.2f} ms, {stats.skipped_fraction:.0%} of blocks skipped, "
        f"{stats.useful_flops / seconds / 1e12:.3g} useful TFLOP/s"
    )


if __name__ == "__main__":
    main()
