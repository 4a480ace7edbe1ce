"""FLOPs per output frame of the real 14B configuration, counted with FlopCounterMode on the meta device.

    python -m gpu_worker.models.infinitetalk.flops [--steps 40] [--chunk-frames 72]

One N chunk as the original streams it: a clip of `motion_frames` (9) + chunk_frames frames, `steps` denoising
steps of three DiT passes each (text+audio, no text, neither), the I2V condition's VAE encode, the motion frames'
decode (38 primed + 3 latents) and encode, and the decoder's 38 primed latents + the chunk's own. umT5, CLIP and
wav2vec2 run once per session or per chunk for a few GFLOP and are left out. Nothing is allocated.
"""

from __future__ import annotations

import argparse

import torch
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.models.infinitetalk.checkpoint import _vae
from gpu_worker.models.infinitetalk.config import WAN_14B, InfiniteTalkConfig
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.vae import DecodeStream

SIZES = {"480p": (832, 480), "720p": (1280, 720)}


def _count(run: object) -> int:
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        run()  # type: ignore[operator]
    return int(counter.get_total_flops())


def chunk_flops(config: InfiniteTalkConfig, width: int, height: int, chunk_frames: int, steps: int) -> dict[str, int]:
    """FLOPs of one N chunk by part."""
    dit_config, stream = config.dit, config.stream
    motion_latents = 1 + (stream.motion_frames - 1) // 4
    latents = motion_latents + chunk_frames // 4
    h, w = height // 8, width // 8
    with torch.device("meta"):
        dit = InfiniteTalkDiT(dit_config)
        vae: AutoencoderKLWan = _vae(config)
        inputs = torch.zeros(1, dit_config.in_dim, latents, h, w)
        audio = torch.zeros(3, 1 + 4 * (latents - 1), dit_config.audio_window, dit_config.audio_blocks, 768)
        text, image = torch.zeros(3, 512, dit_config.text_dim), torch.zeros(3, 257, dit_config.image_dim)

        def denoise_step() -> None:
            dit(inputs.expand(3, -1, -1, -1, -1), torch.zeros(3), text, image, audio)

        def decode(count: int) -> None:
            decoder = DecodeStream(vae)
            decoder.prime(torch.zeros(1, 16, stream.decoder_context, h, w))
            decoder.decode(torch.zeros(1, 16, count, h, w))

        def encode(frames: int) -> None:
            vae.encode(torch.zeros(1, 3, frames, height, width))

        return {
            "dit": steps * _count(denoise_step),
            "vae_condition": _count(lambda: encode(1 + 4 * (latents - 1))),
            "vae_motion": _count(lambda: decode(motion_latents)) + _count(lambda: encode(stream.motion_frames)),
            "vae_decode": _count(lambda: decode(chunk_frames // 4)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=WAN_14B.sampling.steps)
    parser.add_argument("--chunk-frames", type=int, default=72)
    args = parser.parse_args()
    for name, (width, height) in SIZES.items():
        parts = chunk_flops(WAN_14B, width, height, args.chunk_frames, args.steps)
        per_frame = {key: value / args.chunk_frames / 1e12 for key, value in parts.items()}
        total = sum(per_frame.values())
        shown = ", ".join(f"{key} {value:.2f}" for key, value in per_frame.items())
        print(f"{name} {width}x{height}, {args.steps} steps: {total:.1f} TFLOP per output frame ({shown})")


if __name__ == "__main__":
    main()
