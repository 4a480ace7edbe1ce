"""InfiniteTalk's sampler (`wan/multitalk.py` generate_infinitetalk, lines 636-776), for one clip.

Timesteps 1000 → 1 in `steps` even steps plus 0 (the fast preset: lightx2v's 1000, 750, 500, 250, 0), each
shifted t → shift t / (1 + (shift - 1) t) on t/1000 (timestep_transform, lines 95-104). Each step runs the DiT
three times: with text and audio, with the negative prompt and audio, with the negative prompt and zero audio
features (audio = zeros_like, lines 668-685: zero wav2vec2 windows, not zero tokens), and combines them as
    uncond + text_scale (cond - no_text) + audio_scale (no_text - uncond)
or, with text_scale 1, two passes: no_audio + audio_scale (cond - no_audio) (lines 719-757); with both scales 1
(guidance off: the fast preset, for a CFG-distilled LoRA) that is cond itself, one pass. The passes run as one
batch here. The model predicts the flow velocity; Euler steps x ← x - v (t_i - t_i+1) / 1000.

Known latents (the motion frames leading a clip; an I chunk's right context too) are set clean before every
step and after it (lines 711, 773). The original also adds noise to the motion latents after each step
(lines 765-771) but then overwrites the same latents with the clean ones (line 773), so that draw changes nothing
but the random stream; it is not reproduced.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from gpu_worker.models.infinitetalk.config import SamplingConfig, Spacing
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.pipeline.progress import StepProgress, no_steps


def timesteps(steps: int, shift: float, total: int = 1000, spacing: Spacing = Spacing.WAN) -> list[float]:
    """The shifted schedule, `steps` + 1 values from ~total down to 0."""
    if spacing is Spacing.DISTILLED:
        values = [total * (steps - k) / steps for k in range(steps)] + [0.0]
    else:
        values = [*np.linspace(total, 1, steps, dtype=np.float32).tolist(), 0.0]
    return [float(shift * (t / total) / (1 + (shift - 1) * (t / total)) * total) for t in values]


def guided(
    model: InfiniteTalkDiT,
    sampling: SamplingConfig,
    inputs: Tensor,
    time: float,
    conditions: tuple[Tensor, Tensor, Tensor, Tensor],
) -> Tensor:
    """The guided velocity for (1, in_dim, T, h, w) inputs; conditions: text, negative (L, D), image (257, Di),
    audio (F, window, K, C)."""
    text, negative, image, audio = conditions
    passes = sampling.passes
    if passes == 1:
        texts, audios = [text], [audio]
    elif passes == 2:
        texts, audios = [text, text], [audio, torch.zeros_like(audio)]
    else:
        texts, audios = [text, negative, negative], [audio, audio, torch.zeros_like(audio)]
    batch = len(texts)
    timestep = torch.full((batch,), time, device=inputs.device, dtype=torch.float32)
    velocity = model(
        inputs.expand(batch, -1, -1, -1, -1),
        timestep,
        torch.stack(texts),
        image[None].expand(batch, -1, -1),
        torch.stack(audios),
    )
    if batch == 1:
        return velocity[0]
    if batch == 2:
        return velocity[1] + sampling.audio_scale * (velocity[0] - velocity[1])
    cond, no_text, uncond = velocity
    return uncond + sampling.text_scale * (cond - no_text) + sampling.audio_scale * (no_text - uncond)


def sample(
    model: InfiniteTalkDiT,
    sampling: SamplingConfig,
    noise: Tensor,
    condition: Tensor,
    conditions: tuple[Tensor, Tensor, Tensor, Tensor],
    known: list[tuple[int, Tensor]],
    schedule: list[float],
    progress: StepProgress = no_steps,
    cast: Callable[[Tensor], Tensor] = lambda x: x,
) -> Tensor:
    """Latents (z, T, h, w) from noise (z, T, h, w), the I2V condition (mask + encoded reference, (20, T, h, w))
    and `known` (start, latents) runs kept clean."""
    latents = noise.clone()

    def impose() -> None:
        for start, values in known:
            latents[:, start : start + values.shape[1]] = values

    steps = len(schedule) - 1
    for step in range(steps):
        impose()
        inputs = cast(torch.cat([latents, condition], dim=0)[None])
        velocity = guided(model, sampling, inputs, schedule[step], conditions)
        latents = latents - velocity.float() * ((schedule[step] - schedule[step + 1]) / sampling.num_timesteps)
        impose()
        progress(step + 1, steps)
    return latents
