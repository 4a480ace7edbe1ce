"""The parts of `monologue bench gpu` (gpu_worker/bench_gpu.py): inputs, device-synced timing, and the
isolated measurements (the A2V step's TFLOP/s, the SR sparse attention, the model switch).

Why device sync matters: CUDA kernels run asynchronously, so a wall clock around a Python call measures
when the work was *queued*, not when it ran; the time then lands in whichever later call waits (usually
the stage that copies frames to the host). Every time here is taken after the device finished: CUDA
events for single calls, a sync before and after each session and chunk (`stopwatch`); the Pipeline
itself syncs at every stage boundary on CUDA, so its stage_ms are each stage's own device time.

Each measurement returns plain figures (no printing, no report object), so one failing part cannot lose
the others. Importable with torch, numpy and Pillow alone (the GPU machine has no service stack).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.compiled import bucket_of, compiled_step
from gpu_worker.distributed.measure import measure_switches
from gpu_worker.distributed.offload import ModelSwitcher
from gpu_worker.models.dit import flops
from gpu_worker.models.dit.flops import H200_BF16_TFLOPS
from gpu_worker.models.dit.reference import canvas_size
from gpu_worker.models.dit.runtime import TorchModule
from gpu_worker.models.dit.sparse_attention import FrameWindow, window_attention, window_stats
from gpu_worker.models.dit.sr import SuperResolutionDiT
from gpu_worker.pipeline.types import frame_size

Call = tuple[tuple[Any, ...], dict[str, Any]]  # a forward's (args, kwargs)


class CountingSink:
    """Takes the decoded frames and drops them (encoding is the CPU's job, measured by `bench pipeline`)."""

    def __init__(self) -> None:
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        self.frames += len(frames)


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def torch_modules(family: Any) -> dict[str, TorchModule]:
    """The family's modules that own torch models, by model name ("a2v", "sr", ...)."""
    return {
        name: module
        for module in family.modules()
        if isinstance(module, TorchModule)
        for name in (*module.model_names, *module.models)
    }


class Capture:
    """Records the arguments of the A2V and SR models' first forward in an N chunk with a boundary (N1) and
    in an I chunk, for re-running them alone. The bench sets `kind` before the chunks it wants captured;
    the first capture of each kind stays."""

    def __init__(self, family: Any, names: tuple[str, ...] = ("a2v", "sr")) -> None:
        self.kind: str | None = None
        self.calls: dict[str, dict[str, Call]] = {}  # kind -> model name -> call
        self._handles = []
        for name, module in torch_modules(family).items():
            if name in names and name in module.models:
                hook = self._hook(name)
                self._handles.append(module.models[name].register_forward_pre_hook(hook, with_kwargs=True))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(_model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self.kind is not None:
                self.calls.setdefault(self.kind, {}).setdefault(name, (args, kwargs))

        return hook

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def time_call(call: Callable[[], Any], device: str, repeats: int = 5) -> float:
    """Median seconds per call, after one warm-up (CUDA events on a GPU)."""
    call()
    synchronize(device)
    samples = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record()
            call()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1000)
        else:
            started = time.perf_counter()
            call()
            samples.append(time.perf_counter() - started)
    return float(statistics.median(samples))


def weight_dtype(model: nn.Module) -> str:
    """The dtype the model's weights are stored in ("bfloat16" on CUDA under Precision.AUTO)."""
    return str(next(model.parameters()).dtype).removeprefix("torch.")


def a2v_step(family: Any, call: Call, device: str) -> dict[str, Any]:
    """One Euler step of the A2V DiT on a real N chunk's inputs, in the weights' own dtype and the module's
    own running context (runtime.Precision): FLOPs counted by FlopCounterMode, time by CUDA events."""
    module = torch_modules(family)["a2v"]
    model = module.models["a2v"]
    args, kwargs = call
    step = compiled_step(model, device)  # timed as chunks run it: compiled at a warm bucket (gpu_worker/compiled.py)
    compiled = not kwargs and bucket_of(args) in step.warmed
    with module.running():
        with FlopCounterMode(display=False) as counter:  # the eager forward's FLOPs: the same work, counted
            model(*args, **kwargs)
        flops = counter.get_total_flops()
        seconds = time_call(lambda: step(*args) if compiled else model(*args, **kwargs), device)
    tflops = flops / seconds / 1e12
    return {
        "tflop": flops / 1e12,
        "ms": seconds * 1000,
        "tflops": tflops,
        "share_of_peak": tflops / H200_BF16_TFLOPS if device.startswith("cuda") else None,
        "dtype": weight_dtype(model),
        "compiled": compiled,
    }


def sr_attention(device: str) -> dict[str, float]:
    """The frame-window sparse attention against dense attention of the same size (GPU_NOTES' layout on a
    GPU: 9 frames of 3584 tokens plus the reference frame, 24 heads of 128, window ±1)."""
    on_gpu = device.startswith("cuda")
    frames, tokens, heads, block = (9, 3584, 24, 128) if on_gpu else (5, 64, 2, 16)
    layout = FrameWindow(frames + 1, tokens, 1, block)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    shape = (1, heads, layout.length, 128)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    with torch.no_grad():
        window_attention(q, k, v, layout, "auto")  # compile and warm up
        sparse_s = time_call(lambda: window_attention(q, k, v, layout, "auto"), device)
        dense_s = time_call(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), device)
    stats = window_stats(layout, 1, heads, 128)
    return {
        "tokens": float(layout.length),
        "skipped_blocks": round(stats.skipped_fraction, 3),
        "sparse_ms": round(sparse_s * 1000, 3),
        "dense_ms": round(dense_s * 1000, 3),
        "sparse_useful_tflops": stats.useful_flops / sparse_s / 1e12,
        "dense_tflops": stats.dense_flops / dense_s / 1e12,
        "useful_vs_dense": (stats.useful_flops / sparse_s) / (stats.dense_flops / dense_s),
    }


def switches(family: Any, calls: dict[str, dict[str, Call]], device: str, rounds: int = 4) -> dict[str, Any]:
    """Visible time to hand the device from the A2V model to the SR model and back, on an N chunk's and on an
    I chunk's inputs, with the family's own models in their own dtype (bf16 on CUDA) under a ModelSwitcher
    without write-back (frozen weights). Run last: the models then live under this switcher."""
    modules = torch_modules(family)
    switcher = ModelSwitcher(device, write_back=False)
    models = {name: modules[name].models[name] for name in ("a2v", "sr")}
    for name, model in models.items():
        switcher.register(model, name=name)
    figures: dict[str, Any] = {"dtype": weight_dtype(models["a2v"])}
    for kind, captured in sorted(calls.items()):
        schedule = [(models[name], _runner(modules[name], models[name], captured[name])) for name in ("a2v", "sr")]
        figures[kind] = {
            timing.model: {
                "median": round(timing.median_ms, 3),
                "worst_after_first": round(max(timing.visible_ms[1:], default=timing.visible_ms[0]), 3),
                "first": round(timing.visible_ms[0], 3),
            }
            for timing in measure_switches(switcher, schedule, rounds=rounds)
        }
    return figures


def _runner(module: TorchModule, model: nn.Module, call: Call) -> Callable[[], Any]:
    def run() -> Any:
        with module.running():
            return model(*call[0], **call[1])

    return run


def compile_sr(family: Any, portrait: np.ndarray, output: Any) -> tuple[int, ...]:
    """Compile the SR DiT's attention for every frame bucket at this session's output latents, as a node does
    after loading (`SuperResolutionDiT.warm_up`), so no chunk compiles; () where nothing is compiled (CPU)."""
    module = torch_modules(family)["sr"]
    model = module.model("sr", SuperResolutionDiT)
    width, height = canvas_size(
        *frame_size(portrait.shape[1], portrait.shape[0], output), module.config.canvas_multiple
    )
    stride = module.config.vae.stride
    return tuple(model.warm_up(height // stride, width // stride))


def flops_figures(config: Any, resolution: str) -> tuple[dict[str, float], str]:
    """TFLOP per output frame by stage and its text breakdown (counted on the meta device)."""
    per_frame = flops.flops_per_frame(config, resolution)
    return per_frame, flops.describe_flops(config, resolution, per_frame=per_frame)


@contextlib.contextmanager
def stopwatch(device: str, into: list[float]) -> Iterator[None]:
    """Appends the device-synced seconds of the block to `into`."""
    synchronize(device)
    started = time.perf_counter()
    yield
    synchronize(device)
    into.append(time.perf_counter() - started)
