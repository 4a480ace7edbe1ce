"""`monologue bench gpu` (or `python -m gpu_worker.bench_gpu`): the dit family on one accelerator, measured.

Prints, for a stated configuration (preset, resolution, parameter counts):
- time to first frame (reference encode + the first chunk), frames/s and realtime factor;
- per-stage ms per chunk (p50);
- peak accelerator memory after 10 and after `chunks` chunks (equal when memory is flat);
- the A2V DiT step's achieved TFLOP/s (FLOPs counted by torch's FlopCounterMode on the step's real
  inputs), against the card's measured bf16 rate (GPU_NOTES.md: 751 TFLOP/s on the H200);
- the SR DiT's frame-window sparse attention: useful TFLOP/s against dense attention of the same size;
- the visible cost of switching the device from the A2V model to the SR model and back, with the
  ModelSwitcher (weights in pinned host memory, per-block prefetch).

Without CUDA it runs the `tiny` preset on the CPU at 256x256 and says so: the figures then check that the
script works, not the card. A benchmark, not a test: nothing here asserts speed. Importable with torch,
numpy and Pillow alone (the GPU machine has no service stack): no PyAV, no Temporal, no database.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import wave
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from gpu_worker.distributed.measure import measure_switches, peak_memory, reset_peak_memory
from gpu_worker.distributed.offload import ModelSwitcher
from gpu_worker.models.dit import build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import preset
from gpu_worker.models.dit.layers import parameter_count
from gpu_worker.models.dit.runtime import TorchModule, default_device
from gpu_worker.models.dit.sparse_attention import FrameWindow, window_attention, window_stats
from gpu_worker.pipeline import ChunkRequest, OutputSpec, Pipeline
from monologue.plan import plan_chunks

SAMPLES = Path(__file__).resolve().parent.parent / "monologue" / "samples"
H200_BF16_TFLOPS = 751.0  # ../shared/GPU_NOTES.md, bf16 matmul 8192³


class SampleSpeech:
    """The bundled speech sample (16 kHz mono WAV, read with the standard library), looped to any length."""

    rate = 16_000

    def __init__(self, total_samples: int) -> None:
        with wave.open(str(SAMPLES / "speech.wav")) as source:
            pcm = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
        self.speech = pcm.astype(np.float32) / 32768.0
        self.total_samples: int | None = total_samples

    def read(self, start: int, end: int) -> np.ndarray:
        out = np.zeros(max(0, end - start), dtype=np.float32)
        lo, hi = max(start, 0), min(end, self.total_samples or 0)
        if hi > lo:
            out[lo - start : hi - start] = self.speech[np.arange(lo, hi) % len(self.speech)]
        return out


class CountingSink:
    """Takes the decoded frames and drops them (encoding is the CPU's job, measured by `bench pipeline`)."""

    def __init__(self) -> None:
        self.frames = 0

    def write(self, frames: np.ndarray) -> None:
        self.frames += len(frames)


@dataclass
class GpuReport:
    device: str
    note: str
    preset: str
    resolution: str
    width: int = 0
    height: int = 0
    fps: int = 25
    parameters: dict[str, int] = field(default_factory=dict)
    chunks: int = 0
    frames: int = 0
    ttff_ms: float = 0.0
    frames_per_s: float = 0.0
    realtime_factor: float = 0.0
    stage_ms_p50: dict[str, float] = field(default_factory=dict)
    peak_mb_after_10: float = 0.0
    peak_mb_after_all: float = 0.0
    a2v_step_tflops: float | None = None
    a2v_share_of_peak: float | None = None
    sr_attention: dict[str, float] = field(default_factory=dict)
    switch_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


def bench_gpu(*, chunks: int = 50, preset_name: str | None = None, resolution: str | None = None) -> GpuReport:
    device = default_device()
    on_gpu = device.startswith("cuda")
    preset_name = preset_name or ("h200" if on_gpu else "tiny")
    resolution = resolution or ("720p" if on_gpu else "512")
    note = (
        f"{torch.cuda.get_device_name()} (bf16)"
        if on_gpu
        else "no CUDA here: the tiny preset on the CPU at half size, to check the script, not a card"
    )
    report = GpuReport(device=device, note=note, preset=preset_name, resolution=resolution)
    weights = Weights(preset(preset_name), seed=1)
    family = build_family(weights)
    reset_peak_memory(device)
    pipeline = Pipeline(family)  # loads every model onto the device
    report.parameters = {
        name: parameter_count(model)
        for module in family.modules()
        if isinstance(module, TorchModule)
        for name, model in module.models.items()
    }
    captured = _capture_inputs(family)
    output = OutputSpec(fps=report.fps, resolution=resolution, preview=not on_gpu)  # type: ignore[arg-type]
    n_frames, i_frames = 40, 4
    plan = plan_chunks((chunks // 2 + 2) * (n_frames + i_frames), n_frames=n_frames, i_frames=i_frames)[:chunks]
    audio = SampleSpeech(plan[-1].end_frame * SampleSpeech.rate // report.fps + SampleSpeech.rate)
    portrait = np.asarray(Image.open(SAMPLES / "portrait.jpg").convert("RGB"))

    sink = CountingSink()
    stage_ms: dict[str, list[float]] = {}
    started = time.perf_counter()
    session = pipeline.start_session(portrait, output, audio)
    report.width, report.height = session.frame_width, session.frame_height
    for position, spec in enumerate(plan):
        chunk = ChunkRequest(spec, seed=7)
        result = pipeline.run_chunk(session, chunk, sink)
        _synchronize(device)
        for stage, ms in result.stage_ms.items():
            stage_ms.setdefault(stage, []).append(ms)
        if position == 0:
            report.ttff_ms = (time.perf_counter() - started) * 1000
        if position + 1 == min(10, len(plan)):
            report.peak_mb_after_10 = peak_memory(device).peak_mb
    wall = time.perf_counter() - started
    report.peak_mb_after_all = peak_memory(device).peak_mb
    report.chunks, report.frames = len(plan), sink.frames
    report.frames_per_s = sink.frames / wall
    report.realtime_factor = (sink.frames / report.fps) / wall
    report.stage_ms_p50 = {stage: round(statistics.median(values), 2) for stage, values in stage_ms.items()}

    measurements: tuple[tuple[str, Callable[[], None]], ...] = (
        ("a2v_step", lambda: _a2v_step(report, family, captured, device, on_gpu)),
        ("sr_attention", lambda: _sr_attention(report, device, on_gpu)),
        ("switch", lambda: _switches(report, weights, captured, device)),
    )
    for part, measure in measurements:
        try:
            measure()
        except Exception as err:  # one failed measurement must not lose the others (one GPU run)
            report.errors[part] = f"{type(err).__name__}: {err}"
    return report


def _capture_inputs(family: Any) -> dict[str, tuple[tuple[Any, ...], dict[str, Any]]]:
    """The arguments of the A2V and SR models' first calls with a boundary (N1 onwards), for re-timing."""
    captured: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    for module in family.modules():
        if not isinstance(module, TorchModule):
            continue
        for name, model in module.models.items():
            if name not in ("a2v", "sr"):
                continue

            def hook(_model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], name: str = name) -> None:
                conditioning = args[2] if name == "a2v" and len(args) > 2 else None
                has_boundary = conditioning is None or conditioning.boundary.shape[2] > 0
                if has_boundary and name not in captured:
                    captured[name] = (args, kwargs)

            model.register_forward_pre_hook(hook, with_kwargs=True)
    return captured


def _a2v_step(report: GpuReport, family: Any, captured: dict[str, Any], device: str, on_gpu: bool) -> None:
    """One Euler step of the A2V DiT on a real chunk's inputs: FLOPs counted, time measured."""
    model = next(m.models["a2v"] for m in family.modules() if isinstance(m, TorchModule) and "a2v" in m.models)
    args, kwargs = captured["a2v"]
    with torch.inference_mode(), _autocast(on_gpu):
        with FlopCounterMode(display=False) as counter:
            model(*args, **kwargs)
        flops = counter.get_total_flops()
        seconds = _time(lambda: model(*args, **kwargs), device)
    report.a2v_step_tflops = flops / seconds / 1e12
    report.a2v_share_of_peak = report.a2v_step_tflops / H200_BF16_TFLOPS if on_gpu else None


def _sr_attention(report: GpuReport, device: str, on_gpu: bool) -> None:
    """The frame-window sparse attention against dense attention of the same size (GPU_NOTES' layout on a
    GPU: 9 frames of 3584 tokens plus the reference frame, 24 heads of 128, window ±1)."""
    frames, tokens, heads, block = (9, 3584, 24, 128) if on_gpu else (5, 64, 2, 16)
    layout = FrameWindow(frames + 1, tokens, 1, block)
    dtype = torch.bfloat16 if on_gpu else torch.float32
    shape = (1, heads, layout.length, 128)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    backend: Literal["auto"] = "auto"
    window_attention(q, k, v, layout, backend)  # compile and warm up
    sparse_s = _time(lambda: window_attention(q, k, v, layout, backend), device)
    dense_s = _time(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), device)
    stats = window_stats(layout, 1, heads, 128)
    report.sr_attention = {
        "tokens": float(layout.length),
        "skipped_blocks": round(stats.skipped_fraction, 3),
        "sparse_ms": round(sparse_s * 1000, 3),
        "dense_ms": round(dense_s * 1000, 3),
        "sparse_useful_tflops": stats.useful_flops / sparse_s / 1e12,
        "dense_tflops": stats.dense_flops / dense_s / 1e12,
        "useful_vs_dense": (stats.useful_flops / sparse_s) / (stats.dense_flops / dense_s),
    }


def _switches(report: GpuReport, weights: Weights, captured: dict[str, Any], device: str) -> None:
    """Visible time to hand the device from the A2V model to the SR model and back (weights parked in pinned
    host memory, restored block by block ahead of the forward that needs them)."""
    switcher = ModelSwitcher(device)
    models = {}
    for name in ("a2v", "sr"):
        model = weights.build(name).to(device)
        switcher.register(model, name=name)
        models[name] = model
    schedule = [
        (models[name], _caller(models[name], *captured[name]))
        for name in ("a2v", "sr")  # the order a chunk runs them
    ]
    for timing in measure_switches(switcher, schedule, rounds=6):
        report.switch_ms[timing.model] = {
            "median": round(timing.median_ms, 3),
            "worst_after_first": round(max(timing.visible_ms[1:]), 3),
            "first": round(timing.visible_ms[0], 3),
        }


def _caller(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: model(*args, **kwargs)


def _time(call: Callable[[], Any], device: str, repeats: int = 5) -> float:
    """Median seconds per call, after one warm-up (CUDA events on a GPU)."""
    call()
    _synchronize(device)
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


def _autocast(on_gpu: bool) -> Any:
    return torch.autocast("cuda", dtype=torch.bfloat16) if on_gpu else torch.autocast("cpu", enabled=False)


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def describe(report: GpuReport) -> str:
    lines = [
        f"device       {report.device}: {report.note}",
        f"config       preset {report.preset}, {report.width}x{report.height} at {report.fps} fps"
        f" ({report.resolution}), chunks of 40 + 4 frames",
        "parameters   "
        + ", ".join(f"{name} {_count(count)}" for name, count in report.parameters.items())
        + f"; total {_count(sum(report.parameters.values()))}",
        f"TTFF         {report.ttff_ms:.0f} ms (reference encode + first chunk)",
        f"throughput   {report.frames_per_s:.1f} frames/s, realtime factor {report.realtime_factor:.2f}"
        f" ({report.frames} frames in {report.chunks} chunks)",
        "stage p50    " + ", ".join(f"{k} {v:.1f} ms" for k, v in report.stage_ms_p50.items()),
        f"peak memory  {report.peak_mb_after_10:.0f} MB after 10 chunks, {report.peak_mb_after_all:.0f} MB"
        f" after {report.chunks}",
    ]
    if report.a2v_step_tflops is not None:
        share = f" = {report.a2v_share_of_peak:.0%} of 751" if report.a2v_share_of_peak is not None else ""
        lines.append(f"A2V step     {report.a2v_step_tflops:.3g} TFLOP/s{share}")
    if report.sr_attention:
        sr = report.sr_attention
        lines.append(
            f"SR attention {sr['sparse_useful_tflops']:.3g} useful TFLOP/s sparse vs {sr['dense_tflops']:.3g} dense"
            f" = {sr['useful_vs_dense']:.0%} ({sr['skipped_blocks']:.0%} of blocks skipped, {sr['tokens']:.0f} tokens)"
        )
    for model, ms in report.switch_ms.items():
        lines.append(
            f"switch→{model:<5} visible {ms['median']:.2f} ms median, {ms['worst_after_first']:.2f} ms worst"
            f" (first, cold: {ms['first']:.2f} ms)"
        )
    lines += [f"error        {part}: {message}" for part, message in report.errors.items()]
    return "\n".join(lines)


def _count(parameters: int) -> str:
    return f"{parameters / 1e6:.1f}M" if parameters >= 1e6 else f"{parameters:,}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=50)
    parser.add_argument("--preset", default=None, help="h200 on a GPU, tiny on the CPU (default)")
    parser.add_argument("--resolution", default=None, help="720p on a GPU, 512 on the CPU (default)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    report = bench_gpu(chunks=args.chunks, preset_name=args.preset, resolution=args.resolution)
    print(json.dumps(asdict(report)) if args.json else describe(report))


if __name__ == "__main__":
    main()
