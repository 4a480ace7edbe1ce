"""`monologue bench gpu` (or `python -m gpu_worker.bench_gpu`): the dit family on one accelerator, measured.

Prints, for a stated configuration (preset, resolution, weight dtype, quantization, residency, parameter counts
and weight memory per model: the bytes of its parameters and buffers, what `--quantize` saves):
- load time, then time to first frame twice: *cold* (the first session after loading: reference encode +
  first chunk, including compiles and first-use allocations) and *warm* (a second session, after a warm-up
  session of N0 N1 I0 has run every chunk shape once);
- frames/s and realtime ratio over the warm session's chunks only, and per-stage ms (p50 per chunk kind),
  each stage ended by a device sync so its time is its own (bench_gpu_parts.py says why);
- peak accelerator memory after the warm-up, after 10 and after all warm chunks (equal when memory is
  flat), and memory still allocated at those points (a leak shows there);
- the A2V DiT step's achieved TFLOP/s (FLOPs counted by FlopCounterMode on a real N chunk's inputs, the
  model in its own dtype: bf16 weights on CUDA) against the card's measured bf16 rate (GPU_NOTES.md:
  751 TFLOP/s on the H200);
- the SR DiT's frame-window sparse attention: useful TFLOP/s against dense attention of the same size;
- the visible cost of switching the device from the A2V model to the SR model and back (ModelSwitcher:
  pinned host copies, per-block prefetch) on an N and an I chunk's inputs; with `--residency switch`, the
  switch time each chunk of a real render saw (stage_ms["switch"]);
- the FLOP budget: TFLOP per output frame by stage (gpu_worker.models.dit.flops) and what the render's
  frames/s make of it in TFLOP/s.

Without CUDA it runs the `tiny` preset on the CPU at 256x256 and says so: the figures then check that the
script works, not the card. A benchmark, not a test: nothing here asserts speed. Importable with torch,
numpy and Pillow alone (the GPU machine has no service stack): no PyAV, no Temporal, no database.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_worker.bench_gpu_parts import (
    Capture,
    CountingSink,
    a2v_step,
    compile_sr,
    flops_figures,
    sr_attention,
    stopwatch,
    switches,
    torch_modules,
    weight_dtype,
)
from gpu_worker.compiled import StepCompile, use as use_compile
from gpu_worker.distributed.measure import allocated_memory, peak_memory, reset_peak_memory
from gpu_worker.models.dit import build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import preset
from gpu_worker.models.dit.flops import H200_BF16_TFLOPS
from gpu_worker.models.dit.layers import parameter_count
from gpu_worker.models.dit.runtime import default_device
from gpu_worker.pipeline import ArrayAudio, ChunkRequest, OutputSpec, Pipeline
from gpu_worker.quantize import QuantMode, quantized_weights, tensor_bytes
from gpu_worker.samples import SPEECH_RATE, sample_portrait, sample_speech
from monologue.contracts import ChunkKind, Residency, Resolution
from monologue.plan import plan_chunks


@dataclass
class GpuReport:
    device: str
    note: str
    preset: str
    resolution: str
    residency: str = Residency.RESIDENT.value
    width: int = 0
    height: int = 0
    fps: int = 25
    chunk_frames: int = 40
    i_frames: int = 4
    weights_dtype: str = ""
    quantize: str = QuantMode.NONE.value  # the DiTs' block linears (gpu_worker/quantize.py)
    parameters: dict[str, int] = field(default_factory=dict)
    weight_bytes: dict[str, int] = field(default_factory=dict)  # parameters + buffers per model
    load_s: float = 0.0
    compile_s: float = 0.0  # the SR attention's compile buckets, before the first session
    compiled_buckets: list[int] = field(default_factory=list)
    warmup_chunks: int = 0
    cold_ttff_ms: float = 0.0  # first session after load: compiles and first-use allocations included
    warmup_s: float = 0.0  # the whole warm-up session
    warm_ttff_ms: float = 0.0  # a session after the warm-up: reference encode + first chunk
    chunks: int = 0  # of the warm session, over which the figures below are taken
    frames: int = 0
    frames_per_s: float = 0.0
    realtime_ratio: float = 0.0
    chunk_ms_p50: dict[str, float] = field(default_factory=dict)  # by chunk kind
    stage_ms_p50: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> stage -> ms
    switch_in_render_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # kind -> p50/max
    peak_mb_warmup: float = 0.0
    peak_mb_after_10: float = 0.0
    peak_mb_after_all: float = 0.0
    allocated_mb_after_10: float = 0.0
    allocated_mb_after_all: float = 0.0
    a2v_step: dict[str, Any] = field(default_factory=dict)
    sr_attention: dict[str, float] = field(default_factory=dict)
    switch_ms: dict[str, Any] = field(default_factory=dict)  # "dtype", and kind -> model -> figures
    tflop_per_frame: dict[str, float] = field(default_factory=dict)
    render_tflops: float | None = None  # tflop_per_frame["total"] x frames/s (full-size output only)
    flops_text: str = ""
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class Rendered:
    """One session's figures: device-synced seconds to first frame and per chunk, stage ms by kind."""

    ttff_s: float = 0.0
    chunk_s: dict[str, list[float]] = field(default_factory=dict)
    stage_ms: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    frames: int = 0
    size: tuple[int, int] = (0, 0)


def bench_gpu(
    *,
    chunks: int = 50,
    preset_name: str | None = None,
    resolution: str | None = None,
    residency: Residency | str = Residency.RESIDENT,
    warmup_chunks: int = 3,
    chunk_frames: int = 40,
    i_frames: int = 4,
    switch_rounds: int = 4,
    flops: bool = True,
    weights: Path | None = None,
    quantize: QuantMode = QuantMode.NONE,
    note: Callable[[GpuReport, str], None] = lambda report, phase: None,
) -> GpuReport:
    """Render a warm-up session and a measured one, then the isolated measurements; `note` hears of each
    phase and chunk as it ends (progress lines, the report so far written out). `weights`: a checkpoint folder of
    the preset (make_checkpoint's; the GPU check writes one for all its steps) instead of drawing them here."""
    device = default_device()
    on_gpu = device.startswith("cuda")
    preset_name = preset_name or ("h200" if on_gpu else "tiny")
    resolution = resolution or ("720p" if on_gpu else "512")
    card = (
        torch.cuda.get_device_name()
        if on_gpu
        else "no CUDA here: the tiny preset on the CPU at half size, to check the script, not a card"
    )
    report = GpuReport(device, card, preset_name, resolution, Residency(residency).value)
    report.chunk_frames, report.i_frames, report.quantize = chunk_frames, i_frames, QuantMode(quantize).value
    config = preset(preset_name)
    reset_peak_memory(device)
    loading: list[float] = []
    with stopwatch(device, loading):
        family = build_family(
            Weights.open(weights) if weights is not None else Weights(config, seed=1), quantize=QuantMode(quantize)
        )
        pipeline = Pipeline(family, residency=Residency(residency))  # stage times synced on CUDA
    report.load_s = loading[0]
    models = {name: module.models[name] for name, module in torch_modules(family).items() if name in module.models}
    report.parameters = {name: parameter_count(model) + quantized_weights(model) for name, model in models.items()}
    report.weight_bytes = {name: tensor_bytes(model) for name, model in models.items()}
    report.weights_dtype = weight_dtype(models["a2v"])
    note(report, f"loaded in {report.load_s:.1f} s")
    capture = _sessions(report, pipeline, config, device, chunks, warmup_chunks, note)

    # The A2V step first and the switch next (it takes the family's models over); the SR attention last:
    # it compiles a shape of its own.
    measurements: list[tuple[str, Callable[[], None]]] = []
    if report.residency == Residency.RESIDENT:  # the models stay put: they can be re-run alone
        measurements += [
            ("a2v_step", lambda: report.a2v_step.update(a2v_step(family, capture.calls["N"]["a2v"], device))),
            ("switch", lambda: report.switch_ms.update(switches(family, capture.calls, device, switch_rounds))),
        ]
    if flops:
        measurements.append(("flops", lambda: _flops(report, config, on_gpu)))
    if report.residency == Residency.RESIDENT:
        measurements.append(("sr_attention", lambda: report.sr_attention.update(sr_attention(device))))
    for part, measure in measurements:
        try:
            measure()
        except Exception as err:  # one failed measurement must not lose the others (one GPU run)
            report.errors[part] = f"{type(err).__name__}: {err}"
        note(report, f"{part} done")
    return report


def _sessions(
    report: GpuReport,
    pipeline: Pipeline,
    config: Any,
    device: str,
    chunks: int,
    warmup_chunks: int,
    note: Callable[[GpuReport, str], None],
) -> Capture:
    """The SR compile buckets, the cold warm-up session (N0 N1 I0: every chunk shape once), then the measured
    warm one; returns the models' inputs captured in the first N chunk with a boundary and the first I chunk,
    of either session."""
    preview = not device.startswith("cuda")  # the CPU run: half size
    output = OutputSpec(fps=report.fps, resolution=Resolution(report.resolution), preview=preview)
    stride = int(getattr(config.vae, "temporal_stride", 1))
    total = (max(chunks, warmup_chunks) // 2 + 2) * (report.chunk_frames + report.i_frames)
    plan = plan_chunks(total, n_frames=report.chunk_frames, i_frames=report.i_frames, stride=stride)
    audio = sample_speech(plan[-1].end_frame * SPEECH_RATE // report.fps + SPEECH_RATE)
    portrait = sample_portrait()
    compiling: list[float] = []
    with stopwatch(device, compiling):
        report.compiled_buckets = list(compile_sr(pipeline.models, portrait, output))
    report.compile_s = compiling[0]
    note(report, f"compiled {report.compiled_buckets} in {report.compile_s:.1f} s")
    capture = Capture(pipeline.models)
    started = time.perf_counter()
    warm_up = _render(
        pipeline, portrait, output, audio, plan[:warmup_chunks], device, capture, lambda _, m: note(report, m)
    )
    report.warmup_s, report.warmup_chunks = time.perf_counter() - started, min(warmup_chunks, len(plan))
    report.cold_ttff_ms = warm_up.ttff_s * 1000
    report.peak_mb_warmup = peak_memory(device).peak_mb
    note(report, f"warm-up session done in {report.warmup_s:.1f} s (cold TTFF {report.cold_ttff_ms:.0f} ms)")

    reset_peak_memory(device)  # every figure below is over the warm session

    def after_chunk(position: int, message: str) -> None:
        note(report, message)
        if position + 1 == min(10, chunks):
            report.peak_mb_after_10 = peak_memory(device).peak_mb
            report.allocated_mb_after_10 = allocated_memory(device)

    rendered = _render(pipeline, portrait, output, audio, plan[:chunks], device, capture, after_chunk)
    capture.remove()
    report.peak_mb_after_all = peak_memory(device).peak_mb
    report.allocated_mb_after_all = allocated_memory(device)
    _summarise(report, rendered)
    note(report, f"warm session done: {report.frames_per_s:.1f} frames/s")
    return capture


def _render(
    pipeline: Pipeline,
    portrait: np.ndarray,
    output: OutputSpec,
    audio: ArrayAudio,
    plan: list[Any],
    device: str,
    capture: Capture,
    after_chunk: Callable[[int, str], None],
) -> Rendered:
    """One session over `plan`, every time taken after the device finished; `after_chunk` hears of each
    chunk (its position and a line about it)."""
    rendered, sink, first = Rendered(), CountingSink(), list[float]()
    with stopwatch(device, first):
        session = pipeline.start_session(portrait, output, audio)
    rendered.size = (session.frame_width, session.frame_height)
    for position, spec in enumerate(plan):
        kind = str(spec.kind)
        capture.kind = kind if (kind == ChunkKind.I or spec.index >= 1) else None  # N0 has no boundary
        spent: list[float] = []
        with stopwatch(device, spent):
            result = pipeline.run_chunk(session, ChunkRequest(spec, seed=7), sink)
        if position == 0:
            rendered.ttff_s = first[0] + spent[0]
        rendered.chunk_s.setdefault(kind, []).append(spent[0])
        for stage, ms in result.stage_ms.items():
            rendered.stage_ms.setdefault(kind, {}).setdefault(stage, []).append(ms)
        stages = ", ".join(f"{stage} {ms:.0f}" for stage, ms in result.stage_ms.items())
        message = f"chunk {kind}{spec.index} ({spec.n_frames} frames): {spent[0] * 1000:.0f} ms [{stages} ms]"
        after_chunk(position, message)
    capture.kind = None
    rendered.frames = sink.frames
    return rendered


def _summarise(report: GpuReport, rendered: Rendered) -> None:
    report.width, report.height = rendered.size
    wall = sum(sum(times) for times in rendered.chunk_s.values())
    report.chunks = sum(len(times) for times in rendered.chunk_s.values())
    report.frames = rendered.frames
    report.frames_per_s = rendered.frames / wall if wall else 0.0
    report.realtime_ratio = report.frames_per_s / report.fps
    report.warm_ttff_ms = rendered.ttff_s * 1000
    report.chunk_ms_p50 = {kind: round(statistics.median(s) * 1000, 2) for kind, s in rendered.chunk_s.items()}
    report.stage_ms_p50 = {
        kind: {stage: round(statistics.median(values), 2) for stage, values in stages.items()}
        for kind, stages in rendered.stage_ms.items()
    }
    for kind, stages in rendered.stage_ms.items():
        if "switch" in stages:
            report.switch_in_render_ms[kind] = {
                "p50": round(statistics.median(stages["switch"]), 3),
                "max": round(max(stages["switch"]), 3),
            }


def _flops(report: GpuReport, config: Any, on_gpu: bool) -> None:
    report.tflop_per_frame, report.flops_text = flops_figures(config, report.resolution)
    if on_gpu and "total" in report.tflop_per_frame:  # on the CPU the output is half size (preview)
        report.render_tflops = report.tflop_per_frame["total"] * report.frames_per_s


def describe(report: GpuReport) -> str:
    kinds = sorted(report.stage_ms_p50)
    lines = [
        f"device       {report.device}: {report.note}",
        f"config       preset {report.preset}, {report.width}x{report.height} at {report.fps} fps"
        f" ({report.resolution}), chunks of {report.chunk_frames} + {report.i_frames} frames,"
        f" weights {report.weights_dtype}, quantize {report.quantize}, {report.residency}",
        "parameters   "
        + ", ".join(f"{name} {_count(count)}" for name, count in report.parameters.items())
        + f"; total {_count(sum(report.parameters.values()))}",
        "weight MiB   "
        + ", ".join(f"{name} {size / 2**20:.2f}" for name, size in report.weight_bytes.items())
        + f"; total {sum(report.weight_bytes.values()) / 2**20:.2f} (parameters and buffers)",
        f"load         {report.load_s:.1f} s (build, weights to the device); compile {report.compile_s:.1f} s"
        f" (SR attention buckets {report.compiled_buckets or 'none: not compiled here'})",
        f"TTFF cold    {report.cold_ttff_ms:.0f} ms (first session after load: compiles included);"
        f" warm-up session of {report.warmup_chunks} chunks {report.warmup_s:.1f} s",
        f"TTFF warm    {report.warm_ttff_ms:.0f} ms (reference encode + first chunk, after the warm-up)",
        f"throughput   {report.frames_per_s:.1f} frames/s, realtime ratio {report.realtime_ratio:.2f}"
        f" ({report.frames} frames in {report.chunks} warm chunks)",
        "chunk p50    " + ", ".join(f"{kind} {ms:.1f} ms" for kind, ms in sorted(report.chunk_ms_p50.items())),
    ]
    for kind in kinds:
        stages = report.stage_ms_p50[kind]
        lines.append(f"stage p50 {kind}  " + ", ".join(f"{k} {v:.1f} ms" for k, v in stages.items()))
    lines.append(
        f"peak memory  {report.peak_mb_warmup:.0f} MB in the warm-up; {report.peak_mb_after_10:.0f} MB after 10"
        f" warm chunks, {report.peak_mb_after_all:.0f} MB after {report.chunks} (allocated"
        f" {report.allocated_mb_after_10:.0f} / {report.allocated_mb_after_all:.0f} MB)"
    )
    if report.a2v_step:
        step = report.a2v_step
        share = f" = {step['share_of_peak']:.0%} of {H200_BF16_TFLOPS:g}" if step["share_of_peak"] is not None else ""
        lines.append(
            f"A2V step     {step['tflops']:.3g} TFLOP/s{share} ({step['tflop']:.3g} TFLOP in {step['ms']:.2f} ms,"
            f" {step['dtype']}{', compiled' if step.get('compiled') else ''})"
        )
    if report.sr_attention:
        sr = report.sr_attention
        lines.append(
            f"SR attention {sr['sparse_useful_tflops']:.3g} useful TFLOP/s sparse vs {sr['dense_tflops']:.3g} dense"
            f" = {sr['useful_vs_dense']:.0%} ({sr['skipped_blocks']:.0%} of blocks skipped, {sr['tokens']:.0f} tokens)"
        )
    for kind, models in sorted((k, v) for k, v in report.switch_ms.items() if k != "dtype"):
        for model, ms in models.items():
            lines.append(
                f"switch {kind}→{model:<4} visible {ms['median']:.2f} ms median, {ms['worst_after_first']:.2f} ms"
                f" worst (first, cold: {ms['first']:.2f} ms; {report.switch_ms['dtype']})"
            )
    for kind, ms in sorted(report.switch_in_render_ms.items()):
        lines.append(f"switch in {kind}  {ms['p50']:.2f} ms p50, {ms['max']:.2f} ms max per chunk (in the render)")
    if report.flops_text:
        lines.append(report.flops_text)
    if report.render_tflops is not None:
        lines.append(
            f"render       {report.render_tflops:.1f} TFLOP/s at {report.frames_per_s:.1f} frames/s"
            f" = {report.render_tflops / H200_BF16_TFLOPS:.0%} of {H200_BF16_TFLOPS:g}"
        )
    lines += [f"error        {part}: {message}" for part, message in report.errors.items()]
    return "\n".join(lines)


def _count(parameters: int) -> str:
    return f"{parameters / 1e6:.1f}M" if parameters >= 1e6 else f"{parameters:,}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=50, help="warm chunks to measure (after the warm-up)")
    parser.add_argument("--warmup-chunks", type=int, default=3, help="chunks of the cold warm-up session")
    parser.add_argument("--chunk-frames", type=int, default=40, help="frames per N chunk")
    parser.add_argument("--i-frames", type=int, default=4, help="frames per I chunk")
    parser.add_argument("--switch-rounds", type=int, default=4, help="rounds of the isolated switch measurement")
    parser.add_argument("--no-flops", action="store_true", help="skip counting the FLOP budget (seconds on a CPU)")
    parser.add_argument("--preset", default=None, help="h200 on a GPU, tiny on the CPU (default)")
    parser.add_argument("--resolution", default=None, help="720p on a GPU, 512 on the CPU (default)")
    parser.add_argument("--residency", default=Residency.RESIDENT.value, choices=[r.value for r in Residency])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")
    parser.add_argument("--json-out", type=Path, help="also write the JSON here, rewritten after every phase")
    parser.add_argument("--progress", action="store_true", help="a line on stderr per chunk and phase")
    parser.add_argument("--weights", type=Path, help="a checkpoint folder of the preset (make_checkpoint's)")
    parser.add_argument("--quantize", type=QuantMode, default=QuantMode.NONE, choices=list(QuantMode))
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the DiTs' steps at the warm buckets (gpu_worker/compiled.py); default MONOLOGUE_COMPILE_STEPS",
    )
    args = parser.parse_args(argv)
    if args.compile is not None:
        use_compile(StepCompile.ON if args.compile else StepCompile.OFF)
    started = time.perf_counter()

    def note(report: GpuReport, phase: str) -> None:
        if args.progress:
            print(f"[bench_gpu {time.perf_counter() - started:7.1f} s] {phase}", file=sys.stderr, flush=True)
        if args.json_out:
            args.json_out.write_text(json.dumps(asdict(report)))

    report = bench_gpu(
        chunks=args.chunks,
        preset_name=args.preset,
        resolution=args.resolution,
        residency=args.residency,
        warmup_chunks=args.warmup_chunks,
        chunk_frames=args.chunk_frames,
        i_frames=args.i_frames,
        switch_rounds=args.switch_rounds,
        flops=not args.no_flops,
        weights=args.weights,
        quantize=args.quantize,
        note=note,
    )
    note(report, "done")
    print(json.dumps(asdict(report)) if args.json else describe(report))


if __name__ == "__main__":
    main()
