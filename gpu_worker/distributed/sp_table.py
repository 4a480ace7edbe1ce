"""The tables of the SP paper model (sp_model.py has the costs and their assumptions, sp_counts.py the
counted work): per SP degree, the modelled time of an N and an I chunk, frames/s and speed-up
(`model_rows`), the split of a node's ranks between N and I chunks against SP over all of them
(`work_split`), and `monologue bench sp`'s text and JSON. A MODEL, not a measurement."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpu_worker.distributed.config import GroupConfig
from gpu_worker.distributed.sp_counts import SEED_18B, chunk_work
from gpu_worker.distributed.sp_model import Layout, Rates, StageTime, StageWork, busiest_share, stage_time
from gpu_worker.models.dit import flops
from gpu_worker.models.dit.config import DiTConfig, preset
from monologue.contracts import ChunkKind


@dataclass(frozen=True)
class ModelRow:
    """One SP degree's modelled figures for an N and an I chunk (seconds on the busiest rank)."""

    degree: int
    n_chunk_s: float
    i_chunk_s: float
    exposed_comm_s: float  # of the N + I pair
    all_to_all_bytes_per_layer: float  # the A2V's, N chunk, per rank
    attention_tflop_per_rank: float  # N + I pair
    linear_tflop_per_rank: float  # N + I pair (convolutions included)
    fps: float
    speedup: float
    efficiency: float


def _per_rank_flops(work: list[StageWork], degree: int, layout: Layout) -> tuple[float, float]:
    """(attention, local) TFLOP on the busiest rank."""
    attention = sum(stage.attention_flops / (degree if stage.attention_calls else 1) for stage in work)
    local = sum(stage.local_flops * busiest_share(stage, degree, layout) for stage in work)
    return attention / 1e12, local / 1e12


@dataclass(frozen=True)
class Scenario:
    """What the model is asked about: a preset at a resolution, chunk sizes, the rates and the SP options."""

    config: DiTConfig
    resolution: str = "720p"
    n_frames: int = flops.N_FRAMES
    i_frames: int = flops.I_FRAMES
    rates: Rates = field(default_factory=Rates)
    head_groups: int = GroupConfig.sp_head_groups  # the node's default
    fsdp: bool = False
    layout: Layout = Layout.DESIGN

    def works(self) -> tuple[list[StageWork], list[StageWork]]:
        n = chunk_work(self.config, self.resolution, self.n_frames, ChunkKind.N, self.rates)
        i = chunk_work(self.config, self.resolution, self.i_frames, ChunkKind.I, self.rates)
        return n, i

    def times(self, degree: int) -> tuple[dict[str, StageTime], dict[str, StageTime]]:
        options = (self.rates, self.head_groups, self.fsdp, self.layout)
        n, i = self.works()
        return (
            {stage.stage: stage_time(stage, degree, *options) for stage in n},
            {stage.stage: stage_time(stage, degree, *options) for stage in i},
        )


def _seconds(times: dict[str, StageTime]) -> float:
    return sum(time.total_s for time in times.values())


def model_rows(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> list[ModelRow]:
    """The modelled table: per SP degree, N and I chunk times, fps, speed-up over one GPU, efficiency."""
    n_work, i_work = scenario.works()
    frames = scenario.n_frames + scenario.i_frames
    one_gpu = _seconds(scenario.times(1)[0]) + _seconds(scenario.times(1)[1])
    rows = []
    for degree in degrees:
        n_times, i_times = scenario.times(degree)
        pair = _seconds(n_times) + _seconds(i_times)
        a2v = next(stage for stage in n_work if stage.stage == flops.Stage.AUDIO_TO_VIDEO)
        attention_n, local_n = _per_rank_flops(n_work, degree, scenario.layout)
        attention_i, local_i = _per_rank_flops(i_work, degree, scenario.layout)
        rows.append(
            ModelRow(
                degree=degree,
                n_chunk_s=_seconds(n_times),
                i_chunk_s=_seconds(i_times),
                exposed_comm_s=sum(t.exposed_comm_s for t in (*n_times.values(), *i_times.values())),
                all_to_all_bytes_per_layer=n_times[a2v.stage].all_to_all_bytes / a2v.attention_calls,
                attention_tflop_per_rank=attention_n + attention_i,
                linear_tflop_per_rank=local_n + local_i,
                fps=frames / pair,
                speedup=one_gpu / pair,
                efficiency=one_gpu / pair / degree,
            )
        )
    return rows


@dataclass(frozen=True)
class WorkSplit:
    """A chunk pair at SP-P on all ranks, one after the other, against N on half the ranks alongside I on
    the other half (I(k) needs N(k) and N(k + 1) only, so it can run beside N(k + 2))."""

    degree: int
    sequential_pair_s: float  # N then I at SP-degree
    split_pair_s: float  # max(N at SP-degree/2, I at SP-degree/2): the steady-state time per pair
    verdict: str


def work_split(scenario: Scenario, degree: int = 8) -> WorkSplit:
    half = degree // 2
    n_full, i_full = scenario.times(degree)
    n_half, _ = scenario.times(half)
    _, i_half = scenario.times(half)
    sequential, split = _seconds(n_full) + _seconds(i_full), max(_seconds(n_half), _seconds(i_half))
    better = "the split" if split < sequential else f"SP-{degree}"
    verdict = (
        f"{better} is faster: {1000 * min(sequential, split):.1f} vs {1000 * max(sequential, split):.1f} ms per pair"
    )
    return WorkSplit(degree, sequential, split, verdict)


PRESET_CONFIGS = {"seed18b": SEED_18B}


def scenario_config(name: str) -> DiTConfig:
    """A dit preset by name, or "seed18b" (SEED_18B)."""
    return PRESET_CONFIGS[name] if name in PRESET_CONFIGS else preset(name)


def describe(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> str:
    """The table `monologue bench sp` prints, headed by the assumptions it rests on."""
    rates, config = scenario.rates, scenario.config
    lines = [
        f"MODEL (not measured): {config.name} preset at {scenario.resolution}, N chunk {scenario.n_frames} + I chunk "
        f"{scenario.i_frames} frames, layout {scenario.layout.value}, head groups {scenario.head_groups} (per model "
        "the largest g up to it with P x g dividing its heads)"
        f"{', FSDP2 weights' if scenario.fsdp else ''}.",
        f"  rates: matmul {rates.matmul_tflops:g}, dense SDPA {rates.dense_attention_tflops:g}, frame-window flex "
        f"{rates.window_attention_tflops:g} TFLOP/s (measured, one H200), element-wise overhead x{rates.overhead:.3f} "
        f"(measured DiT block); VAE conv {rates.conv_tflops:g} TFLOP/s (assumed)",
        f"  NVLink all-to-all {rates.nvlink_gbps:g} GB/s per GPU, {rates.collective_latency_us:g} us per collective, "
        f"GEMM rate m/(m+{rates.gemm_half_rows}) (assumed)",
        "  (comm: exposed, N + I; A2V a2a: per rank per layer, N chunk; TFLOP per rank: N + I, busiest rank)",
        "   P   N ms   I ms  comm ms  A2V a2a MB/layer  attn TFLOP/rank  lin TFLOP/rank    fps  speed-up  eff.",
    ]
    for row in model_rows(scenario, degrees):
        lines.append(
            f"  {row.degree:2d} {1000 * row.n_chunk_s:6.1f} {1000 * row.i_chunk_s:6.1f} "
            f"{1000 * row.exposed_comm_s:8.1f} "
            f"{row.all_to_all_bytes_per_layer / 1e6:17.1f} {row.attention_tflop_per_rank:16.1f} "
            f"{row.linear_tflop_per_rank:15.1f} {row.fps:6.1f} {row.speedup:8.2f}x {100 * row.efficiency:4.0f} %"
        )
    top = max(degrees)
    if top >= 2 and top % 2 == 0:
        lines.append(
            f"  work split (N at SP-{top // 2} beside I at SP-{top // 2} vs N then I at SP-{top}): "
            f"{work_split(scenario, top).verdict}"
        )
    return "\n".join(lines)


def report(scenario: Scenario, degrees: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, object]:
    """The same as JSON-ready data."""
    top = max(degrees)
    return {
        "model": True,
        "preset": scenario.config.name,
        "resolution": scenario.resolution,
        "layout": scenario.layout.value,
        "n_frames": scenario.n_frames,
        "i_frames": scenario.i_frames,
        "head_groups": scenario.head_groups,
        "rates": asdict(scenario.rates) | {"overhead": scenario.rates.overhead},
        "rows": [asdict(row) for row in model_rows(scenario, degrees)],
        "work_split": asdict(work_split(scenario, top)) if top >= 2 and top % 2 == 0 else None,
    }
