"""The Wan VAE's work per infinitetalk chunk on one GPU, random-initialised at the real shapes: what decides 8 GPUs.

    python -m gpu_worker.models.infinitetalk.vae_timing [--preset wan2.1-i2v-14b] [--json-out F]

The SP model (`monologue bench sp --family infinitetalk`) stood the dit decoder's 45 TFLOP/s in for the Wan VAE,
never timed: at 45 eight H200 make 4.99 frames/s, at 618 TFLOP/s they would make 25. This times, at 480p (832 x
480: latents 104 x 60), the VAE calls one steady N chunk makes on a node (roles.py, vae.py):

- `decode_kept`: a kept decode state's copy (`StreamStates`), then the chunk's 18 latents (72 frames);
- `prime`: a stream primed on `decoder_context` (38) latents (a chunk whose state is not kept: a resume);
- `encode_motion`: the tail anchor's 9 motion frames encoded (3 latents);
- `encode_condition`: an 81-frame I2V condition (portrait + grey frames), once per clip length,

in the precisions the node could run the VAE in: `fp32` (the original's, TF32 convolutions: the default),
`bf16`, and `bf16` channels-last-3d, and compiled (`*_compiled`: torch.compile of the decoder's and the encoder's
calls, as the dit decoder's stage runs; the first run of each call compiles it). Per variant: ms, TFLOP/s
(FlopCounterMode over the fp32 decode), and the frames' largest difference from fp32's (a variant that fails keeps
its error). Needs diffusers; on a CPU with `--preset tiny` it checks the script.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

from gpu_worker.models.infinitetalk.checkpoint import _vae
from gpu_worker.models.infinitetalk.config import preset
from gpu_worker.models.infinitetalk.vae import DecodeStream, encode
from gpu_worker.timing import save as write_figures, sync

VARIANTS = ("fp32", "bf16", "bf16_nhwc", "fp32_compiled", "bf16_nhwc_compiled")


def _timed(work: Callable[[], object], device: torch.device, repeats: int) -> tuple[float, object]:
    """The fastest of `repeats` runs in ms (after one warm-up run), and the last run's result."""
    result = work()
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        begin = time.perf_counter()
        result = work()
        sync(device)
        best = min(best, 1000 * (time.perf_counter() - begin))
    return best, result


def _variant(name: str, base: AutoencoderKLWan) -> AutoencoderKLWan:
    vae = _vae_like(base)
    if name.startswith("bf16"):
        vae = vae.to(torch.bfloat16)
    if "nhwc" in name:  # the 3-D convolutions' weights (cuDNN then runs them channels-last)
        for module in vae.modules():
            if isinstance(module, torch.nn.Conv3d):
                module.weight.data = module.weight.data.contiguous(memory_format=torch.channels_last_3d)
    if name.endswith("compiled"):  # the per-latent decoder and the encoder calls as Inductor graphs (the warm-up
        vae.decoder.compile(dynamic=False)  # run compiles them: one graph per cache shape)
        vae.encoder.compile(dynamic=False)
    return vae


def _vae_like(base: AutoencoderKLWan) -> AutoencoderKLWan:
    twin = AutoencoderKLWan.from_config(base.config).to(next(base.parameters()).device)
    twin.load_state_dict(base.state_dict())
    return twin.eval().requires_grad_(False)


def time_variant(
    vae: AutoencoderKLWan, latents: torch.Tensor, chunk: int, context: int, repeats: int
) -> tuple[dict[str, float], torch.Tensor]:
    """ms of each call a chunk of `chunk` latents makes (`latents` holds at least 2 + chunk and `context`); the
    decoded frames (B, 3, 4 chunk, H, W)."""
    device = latents.device
    kept = DecodeStream(vae)
    kept.prime(latents[:, :, :2])  # a state from the middle of a stream (its values do not matter for the time)

    def decode_kept() -> torch.Tensor:
        stream = DecodeStream(vae)
        stream.cache = [entry.clone() if isinstance(entry, torch.Tensor) else entry for entry in kept.cache]
        stream.latents = kept.latents
        return stream.decode(latents[:, :, 2 : 2 + chunk])

    def prime() -> None:
        DecodeStream(vae).prime(latents[:, :, :context])

    height, width = (size * vae.config.scale_factor_spatial for size in latents.shape[-2:])
    motion = torch.rand(1, 3, 9, height, width, device=device) * 2 - 1
    condition = torch.rand(1, 3, 81, height, width, device=device) * 2 - 1
    figures: dict[str, float] = {}
    with torch.no_grad():
        figures["decode_kept_ms"], frames = _timed(decode_kept, device, repeats)
        figures["prime_ms"], _ = _timed(prime, device, 1)
        figures["encode_motion_ms"], _ = _timed(lambda: encode(vae, motion), device, repeats)
        figures["encode_condition_ms"], _ = _timed(lambda: encode(vae, condition), device, 1)
    if device.type == "cuda":
        figures["peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    assert isinstance(frames, torch.Tensor)
    return figures, frames


def decode_tflop(vae: AutoencoderKLWan, latents: torch.Tensor, chunk: int) -> float:
    """TFLOP of decoding the chunk's latents after two (FlopCounterMode over one real run)."""
    from torch.utils.flop_counter import FlopCounterMode

    stream = DecodeStream(vae)
    stream.prime(latents[:, :, :2])
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        stream.decode(latents[:, :, 2 : 2 + chunk])
    return counter.get_total_flops() / 1e12


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="wan2.1-i2v-14b")
    parser.add_argument("--latents", type=int, default=18, help="the chunk's latents (72 frames)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    config = preset(args.preset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    base = _vae(config).to(device).eval().requires_grad_(False)
    size = (60, 104) if config.name != "tiny" else (8, 8)
    context = config.stream.decoder_context
    latents = torch.randn(1, config.vae.z_dim, max(2 + args.latents, context), *size, device=device)
    figures: dict[str, object] = {"preset": config.name, "device": str(device), "latent_size": list(size),
                                  "chunk_latents": args.latents, "decoder_context": context}  # fmt: skip
    figures["decode_tflop"] = decode_tflop(base, latents, args.latents)

    def save() -> None:  # after every phase: a step killed by its timeout keeps what it measured
        write_figures(args.json_out, figures)

    save()
    reference: torch.Tensor | None = None
    for name in args.variants.split(","):
        try:
            vae = _variant(name, base)
            result, frames = time_variant(vae, latents, args.latents, context, args.repeats)
        except Exception as err:  # a variant that fails (a compile) leaves its error, and the others run
            figures[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            save()
            continue
        del vae
        reference = frames if reference is None else reference
        result["decode_tflops_per_s"] = float(figures["decode_tflop"]) / (result["decode_kept_ms"] / 1000)  # type: ignore[arg-type]
        result["max_diff_vs_first"] = float((frames.float() - reference.float()).abs().max())
        figures[name] = result
        print(name, json.dumps(result), flush=True)
        save()
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
