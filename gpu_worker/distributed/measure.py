"""Measurements the GPU benchmark (`monologue bench gpu`) reports: how much a model switch costs in
visible time, and how much memory a run peaked at and still holds.

Figures only, no assertions and no printing: the benchmark decides what to compare them with
(GPU_NOTES' ceilings, the 10 ms switch target).
"""

from __future__ import annotations

import contextlib
import resource
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpu_worker.distributed.offload import ModelSwitcher


@dataclass(frozen=True)
class MemoryPeak:
    """The peak since the last reset: allocated tensor memory on a GPU, resident set size on CPU."""

    device: str
    peak_mb: float
    source: str  # "cuda.max_memory_allocated" or "rss"


def reset_peak_memory(device: torch.device | str) -> None:
    """Start a new peak. On CPU this clears the kernel's high-water mark (VmHWM, Linux >= 4.0) where the
    process may; elsewhere the CPU peak stays the peak since process start."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):  # not Linux, or not allowed
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory(device: torch.device | str) -> MemoryPeak:
    """The peak memory of this process on `device` since `reset_peak_memory` (or since start)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return MemoryPeak(str(device), torch.cuda.max_memory_allocated(device) / 2**20, "cuda.max_memory_allocated")
    return MemoryPeak(str(device), _peak_rss_kb() / 1024, "rss")


def allocated_memory(device: torch.device | str) -> float:
    """MB this process holds on `device` now: allocated tensor memory on a GPU, the resident set on CPU
    (where /proc is not readable, the peak instead). Compared over a run, growth means a leak."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device) / 2**20
    return (_status_kb("VmRSS:") or _peak_rss_kb()) / 1024


def _peak_rss_kb() -> float:
    return _status_kb("VmHWM:") or float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KB on Linux


def _status_kb(key: str) -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return float(line.split()[1])
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class SwitchTiming:
    """Visible switch time into one model over several rounds, in ms."""

    model: str
    visible_ms: tuple[float, ...]
    issue_ms: tuple[float, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.visible_ms)

    @property
    def worst_ms(self) -> float:
        return max(self.visible_ms)


def measure_switches(
    switcher: ModelSwitcher, schedule: Sequence[tuple[nn.Module, Callable[[], Any]]], *, rounds: int = 5
) -> list[SwitchTiming]:
    """Cycle through `schedule` (each model with a call that runs its first forward) `rounds` times,
    activating each model in turn as a pipeline would, and collect every switch's visible cost.

    The first round is included: it is the cold start a session's first chunk pays."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    visible: list[list[float]] = [[] for _ in schedule]
    issued: list[list[float]] = [[] for _ in schedule]
    for _ in range(rounds):
        for position, (model, run) in enumerate(schedule):
            report = switcher.activate(model)
            with torch.no_grad():
                run()
            visible[position].append(report.visible_ms)
            issued[position].append(report.issue_ms)
    switcher.deactivate()
    switcher.synchronize()
    return [
        SwitchTiming(switcher.name_of(model), tuple(visible[position]), tuple(issued[position]))
        for position, (model, _) in enumerate(schedule)
    ]
