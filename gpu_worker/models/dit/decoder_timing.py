"""The dit decoder's per-frame stage on one GPU, in the layouts it could run in: which one makes 720p25.

    python -m gpu_worker.models.dit.decoder_timing [--preset h200] [--resolution 720p] [--frames 40] [--json-out F]

The first H200 run (docs/benchmarks.md) found decode + publish 69 % of an N chunk at about 45 TFLOP/s: the
decoder's spatial stage (GroupNorm, SiLU, 3x3 convolutions at up to full resolution, one frame a batch) is what
stands between the h200 preset and 25 frames/s at 720p. This times that stage alone on the preset's random
weights in bf16, for one N chunk's frames, as the pipeline runs it (`DiTDecoder.decode`: the temporal stage, then
`frame_features` + `spatial` per batch) and in the variants that could be faster:

- `nchw`: as today (contiguous, cuDNN's heuristics);
- `nhwc`: the spatial layers' weights and the folded features channels-last (cuDNN's native layout for bf16);
- `nhwc_batch4`: the same, 4 frames a batch (fewer, larger launches; SP splits in whole batches);
- `nchw_compiled`, `nhwc_compiled`: the spatial stage under torch.compile (GroupNorm + SiLU fused), as the node
  runs it (decoder.py: `MONOLOGUE_COMPILE_DECODER`) and channels-last;

and per variant: ms for the chunk, the stage's TFLOP/s, the largest difference from `nchw` in the uint8 frames, and
whether a second run gave the same frames bit for bit. On a CPU with `--preset tiny` it checks the script.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gpu_worker.models.dit.config import preset
from gpu_worker.models.dit.vae import VAEDecoder, fold
from gpu_worker.timing import save as write_figures, sync

VARIANTS = ("nchw", "nhwc", "nhwc_batch4", "nchw_compiled", "nhwc_compiled")
SIZES = {"720p": (1280, 736), "480p": (832, 480), "512": (512, 512)}


def _channels_last(decoder: VAEDecoder) -> VAEDecoder:
    """A copy whose per-frame layers hold channels-last weights (the temporal stage's 5-D ones stay)."""
    twin = copy.deepcopy(decoder)
    for module in (twin.levels, twin.conv_out):
        for parameter in module.parameters():
            if parameter.dim() == 4:
                parameter.data = parameter.data.contiguous(memory_format=torch.channels_last)
    return twin


def decode(decoder: VAEDecoder, latents: Tensor, batch: int, spatial: Callable[[Tensor], Tensor], nhwc: bool) -> Tensor:
    """The chunk's uint8 frames (n, 3, H, W), made as `DiTDecoder.decode` makes them (one process)."""
    inputs, _ = decoder.temporal_inputs(latents, None)
    count = decoder.config.temporal_stride * latents.shape[2]
    out = []
    for start in range(0, count, batch):
        features = fold(decoder.frame_features(inputs, range(start, min(start + batch, count))))
        if nhwc:
            features = features.contiguous(memory_format=torch.channels_last)
        pixels = spatial(features).float().clamp(-1.0, 1.0)
        out.append(((pixels + 1.0) * 127.5).round().to(torch.uint8))
    return torch.cat(out)


def time_variant(name: str, decoder: VAEDecoder, latents: Tensor, repeats: int) -> tuple[dict[str, Any], Tensor]:
    nhwc = name.startswith("nhwc")
    model = _channels_last(decoder) if nhwc else decoder
    spatial: Callable[[Tensor], Tensor] = model.spatial
    if name.endswith("compiled"):
        spatial = torch.compile(model.spatial, dynamic=False)
    batch = 4 if "batch4" in name else decoder.config.frames_per_batch
    device = latents.device
    with torch.no_grad():
        started = time.perf_counter()
        first = decode(model, latents, batch, spatial, nhwc)  # the warm-up (and the compile)
        sync(device)
        warmup_s = time.perf_counter() - started
        times = []
        for _ in range(repeats):
            sync(device)
            begin = time.perf_counter()
            again = decode(model, latents, batch, spatial, nhwc)
            sync(device)
            times.append(time.perf_counter() - begin)
    figures = {"warmup_s": warmup_s, "ms": [1000 * t for t in times], "best_ms": 1000 * min(times)}
    figures["repeatable"] = bool(torch.equal(first, again))
    return figures, first


def spatial_tflop(decoder: VAEDecoder, latents: Tensor) -> float:
    """TFLOP of the chunk's spatial stage (FlopCounterMode over one frame, times the frames)."""
    from torch.utils.flop_counter import FlopCounterMode

    inputs, _ = decoder.temporal_inputs(latents, None)
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        decoder.spatial(fold(decoder.frame_features(inputs, range(0, 1))))
    return counter.get_total_flops() * decoder.config.temporal_stride * latents.shape[2] / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="h200")
    parser.add_argument("--resolution", default="720p", choices=sorted(SIZES))
    parser.add_argument("--frames", type=int, default=40, help="frames of the chunk (a multiple of the stride)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    config = preset(args.preset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    decoder = VAEDecoder(config.vae).to(device, dtype).eval()
    width, height = SIZES[args.resolution]
    stride = config.vae.stride
    latents = torch.randn(1, config.vae.latent_channels, args.frames // config.vae.temporal_stride, height // stride,
                          width // stride, device=device, dtype=dtype)  # fmt: skip
    figures: dict[str, object] = {"preset": args.preset, "resolution": [width, height], "frames": args.frames,
                                  "device": str(device), "dtype": str(dtype)}  # fmt: skip
    figures["spatial_tflop"] = tflop = spatial_tflop(decoder, latents)

    def save() -> None:  # after every phase: a step killed by its timeout keeps what it measured
        write_figures(args.json_out, figures)

    baseline: Tensor | None = None
    for name in args.variants.split(","):
        result, frames = time_variant(name, decoder, latents, args.repeats)
        baseline = frames if baseline is None else baseline
        result["max_diff_vs_first"] = int((frames.int() - baseline.int()).abs().max())
        result["spatial_tflops_per_s"] = tflop / (result["best_ms"] / 1000)  # the temporal stage's ms in the time too
        figures[name] = result
        print(name, json.dumps(result), flush=True)
        save()
    print(json.dumps(figures, indent=2))
    save()


if __name__ == "__main__":
    main()
