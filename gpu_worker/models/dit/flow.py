"""Flow matching: the training objective of the audio-to-video DiT and the Euler sampler that inverts it.

Convention (rectified flow): x_t = (1 - t) x0 + t ε with t = 0 data and t = 1 noise; the model predicts
the velocity v = ε - x0, constant along each straight path, so the sampler integrates dx/dt = v from
t = 1 down to 0. Timesteps are shifted towards high noise (SD3's shift), where the sampler spends its
few steps on layout and motion rather than on texture the super-resolution pass redoes anyway. The
defaults (`A2VConfig`: 4 steps, shift 5) give the 4-step schedule of distilled few-step video samplers
(Self-Forcing's [1000, 750, 500, 250] warped by shift 5): t = 1, 0.9375, 0.833, 0.625, then data.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from gpu_worker.pipeline.progress import StepProgress, no_steps

# (x_t (B, ...), t (B,)) → velocity (B, ...)
VelocityFn = Callable[[Tensor, Tensor], Tensor]


def flow_matching_loss(
    model: Callable[..., Tensor], x0: Tensor, cond: Any, t: Tensor, noise: Tensor | None = None
) -> Tensor:
    """Mean squared error between the model's velocity at x_t and the path's true velocity ε - x0.

    model(x_t, t, cond) → velocity; x0 (B, ...) clean latents; t (B,) in [0, 1]; noise defaults to a
    standard normal draw (pass one for a reproducible loss)."""
    if noise is None:
        noise = torch.randn_like(x0)
    expand = (-1,) + (1,) * (x0.ndim - 1)
    t_b = t.view(expand).to(x0.dtype)
    x_t = (1.0 - t_b) * x0 + t_b * noise
    velocity = model(x_t, t, cond)
    return torch.mean((velocity.float() - (noise - x0).float()) ** 2)


def sampling_timesteps(steps: int, shift: float) -> list[float]:
    """steps + 1 times from 1 (noise) to 0 (data), shifted: t' = shift t / (1 + (shift - 1) t)."""
    if steps < 1:
        raise ValueError(f"sampling needs at least one step, got {steps}")
    uniform = [1.0 - index / steps for index in range(steps + 1)]
    return [shift * t / (1.0 + (shift - 1.0) * t) for t in uniform]


def euler_sample(
    velocity: VelocityFn, noise: Tensor, timesteps: list[float], on_step: StepProgress = no_steps
) -> Tensor:
    """Integrate from `noise` at timesteps[0] to timesteps[-1] with one Euler step per interval; `on_step`
    hears (steps done, steps in all) after each (the node heartbeats from it)."""
    x = noise
    batch = noise.shape[0]
    steps = len(timesteps) - 1
    for done, (t, t_next) in enumerate(itertools.pairwise(timesteps), start=1):
        t_tensor = torch.full((batch,), t, device=noise.device, dtype=torch.float32)
        x = x + (t_next - t) * velocity(x, t_tensor).to(x.dtype)
        on_step(done, steps)
    return x
