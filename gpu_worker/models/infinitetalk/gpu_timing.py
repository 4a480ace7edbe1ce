"""The 14B DiT's load and step time on one GPU, random-initialised at the real shapes (no weights needed).

    python -m gpu_worker.models.infinitetalk.gpu_timing [--preset wan2.1-i2v-14b] [--steps 2] [--json-out F]

Builds InfiniteTalk's DiT (Wan2.1-I2V-14B + the adapter) in bf16 straight on the device (meta, then to_empty and a
seeded normal draw: nothing is read from disk), times one denoising step at 480p (832 x 480, one 81-frame clip: 21
latents, three passes in one batch), resident and in switch residency (the DiT's blocks parked in pinned host
memory and streamed in per block by gpu_worker.distributed.offload.ModelSwitcher), and the peak memory. Needs
diffusers (the Wan parts); infra/gpu_check.sh skips it with a message on a machine without them. On a CPU with
`--preset tiny` it checks the script.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gpu_worker.distributed.offload import ModelSwitcher
from gpu_worker.models.infinitetalk.config import preset
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.timing import save as write_figures, sync


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="wan2.1-i2v-14b")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    config = preset(args.preset)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    figures: dict[str, object] = {"preset": config.name, "device": str(device), "dtype": str(dtype)}
    started = time.perf_counter()
    with torch.device("meta"):
        model = InfiniteTalkDiT(config.dit)
    model = model.to_empty(device=device).to(dtype).eval().requires_grad_(False)
    for name, parameter in model.named_parameters():  # the modulation and head stay fp32, as loading keeps them
        if name.startswith(InfiniteTalkDiT.FP32_PARAMETERS):
            parameter.data = parameter.data.float()
    generator = torch.Generator(device).manual_seed(0)
    for parameter in model.parameters():
        parameter.normal_(0.0, 0.02, generator=generator)
    model.rope = type(model.rope)(config.dit.head_dim, config.dit.patch_size, 1024).to(device)  # real buffers
    sync(device)
    figures["load_s"] = time.perf_counter() - started
    figures["parameters"] = sum(p.numel() for p in model.parameters())
    width, height = (832, 480) if config.name != "tiny" else (64, 64)
    latents, dit = 21, config.dit
    inputs = torch.randn(3, dit.in_dim, latents, height // 8, width // 8, device=device, dtype=dtype)
    conditions = (
        torch.full((3,), 500.0, device=device),
        torch.randn(3, 512, dit.text_dim, device=device, dtype=dtype),
        torch.randn(3, 257, dit.image_dim, device=device, dtype=dtype),
        torch.randn(3, 81, dit.audio_window, dit.audio_blocks, dit.audio_channels, device=device, dtype=dtype),
    )

    def step_seconds(passes: int = 3) -> list[float]:
        """`passes` = 3: the quality preset's step (text and audio guidance in one batch); 1: the fast preset's."""
        times = []
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            for _ in range(args.steps):
                sync(device)
                begin = time.perf_counter()
                model(inputs[:passes], *(condition[:passes] for condition in conditions))
                sync(device)
                times.append(time.perf_counter() - begin)
        return times

    def save() -> None:  # after every phase: a step killed by its timeout keeps what it measured
        write_figures(args.json_out, figures)

    save()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    figures["resident_step_s"] = step_seconds()
    save()
    figures["fast_step_s"] = step_seconds(passes=1)
    figures["pass_tflop"] = _pass_tflop(model, inputs, conditions, device, dtype)
    figures["fast_tflops_per_s"] = figures["pass_tflop"] / min(figures["fast_step_s"])
    save()
    if device.type == "cuda":
        figures["resident_peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
        torch.cuda.reset_peak_memory_stats(device)
    switcher = ModelSwitcher(device)
    switcher.register(model, name="dit")
    report = switcher.activate([model])
    figures["switch_step_s"] = step_seconds()
    figures["switch_visible_ms"] = report.visible_ms
    if device.type == "cuda":
        figures["switch_peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    print(json.dumps(figures, indent=2))
    save()


def _pass_tflop(
    model: InfiniteTalkDiT,
    inputs: torch.Tensor,
    conditions: tuple[torch.Tensor, ...],
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """TFLOP of one pass (batch 1), counted by FlopCounterMode over a real forward (untimed)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32), counter:
        model(inputs[:1], *(condition[:1] for condition in conditions))
    return counter.get_total_flops() / 1e12


if __name__ == "__main__":
    main()
