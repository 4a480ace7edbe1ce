"""How a running chunk says it is alive.

The pipeline reports each stage as it starts it, and a long stage reports its steps (a diffusion family's
denoising steps) through the `StepProgress` its module is given. The node's activity turns every report
into a Temporal heartbeat, so a chunk that stops reporting (a hung GPU call) stops heartbeating and its
session moves to another node. This module must never import Temporal: gpu_worker runs without it (the
other ranks of a multi-GPU node, benchmarks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# Inside one stage: (steps done, steps in all), called after each step.
StepProgress = Callable[[int, int], None]


class Progress(Protocol):
    """Told the stage a chunk has reached and, within a long stage, the step (0 of 0 when it has none)."""

    def __call__(self, stage: str, step: int = 0, steps: int = 0) -> None: ...


def no_progress(stage: str, step: int = 0, steps: int = 0) -> None:
    """For callers with nobody to tell (benchmarks, tests, the ranks of a multi-GPU node other than 0)."""


def no_steps(step: int, steps: int) -> None:
    """The default `StepProgress` of a module called outside a pipeline."""
