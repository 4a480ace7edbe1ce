"""Flow matching is a real objective: the tiny audio-to-video DiT learns from it in a few steps, and the
Euler sampler inverts the path it defines."""

from __future__ import annotations

import itertools

import pytest
import torch

from gpu_worker.models.dit.a2v import A2VConditioning, AudioToVideoDiT, guided_velocity
from gpu_worker.models.dit.config import TINY, A2VConfig
from gpu_worker.models.dit.flow import euler_sample, flow_matching_loss, sampling_timesteps
from gpu_worker.models.dit.layers import randomise


def _conditioning(batch: int, generator: torch.Generator, text_tokens: int = 0) -> A2VConditioning:
    channels, audio = TINY.latent_channels, TINY.audio
    return A2VConditioning(
        reference=torch.randn(batch, channels, 4, 4, generator=generator),
        boundary=torch.randn(batch, channels, 2, 4, 4, generator=generator),
        boundary_times=torch.tensor([-2.0, -1.0]),
        audio=torch.randn(batch, 8, audio.tokens_per_frame, audio.dim, generator=generator),
        audio_times=torch.arange(-2.0, 6.0),
        text=torch.randn(batch, text_tokens, TINY.text.dim, generator=generator),
        text_mask=torch.ones(batch, text_tokens, dtype=torch.bool),
        keep_audio=torch.ones(batch, dtype=torch.bool),
    )


def test_a_few_optimizer_steps_reduce_the_flow_matching_loss() -> None:
    torch.manual_seed(0)  # the model's standard initialisation
    model = AudioToVideoDiT(TINY)
    generator = torch.Generator().manual_seed(1)
    cond = _conditioning(4, generator)
    x0 = torch.randn(4, TINY.latent_channels, 4, 4, 4, generator=generator)  # (B, C, T, h, w)
    noise = torch.randn(x0.shape, generator=generator)
    t = torch.rand(4, generator=generator)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = flow_matching_loss(model, x0, cond, t, noise)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(loss.item())
    # adaLN-Zero starts at velocity 0, so the first loss is E[(noise - x0)^2] ~ 2.
    assert 1.0 < losses[0] < 3.0
    assert losses[-1] < 0.7 * losses[0], losses


def test_euler_sampling_follows_a_straight_path_exactly() -> None:
    """With the true velocity of one straight path, any number of steps lands on its data point."""
    generator = torch.Generator().manual_seed(3)
    x0, noise = torch.randn(2, 5, generator=generator), torch.randn(2, 5, generator=generator)
    for steps in (1, 3):
        sample = euler_sample(lambda x, t: noise - x0, noise, sampling_timesteps(steps, shift=3.0))
        torch.testing.assert_close(sample, x0)


def test_shifted_timesteps_run_from_noise_to_data_spending_more_steps_at_high_noise() -> None:
    times = sampling_timesteps(4, shift=3.0)
    assert times[0] == 1.0 and times[-1] == 0.0
    assert all(a > b for a, b in itertools.pairwise(times))
    assert times[2] > 0.5  # half the steps done, more than half the noise left


def test_the_default_few_step_schedule_is_the_distilled_four_step_one() -> None:
    """4 steps at shift 5: uniform [1, 0.75, 0.5, 0.25] warped towards noise, then straight to data."""
    a2v = A2VConfig()
    assert a2v.sampling_steps == 4
    times = sampling_timesteps(a2v.sampling_steps, a2v.timestep_shift)
    assert times == pytest.approx([1.0, 0.9375, 5.0 / 6.0, 0.625, 0.0])


def test_guidance_pushes_the_unconditional_velocity_towards_the_conditional_one() -> None:
    model = AudioToVideoDiT(TINY).eval()
    randomise(model, 5)
    generator = torch.Generator().manual_seed(4)
    cond = _conditioning(1, generator, text_tokens=3)
    x = torch.randn(1, TINY.latent_channels, 6, 4, 4, generator=generator)
    t = torch.full((1,), 0.7)
    unconditional_cond = A2VConditioning(**{**cond.__dict__, "keep_audio": torch.zeros(1, dtype=torch.bool)})
    with torch.inference_mode():
        conditional = model(x, t, cond)
        unconditional = model(x, t, unconditional_cond)
        guided = guided_velocity(model, cond, 3.0)(x, t)
    assert not torch.allclose(conditional, unconditional, atol=1e-4), "audio and text must reach the output"
    torch.testing.assert_close(guided, unconditional + 3.0 * (conditional - unconditional), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("boundary_frames", [0, 2])
def test_velocity_has_the_shape_of_the_noisy_latents(boundary_frames: int) -> None:
    model = AudioToVideoDiT(TINY).eval()
    generator = torch.Generator().manual_seed(6)
    cond = _conditioning(1, generator)
    cond = A2VConditioning(
        **{
            **cond.__dict__,
            "boundary": cond.boundary[:, :, :boundary_frames],
            "boundary_times": cond.boundary_times[:boundary_frames],
        }
    )
    with torch.inference_mode():
        velocity = model(torch.randn(1, TINY.latent_channels, 3, 4, 4), torch.ones(1), cond)
    assert velocity.shape == (1, TINY.latent_channels, 3, 4, 4)


def test_the_sampler_reports_each_step_after_taking_it() -> None:
    noise = torch.zeros(1, 2)
    taken: list[int] = []

    def velocity(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        taken.append(len(taken) + 1)
        return torch.ones_like(x)

    reported: list[tuple[int, int, int]] = []
    euler_sample(
        velocity, noise, sampling_timesteps(3, shift=1.0), on_step=lambda d, n: reported.append((d, n, taken[-1]))
    )
    assert reported == [(1, 3, 1), (2, 3, 2), (3, 3, 3)]
