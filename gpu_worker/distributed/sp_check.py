"""The sequence-parallel kernels on one device: what one GPU can tell about SP before eight are lent.

    python -m gpu_worker.distributed.sp_check --json-out sp_check.json      # the h200 A2V layer's shapes
    python -m gpu_worker.distributed.sp_check --tiny                         # the same plumbing, tiny, on a CPU

1. **The SP path on one rank.** One self-attention layer (the dit `Attention`, the h200 A2V's width and heads)
   over the 720p N chunk's 11,960 tokens, run plainly and through `UlyssesAttention` on a one-rank process
   group (NCCL on CUDA, gloo on a CPU) with 1, 2 and 4 head groups: the stacked q/k/v all-to-all, the per-group
   projections and the summed output projection run their real kernels (a one-rank all-to-all is a copy).
   Reported: each variant's time and its largest difference from the plain layer.
2. **Overlap on one device.** What a rank at P = 8 does per layer: attention for its 2 of 16 heads over the
   whole sequence, against a device-to-device copy of one all-to-all's bytes (the busiest rank's share) on a
   second stream. Timed alone and together: overlap = (alone + alone - together) / the shorter alone (1: the
   copy hid completely behind attention, 0: they ran one after the other). A copy is not NVLink, but it
   shows whether the kernels leave the copy engines and memory room to run side by side.

Times are medians of CUDA events (of perf_counter on a CPU). Imports torch alone: it runs on the bare GPU image.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpu_worker.distributed.sequence import SequenceShard, SPGroup
from gpu_worker.models.dit.layers import Attention

H200_LAYER = {"dim": 2048, "heads": 16, "tokens": 11_960, "ranks": 8}  # the A2V at 720p, N chunk of 40 frames
TINY_LAYER = {"dim": 64, "heads": 8, "tokens": 96, "ranks": 8}


def _timed(run: Callable[[], object], repeats: int, cuda: bool, stream: Any = None) -> float:
    """Median milliseconds of `run` over `repeats` calls after one warm-up; on CUDA, timed by events on `stream`
    (the stream that does the work: events on another one would time nothing), the current one by default."""
    run()
    samples = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(stream)
            run()
            end.record(stream)
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            run()
            samples.append(1000 * (time.perf_counter() - began))
    return statistics.median(samples)


def one_rank_sp(shape: dict[str, int], device: torch.device, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Part 1: the layer plain and through UlyssesAttention on a one-rank group, per head-group count."""
    torch.manual_seed(0)
    layer = Attention(shape["dim"], shape["heads"]).to(device, dtype).eval()
    x = torch.randn(1, shape["tokens"], shape["dim"], device=device, dtype=dtype)
    cuda = device.type == "cuda"
    with torch.no_grad():
        plain = layer(x, None)
        out: dict[str, Any] = {"plain_ms": _timed(lambda: layer(x, None), repeats, cuda)}
        for groups in (1, 2, 4):
            sp = SPGroup(dist.group.WORLD, 1, 0, groups)  # type: ignore[arg-type]  # the default group
            attend = SequenceShard.split(sp, shape["tokens"]).attend(_dense)
            split = layer(x, None, attend=attend)
            out[f"g{groups}"] = {
                "ms": _timed(lambda attend=attend: layer(x, None, attend=attend), repeats, cuda),
                "max_abs_diff": float((split.float() - plain.float()).abs().max()),
            }
    return out


def _dense(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(query, key, value)


def overlap(shape: dict[str, int], device: torch.device, dtype: torch.dtype, repeats: int) -> dict[str, Any]:
    """Part 2: one rank's attention at P = `ranks` against a copy of its all-to-all bytes on a second stream."""
    ranks, head_dim = shape["ranks"], shape["dim"] // shape["heads"]
    per_rank = (1, shape["heads"] // ranks, shape["tokens"], head_dim)
    query, key, value = (torch.randn(per_rank, device=device, dtype=dtype) for _ in range(3))
    local = -(-shape["tokens"] // ranks)
    moved = 3 * local * shape["dim"] * (ranks - 1) // ranks  # q, k and v of its tokens for the other ranks' heads
    source, target = torch.randn(moved, device=device, dtype=dtype), torch.empty(moved, device=device, dtype=dtype)
    cuda = device.type == "cuda"
    side = torch.cuda.Stream() if cuda else None

    def attention() -> None:
        F.scaled_dot_product_attention(query, key, value)

    def copy() -> None:
        with torch.cuda.stream(side) if side is not None else nullcontext():
            target.copy_(source)

    def both() -> None:
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        copy()
        attention()
        if side is not None:
            torch.cuda.current_stream().wait_stream(side)

    alone_attention, alone_copy = _timed(attention, repeats, cuda), _timed(copy, repeats, cuda, side)
    together = _timed(both, repeats, cuda)  # `both` ends with the current stream waiting for the side stream
    return {
        "attention_ms": alone_attention,
        "copy_ms": alone_copy,
        "copy_mb": moved * source.element_size() / 1e6,
        "together_ms": together,
        "overlap": overlap_fraction(alone_attention, alone_copy, together),
    }


def overlap_fraction(attention_ms: float, copy_ms: float, together_ms: float) -> float | None:
    """How much of the shorter of the two was hidden behind the other (0: none, 1: all); None when one of them took
    no measurable time (nothing to hide)."""
    shorter = min(attention_ms, copy_ms)
    if shorter <= 0:
        return None
    return round(max(0.0, min(1.0, (attention_ms + copy_ms - together_ms) / shorter)), 3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU dry run)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.tiny
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    shape = TINY_LAYER if args.tiny else H200_LAYER
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group(
            "nccl" if cuda else "gloo", init_method=f"file://{folder}/rendezvous", rank=0, world_size=1
        )
        try:
            report = {
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "dtype": str(dtype),
                "shape": shape,
                "one_rank_sp": one_rank_sp(shape, device, dtype, args.repeats),
                "overlap": overlap(shape, device, dtype, args.repeats),
            }
        finally:
            dist.destroy_process_group()
    text = json.dumps(report, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
