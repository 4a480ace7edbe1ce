"""FLOPs per output frame of the real 14B configuration, counted with FlopCounterMode on the meta device.

    python -m gpu_worker.models.infinitetalk.flops [--preset quality|fast] [--steps N] [--chunk-frames 72]

One N chunk as the original streams it: a clip of `motion_frames` (9) + chunk_frames frames, the preset's denoising
steps (quality: 40 of three DiT passes, text+audio, no text, neither; fast: 4 of one), the motion frames' encode
(taken from the decoder's own frames) and the decoder's 38 primed latents + the chunk's own (and, as a second
figure, the chunk's own only: a node that kept the previous N chunk's decode state, vae.StreamStates). The I2V
condition's encode runs once per clip length in a session (roles.ConditionCache: printed apart, not per chunk);
umT5, CLIP and wav2vec2 run once per session or per chunk for a few GFLOP and are left out. Nothing is allocated.

With `--sp-degree P` (a multi-GPU node's sequence parallelism, dit.py) it also prints what one rank sends per DiT
layer and per denoising step in the Ulysses all-to-alls (`sp_exchange_bytes`); the audio and text cross-attentions
send nothing (their keys and values are replicated).
"""

from __future__ import annotations

import argparse

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.distributed.sequence import split_frames
from gpu_worker.models.infinitetalk.checkpoint import _vae
from gpu_worker.models.infinitetalk.config import WAN_14B, InfiniteTalkConfig, SamplingConfig
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.vae import DecodeStream
from monologue.contracts import SamplingPreset

SIZES = {"480p": (832, 480), "720p": (1280, 720)}


def _count(run: object) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        run()  # type: ignore[operator]
    return int(counter.get_total_flops())


def step_flops(config: InfiniteTalkConfig, width: int, height: int, latents: int, sampling: SamplingConfig) -> int:
    """FLOPs of one denoising step over a clip of `latents` latent frames: `sampling.passes` DiT passes, one batch
    (on the meta device: nothing is allocated)."""
    dit_config, batch = config.dit, sampling.passes
    stride, spatial = config.vae.temporal_stride, config.vae.spatial_stride
    with torch.device("meta"):
        dit = InfiniteTalkDiT(dit_config)
        inputs = torch.zeros(batch, dit_config.in_dim, latents, height // spatial, width // spatial)
        windows = (1 + stride * (latents - 1), dit_config.audio_window, dit_config.audio_blocks)
        audio = torch.zeros(batch, *windows, dit_config.audio_channels)
        text = torch.zeros(batch, dit_config.text_len, dit_config.text_dim)
        image = torch.zeros(batch, 257, dit_config.image_dim)  # CLIP ViT-H/14's 256 patches + the class token
        return _count(lambda: dit(inputs, torch.zeros(batch), text, image, audio))


def sp_exchange_bytes(
    config: InfiniteTalkConfig, width: int, height: int, latents: int, batch: int, degree: int
) -> int:
    """Bytes the busiest rank sends per DiT layer under sequence parallelism of `degree` in bf16: its tokens' query,
    key and value for the other ranks' heads, then its heads' attention output for the other ranks' tokens."""
    spatial, (_, patch_h, patch_w) = config.vae.spatial_stride, config.dit.patch_size
    tokens = latents * (height // spatial // patch_h) * (width // spatial // patch_w)
    own = max(end - start for start, end in split_frames(tokens, degree))
    dim, others = config.dit.dim, (degree - 1) / degree
    return int(2 * batch * (3 * own * dim * others + (tokens - own) * dim / degree))


def chunk_flops(
    config: InfiniteTalkConfig,
    width: int,
    height: int,
    chunk_frames: int,
    sampling: SamplingConfig,
    steps: int,
    *,
    primed: bool = True,
) -> dict[str, int]:
    """FLOPs of one N chunk by part; `primed`: its decoder primes on the 38 latents before it (not: it starts from
    the state the previous chunk's decode left on the node, vae.StreamStates)."""
    stream = config.stream
    motion_latents = 1 + (stream.motion_frames - 1) // 4
    latents = motion_latents + chunk_frames // 4
    h, w = height // 8, width // 8
    with torch.device("meta"):
        vae: AutoencoderKLWan = _vae(config)

        def decode(count: int, priming: int) -> None:
            decoder = DecodeStream(vae)
            decoder.prime(torch.zeros(1, 16, priming, h, w))
            decoder.decode(torch.zeros(1, 16, count, h, w))

        def chunk_decode(count: int) -> int:  # from a kept state: its latents past a stream's first, nothing primed
            if primed:
                return _count(lambda: decode(count, stream.decoder_context))
            return _count(lambda: decode(count, 1)) - _count(
                lambda: DecodeStream(vae).prime(torch.zeros(1, 16, 1, h, w))
            )

        def encode(frames: int) -> None:
            vae.encode(torch.zeros(1, 3, frames, height, width))

        return {
            "dit": steps * step_flops(config, width, height, latents, sampling),
            "vae_motion": _count(lambda: encode(stream.motion_frames)),
            "vae_decode": chunk_decode(chunk_frames // 4),
        }


def condition_flops(config: InfiniteTalkConfig, width: int, height: int, latents: int) -> int:
    """FLOPs of the I2V condition's encode for a clip of `latents` (once per clip length in a session)."""
    with torch.device("meta"):
        vae: AutoencoderKLWan = _vae(config)
        frames = 1 + config.vae.temporal_stride * (latents - 1)
        return _count(lambda: vae.encode(torch.zeros(1, 3, frames, height, width)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", type=SamplingPreset, default=SamplingPreset.QUALITY, choices=list(SamplingPreset))
    parser.add_argument("--steps", type=int, default=0, help="0: the preset's (quality 40, fast 4)")
    parser.add_argument("--chunk-frames", type=int, default=72)
    parser.add_argument("--sp-degree", type=int, default=1, help="also print the SP exchange per layer at this degree")
    args = parser.parse_args()
    sampling = WAN_14B.sampler(args.preset)
    steps = args.steps or sampling.steps
    for name, (width, height) in SIZES.items():
        parts = chunk_flops(WAN_14B, width, height, args.chunk_frames, sampling, steps)
        per_frame = {key: value / args.chunk_frames / 1e12 for key, value in parts.items()}
        total = sum(per_frame.values())
        shown = ", ".join(f"{key} {value:.2f}" for key, value in per_frame.items())
        latents = 1 + (WAN_14B.stream.motion_frames - 1) // 4 + args.chunk_frames // 4
        condition = condition_flops(WAN_14B, width, height, latents) / 1e12
        kept = chunk_flops(WAN_14B, width, height, args.chunk_frames, sampling, steps, primed=False)
        kept_decode = kept["vae_decode"] / args.chunk_frames / 1e12
        print(
            f"{name} {width}x{height}, {args.preset}: {steps} steps x {sampling.passes} passes: {total:.1f} TFLOP per "
            f"output frame ({shown}); once per clip length, the I2V condition's encode: {condition:.1f} TFLOP; "
            f"decoding from a kept stream state: {total - per_frame['vae_decode'] + kept_decode:.1f} "
            f"(vae_decode {kept_decode:.2f})"
        )
        if args.sp_degree > 1:
            sent = sp_exchange_bytes(WAN_14B, width, height, latents, sampling.passes, args.sp_degree)
            print(
                f"  SP over {args.sp_degree} ranks: {sent / 1e6:.0f} MB a rank sends per layer, "
                f"{sent * WAN_14B.dit.num_layers / 1e9:.1f} GB per step"
            )


if __name__ == "__main__":
    main()
