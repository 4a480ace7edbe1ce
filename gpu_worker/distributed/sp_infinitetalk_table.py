"""The infinitetalk SP model's table (`monologue bench sp --family infinitetalk`): the rows of sp_infinitetalk.py,
headed by what is measured and what is modelled, and the verdict against issue 29's goals; text or JSON-ready data."""

from __future__ import annotations

import math
from dataclasses import asdict

from gpu_worker.distributed.sp_infinitetalk import (
    GOAL_FPS,
    GOAL_RANKS,
    GOAL_SPEEDUP,
    GOAL_TTFF_S,
    MEASURED,
    Row,
    Scenario,
    model_rows,
)


def verdict(scenario: Scenario, row: Row) -> str:
    """The goals of issue 29 (at 480p on 8 GPUs) against one row, and the VAE rate that 25 frames/s would need."""

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    budget_s = scenario.chunk_frames / GOAL_FPS
    budget = budget_s - row.chunk.dit_total_s
    vae_tflop = row.chunk.vae_s * scenario.vae_tflops
    if budget <= 0:
        needed = (
            f"is out of reach whatever the VAE: the DiT alone takes {row.chunk.dit_total_s:.2f} s of {budget_s:.2f}"
        )
    else:
        rate = vae_tflop / budget
        peak = scenario.rates.matmul_tflops
        beyond = f", above the H200's {peak:g} bf16 peak: the VAE's work must shrink" if rate > peak else ""
        needed = f"would need the VAE's {vae_tflop:.0f} TFLOP a chunk on a rank at {rate:.0f} TFLOP/s{beyond}"
    return (
        f"  verdict at P = {row.degree}, {scenario.resolution} (goals at 480p on {GOAL_RANKS}): {row.fps:.1f} fps "
        f"(>= {GOAL_FPS:g}: {mark(row.fps >= GOAL_FPS)}), speed-up {row.speedup:.2f}x (>= {GOAL_SPEEDUP}: "
        f"{mark(row.speedup >= GOAL_SPEEDUP)}), TTFF {row.ttff_s:.2f} s (<= {GOAL_TTFF_S:g}: "
        f"{mark(row.ttff_s <= GOAL_TTFF_S)}); the DiT alone {row.dit_fps:.1f} fps, {row.dit_speedup:.2f}x "
        f"({mark(row.dit_fps >= GOAL_FPS and row.dit_speedup >= GOAL_SPEEDUP)}).\n"
        f"  {GOAL_FPS:g} fps here {needed} (the VAE at {scenario.vae_tflops:.0f} TFLOP/s in this table)."
    )


def describe(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    """The table `monologue bench sp --family infinitetalk` prints, headed by what is measured and what modelled."""
    sampling, rates, launch = scenario.sampling, scenario.rates, scenario.launch
    measured = math.isclose(scenario.vae_tflops, MEASURED.vae_tflops)
    vae = "the Wan VAE's measured fp32 decode" if measured else "as given, not measured"
    lines = [
        f"MODEL (not measured): infinitetalk {scenario.config.name}, {scenario.preset} ({sampling.steps} steps x "
        f"{sampling.passes} pass{'es' if sampling.passes > 1 else ''}) at {scenario.resolution}, N chunk "
        f"{scenario.chunk_frames} frames (+ 9 motion), first chunk {scenario.first_frames}; head groups up to "
        f"{scenario.head_groups}.",
        f"  measured (one H200): DiT {MEASURED.dit_tflops(sampling.passes):.0f} TFLOP/s ({sampling.passes} batched); "
        f"VAE at {scenario.vae_tflops:.0f} TFLOP/s: {vae}",
        f"  modelled: launch overhead {launch.base_ms:.2f} ms + {launch.per_group_ms:.2f} ms x head groups per layer "
        f"per forward at P > 1 (fit to the one-rank SP layer); NVLink {rates.nvlink_gbps:g} GB/s, "
        f"{rates.collective_latency_us:g} us per collective, GEMM rate m/(m+{rates.gemm_half_rows}) (assumed)",
        "   P  DiT s  comm s  launch s  VAE s  chunk s    fps  speed-up  DiT fps  DiT speed-up  TTFF s",
    ]
    rows = model_rows(scenario, degrees)
    for row in rows:
        chunk = row.chunk
        lines.append(
            f"  {row.degree:2d} {chunk.dit_s:6.2f} {chunk.comm_s:7.3f} {chunk.launch_s:9.3f} {chunk.vae_s:6.2f} "
            f"{chunk.total_s:8.2f} {row.fps:6.2f} {row.speedup:8.2f}x {row.dit_fps:8.2f} {row.dit_speedup:12.2f}x "
            f"{row.ttff_s:7.2f}"
        )
    lines.append(verdict(scenario, rows[-1]))
    return "\n".join(lines)


def report(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, object]:
    """The same as JSON-ready data."""
    rows = model_rows(scenario, degrees)
    return {
        "model": True,
        "family": "infinitetalk",
        "preset": str(scenario.preset),
        "resolution": scenario.resolution,
        "chunk_frames": scenario.chunk_frames,
        "first_frames": scenario.first_frames,
        "dit_tflops": MEASURED.dit_tflops(scenario.sampling.passes),
        "vae_tflops": scenario.vae_tflops,
        "launch": asdict(scenario.launch),
        "rows": [asdict(row) | {"chunk_s": row.chunk.total_s} for row in rows],
        "verdict": verdict(scenario, rows[-1]).strip(),
    }
