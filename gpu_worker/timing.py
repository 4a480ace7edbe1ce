"""What the GPU timing scripts share (models/dit/decoder_timing.py, models/infinitetalk/gpu_timing.py and
vae_timing.py): waiting for the device before reading the clock, and their figures written after every phase, so a
step that infra/gpu_check.sh kills at its timeout still leaves what it measured."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def save(path: Path | None, figures: dict[str, object]) -> None:
    """The figures so far as JSON at `path` (nothing without one)."""
    if path is not None:
        path.write_text(json.dumps(figures, indent=2))
