"""SwitchReport: what one `ModelSwitcher.activate` cost, as the compute stream saw it.

`visible_ms` is the measurement the GPU benchmark reports: the compute stream's stall in `activate` plus its
stalls waiting for weights during the model's first forward (CUDA events), or the wall time of both on CPU,
where nothing overlaps. It only records; the switcher (offload.py) opens and closes the spans.
"""

from __future__ import annotations

import time

import torch

from gpu_worker.distributed.storages import new_event


class SwitchReport:
    """The cost of one `activate`: `issue_ms` (CPU time inside the call) and `visible_ms` (what the compute
    stream saw). Spans are recorded until the model's first complete forward."""

    def __init__(self, model: str, *, cuda: bool, members: int = 1) -> None:
        self.model = model
        self.issue_ms = 0.0
        self.open = True
        self._members = members  # models whose first forward is still to finish
        self._cuda = cuda
        self._cpu_ms: list[float] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started: float | torch.cuda.Event | None = None

    @property
    def visible_ms(self) -> float:
        """On GPU, reading this waits until the recorded spans have run (call it after the forward)."""
        total = sum(self._cpu_ms)
        for start, end in self._events:
            end.synchronize()
            total += start.elapsed_time(end)
        return total

    def start_span(self, device: torch.device) -> None:
        if not self.open or self._started is not None:
            return
        if self._cuda:
            event = new_event(timing=True)
            event.record(torch.cuda.current_stream(device))
            self._started = event
        else:
            self._started = time.perf_counter()

    def stop_span(self, device: torch.device) -> None:
        started, self._started = self._started, None
        if started is None:
            return
        if isinstance(started, float):
            self._cpu_ms.append((time.perf_counter() - started) * 1000)
            return
        end = new_event(timing=True)
        end.record(torch.cuda.current_stream(device))
        self._events.append((started, end))

    def member_finished(self) -> None:
        """One of the activated models finished its first forward; the report closes with the last."""
        self._members -= 1
        if self._members <= 0:
            self.open = False

    def __repr__(self) -> str:
        return f"SwitchReport(model={self.model!r}, issue_ms={self.issue_ms:.3f}, open={self.open})"
