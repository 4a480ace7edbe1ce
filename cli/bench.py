"""`monologue bench pipeline|gpu|sp|upload|avatar|live|tts|orchestration|cluster|faults`: benchmarks that print figures
(nothing here asserts speed). Each command imports its benchmark when it runs, so the CLI starts fast and never loads
torch for other commands."""

from __future__ import annotations

import shutil
from enum import StrEnum
from pathlib import Path
from typing import Any

import click

from cli.benches.sp import SP_FAMILIES, SpOptions, sp_table
from cli.fault_watch import Fault
from cli.renders import api_or_stack
from monologue.contracts import Family, LipSync, Residency, Resolution, SamplingPreset
from monologue.settings import get_settings


@click.group()
def bench() -> None:
    """Benchmarks that print figures (nothing here asserts speed)."""


@bench.command("pipeline")
@click.option("--minutes", type=float, default=2.0, show_default=True, help="Minutes of speech to render.")
@click.option(
    "--resolution", type=click.Choice([r.value for r in Resolution]), default=Resolution.HD_720.value, show_default=True
)
@click.option("--preview", is_flag=True, help="Half resolution, same motion.")
@click.option("--family", type=click.Choice([f.value for f in Family]), default=Family.WARP.value, show_default=True)
@click.option(
    "--lip-sync",
    type=click.Choice([mode.value for mode in LipSync]),
    default=LipSync.VISEMES.value,
    show_default=True,
    help="warp: mouth shapes from phonemes, or loudness alone (sessions from before visemes).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
def bench_pipeline_command(
    minutes: float, resolution: str, preview: bool, family: str, lip_sync: str, as_json: bool
) -> None:
    """Render MINUTES of real speech through the pipeline and encoder; print fps, realtime ratio,
    per-stage ms per chunk (p50/p95) and per second of audio, encode share and peak RSS."""
    from gpu_worker.bench import bench_pipeline, report_json

    report = bench_pipeline(
        minutes=minutes,
        resolution=Resolution(resolution),
        preview=preview,
        family=Family(family),
        lip_sync=LipSync(lip_sync),
    )
    click.echo(report_json(report) if as_json else report.table())


@bench.command("gpu")
@click.option("--chunks", type=int, default=50, show_default=True, help="Chunks to render (40 + 4 frames).")
@click.option("--preset", default=None, help="Model size: h200 on a GPU, tiny on the CPU (default).")
@click.option("--resolution", default=None, help="720p on a GPU, 512 at half size on the CPU (default).")
@click.option(
    "--residency",
    type=click.Choice([r.value for r in Residency]),
    default=Residency.RESIDENT.value,
    show_default=True,
    help="resident: every model stays on the device; switch: only the running stage's.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the summary.")
def bench_gpu_command(chunks: int, preset: str | None, resolution: str | None, residency: str, as_json: bool) -> None:
    """The dit family on one accelerator: load and compile time, cold and warm TTFF, frames/s and per-stage ms
    over warm chunks, peak memory after 10 and all chunks, the A2V step's TFLOP/s, the visible model switch,
    sparse vs dense SR attention and the FLOPs per frame by stage (CPU: a tiny smoke run)."""
    import json
    from dataclasses import asdict

    from gpu_worker.bench_gpu import bench_gpu, describe

    report = bench_gpu(chunks=chunks, preset_name=preset, resolution=resolution, residency=Residency(residency))
    click.echo(json.dumps(asdict(report)) if as_json else describe(report))


@bench.command("sp")
@click.option(
    "--family", type=click.Choice([f.value for f in SP_FAMILIES]), default=Family.DIT.value, show_default=True
)
@click.option("--preset", default=None, help="dit: a preset, or seed18b (the seed's scale). [default: h200]")
@click.option("--resolution", default=None, help="[default: dit 720p, infinitetalk 480p (or 720p)]")
@click.option("--ranks", type=int, multiple=True, default=(1, 2, 4, 8), show_default=True, help="Repeatable.")
@click.option(
    "--head-groups", type=int, default=2, show_default=True, help="The most head groups per attention (as the node)."
)
@click.option("--n-frames", type=int, default=None, help="Frames per N chunk. [default: dit 40, infinitetalk 72]")
@click.option("--i-frames", type=int, default=None, help="dit: frames per I chunk. [default: 4]")
@click.option(
    "--layout",
    type=click.Choice(["design", "balanced"]),
    default=None,
    help="dit: design (the node as built: DiTs split by tokens, the decode in whole batches with each rank's priming;"
    " the default) or balanced (every stage split evenly in its finest unit: a bound, not built).",
)
@click.option("--fsdp", is_flag=True, help="dit: weights sharded with FSDP2 (gathered per block).")
@click.option(
    "--sampling-preset",
    type=click.Choice([p.value for p in SamplingPreset]),
    default=None,
    help="infinitetalk [default: fast].",
)
@click.option("--first-frames", type=int, default=None, help="infinitetalk: frames in N0, for TTFF. [default: 17]")
@click.option(
    "--vae-tflops", type=float, default=None, help="infinitetalk: the VAE's rate [default: the Wan VAE's, measured]."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
def bench_sp_command(family: str, sampling_preset: str | None, **given: Any) -> None:
    """A MODEL, not a measurement: the node's time per chunk under Ulysses sequence parallelism for each rank
    count. dit: N and I chunks from FLOPs counted on the meta device and per-op rates measured on one H200, with the
    all-to-all bytes per layer, FLOPs per rank, exposed communication and the N/I work-split verdict. infinitetalk:
    a 72-frame N chunk's DiT (the 14B's measured rate), exposed all-to-all, launch overhead modelled from the
    one-rank SP layer, the VAE at the dit decoder's rate standing in, frames/s, speed-up, TTFF and a verdict."""
    preset = None if sampling_preset is None else SamplingPreset(sampling_preset)
    try:
        click.echo(sp_table(SpOptions(Family(family), sampling_preset=preset, **given)))
    except ValueError as error:  # a rank count the heads do not split over, an option the family does not take
        raise click.ClickException(str(error)) from error


@bench.command("upload")
@click.option("--seconds", type=int, default=3600, show_default=True, help="Seconds of FLAC silence to upload.")
@click.option("--max-audio-seconds", type=float, default=None, help="The audio limit (default: the setting's).")
def bench_upload_command(seconds: int, max_audio_seconds: float | None) -> None:
    """Decode SECONDS of FLAC silence (about half a megabyte for an hour) as a node does at submit; print the
    outcome and how much the process's peak RSS grew. Run it in a fresh process: the peak is per process."""
    from cli.benches.upload import bench_upload

    limit = max_audio_seconds if max_audio_seconds is not None else get_settings().limits.max_audio_seconds
    click.echo(bench_upload(max_seconds=limit, seconds=seconds).line())


@bench.command("avatar")
@click.option("--runs", type=int, default=5, show_default=True, help="Live sessions of each kind (after a warm-up).")
@click.option("--api", "api_url", default=None, help="A running API (default: the embedded stack, started if down).")
def bench_avatar_command(runs: int, api_url: str | None) -> None:
    """Live TTFF (create → first segment) from a portrait upload against from an avatar's id."""
    from cli.benches.avatar import bench_avatar
    from monologue import SAMPLES

    with api_or_stack(api_url) as (url, key):
        report = bench_avatar(url, key, SAMPLES / "portrait.jpg", SAMPLES / "speech.wav", runs=runs)
    for line in report.lines():
        click.echo(line)


@bench.command("live")
@click.option(
    "--webrtc", is_flag=True, help="Watch over WebRTC (WHEP) in headless Chromium (the one mode measured here)."
)
@click.option(
    "--whip", is_flag=True, help="Speech in through the player page's microphone over WHIP (not the audio socket)."
)
@click.option(
    "--turn",
    is_flag=True,
    help="Through a TURN server: coturn on loopback, the nodes relay-only (starts a stack of its own, cli/turn.py).",
)
@click.option(
    "--sfu",
    is_flag=True,
    help="Through an SFU: Janus on loopback, the node publishing each session once (a stack of its own, cli/janus.py).",
)
@click.option(
    "--kill",
    is_flag=True,
    help="SIGKILL the session's node halfway through each run; the stall is printed (a stack of its own, two nodes).",
)
@click.option(
    "--calibrate",
    is_flag=True,
    help="First read the A/V measure on a stream Chromium keeps in sync itself (cli/benches/webrtc_calibrate.py).",
)
@click.option("--runs", type=int, default=3, show_default=True, help="Live sessions, one after another.")
@click.option("--bursts", type=int, default=5, show_default=True, help="Speech onsets per session.")
@click.option("--lip-sync", type=click.Choice([v.value for v in LipSync]), default=None, help="The sessions' lip_sync.")
@click.option("--api", "api_url", default=None, help="A running API (default: the embedded stack, started if down).")
@click.option("--dump", type=click.Path(dir_okay=False), default=None, help="Write each run's frame series (JSON).")
def bench_live_command(webrtc: bool, **given: Any) -> None:
    """A live session's TTFF and glass-to-glass latency (speech onset sent → mouth moving in the page) as a viewer
    sees them, p50/p95 over every onset of every run, and its A/V offset (cli/benches/webrtc_runs.py)."""
    from cli.benches.webrtc_runs import LiveBench, run_live_bench

    if not webrtc:
        raise click.UsageError("only --webrtc is measured here (HLS: `monologue bench avatar`, `monologue live`)")
    if given.pop("calibrate"):
        from cli.benches.webrtc_calibrate import calibrate

        click.echo(calibrate(chromium=shutil.which("chromium") or "chromium").line())
    run_live_bench(LiveBench(**given), click.echo)


@bench.command("tts")
@click.option("--voice", default="espeak:en-us", show_default=True, help="espeak:<voice> or piper.")
@click.option("--chars", type=int, default=1000, show_default=True, help="Characters of prose to speak.")
def bench_tts_command(voice: str, chars: int) -> None:
    """Speak CHARS characters in VOICE as a node does for a render given text (synthesis and normalisation); print
    the cost per second of speech. Piper uses this machine's MONOLOGUE_TTS__PIPER_VOICE."""
    from cli.benches.tts import bench_tts

    click.echo(bench_tts(voice=voice, chars=chars, piper_voice=get_settings().tts.piper_voice).line())


@bench.command("orchestration")
@click.option("--minutes", type=float, default=1.0, show_default=True, help="Minutes of speech to render.")
@click.option("--lease-timeout", type=float, default=5.0, show_default=True, help="Node lease heartbeat timeout (s).")
def bench_orchestration_command(minutes: float, lease_timeout: float) -> None:
    """Start a private stack with two nodes and print node idle time between chunks, Temporal's round trip,
    checkpoint write time, history events per chunk and recovery time after a node kill."""
    from cli.benches.orchestration import bench_orchestration

    click.echo(bench_orchestration(minutes=minutes, lease_timeout_s=lease_timeout).table())


class ClusterScenario(StrEnum):
    """`monologue bench cluster --scenario`: full (the default, its shape from the options), small (CI's) or
    contention (two tenants on an oversubscribed cluster, issue 27: cli/benches/contention.py)."""

    FULL = "full"
    SMALL = "small"
    CONTENTION = "contention"


@bench.command("cluster")
@click.option(
    "--postgres",
    "postgres_url",
    required=True,
    help="A PostgreSQL server's admin URL (postgresql+psycopg://user:pw@host/db); a fresh database is made there.",
)
@click.option("--nodes", type=int, default=4, show_default=True)
@click.option("--capacity", type=int, default=2, show_default=True, help="Session slots per node.")
@click.option("--renders", type=int, default=20, show_default=True)
@click.option("--live", type=int, default=4, show_default=True, help="Live sessions streaming speech in real time.")
@click.option("--node-kills", type=int, default=8, show_default=True)
@click.option(
    "--chunk-delay", type=float, default=0.3, show_default=True, help="Stretch every chunk (s), so kills land."
)
@click.option(
    "--scenario",
    "scenario_name",
    type=click.Choice([s.value for s in ClusterScenario]),
    default=ClusterScenario.FULL.value,
    show_default=True,
    help="full: the options' shape; small: CI's; contention: tenant big's 20 renders against small's 2 renders and"
    " 4 live sessions on 4 nodes × 2 slots, 4 node kills (--nodes, --capacity, --chunk-delay, --node-kills apply).",
)
@click.option("--small", is_flag=True, help="CI's scenario: 2 nodes, 6 sessions, 3 node kills (= --scenario small).")
@click.option(
    "--keep-logs",
    type=click.Path(file_okay=False, path_type=Path),
    help="Copy every process's log (JSON lines: leases, chunks, yields) here before the cluster's folder goes.",
)
@click.pass_context
def bench_cluster_command(
    ctx: click.Context,
    postgres_url: str,
    nodes: int,
    capacity: int,
    renders: int,
    live: int,
    node_kills: int,
    chunk_delay: float,
    scenario_name: str,
    small: bool,
    keep_logs: Path | None,
) -> None:
    """Two API processes and NODES nodes on loopback (Temporal, PostgreSQL, SeaweedFS, Prometheus): sessions while
    random nodes and one API are SIGKILLed and restarted. Prints sessions/hour, queue wait, recovery per kill, slot
    utilisation and Prometheus figures, and every check that failed (exit 1). With --scenario contention, also the
    scheduling's figures (live TTFF, queue wait per tenant and class, fairness, preemptions) against issue 27's
    goals."""
    import dataclasses

    from cli.benches.cluster import FULL, SMALL
    from cli.benches.cluster_run import bench_cluster
    from cli.cluster import Shape

    name = _cluster_scenario(ctx, ClusterScenario(scenario_name), small)
    if name is ClusterScenario.CONTENTION:
        _bench_contention(ctx, postgres_url, keep_logs)
        return
    scenario = SMALL if name is ClusterScenario.SMALL else FULL
    if name is ClusterScenario.FULL:
        shape = Shape(nodes=nodes, capacity=capacity, chunk_delay_s=chunk_delay)
        scenario = dataclasses.replace(scenario, shape=shape, renders=renders, live=live, node_kills=node_kills)
    report = bench_cluster(scenario, postgres_url, keep_logs)
    click.echo(report.table())
    if report.problems:
        raise SystemExit(1)


def _given(ctx: click.Context, name: str) -> bool:
    return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


def _cluster_scenario(ctx: click.Context, name: ClusterScenario, small: bool) -> ClusterScenario:
    """The scenario asked for; --small is --scenario small, and conflicts with any other."""
    if small and _given(ctx, "scenario_name") and name is not ClusterScenario.SMALL:
        raise click.UsageError(f"--small conflicts with --scenario {name}")
    if small:
        return ClusterScenario.SMALL
    if name is ClusterScenario.CONTENTION and (given := [n for n in ("renders", "live") if _given(ctx, n)]):
        raise click.UsageError(f"--scenario contention fixes its tenants' sessions; drop --{' --'.join(given)}")
    return name


def _bench_contention(ctx: click.Context, postgres_url: str, keep_logs: Path | None) -> None:
    import dataclasses

    from cli.benches.contention import CONTENTION, bench_contention

    base = CONTENTION.scenario
    shape_changes = {n: ctx.params[n] for n in ("nodes", "capacity") if _given(ctx, n)}
    if _given(ctx, "chunk_delay"):
        shape_changes["chunk_delay_s"] = ctx.params["chunk_delay"]
    kills = {"node_kills": ctx.params["node_kills"]} if _given(ctx, "node_kills") else {}
    scenario = dataclasses.replace(base, shape=dataclasses.replace(base.shape, **shape_changes), **kills)
    report = bench_contention(dataclasses.replace(CONTENTION, scenario=scenario), postgres_url, keep_logs)
    click.echo(report.table())
    if report.problems:
        raise SystemExit(1)


@bench.command("faults")
@click.option(
    "--fault",
    "names",
    multiple=True,
    type=click.Choice([fault.value for fault in Fault]),
    help="Only these faults (repeat the option); default: every one.",
)
def bench_faults_command(names: tuple[str, ...]) -> None:
    """Two renders and a live session through a loopback cluster while a service beneath it fails (cli/faults.py):
    per fault, sessions completed and identical to a clean run, outage length, time to recover, the live stream's
    longest stall, the API's answers by status, segments stored twice and a stale lease's writes refused. Exit 1
    when anything that must hold did not."""
    from cli.faults import fault_rig, run_fault

    faults = [Fault(name) for name in names] or list(Fault)
    problems = []
    with fault_rig() as rig:
        for fault in faults:
            report = run_fault(rig, fault)
            click.echo(report.line())
            problems += [f"{fault.value}: {problem}" for problem in report.problems]
    for problem in problems:
        click.echo(f"PROBLEM: {problem}")
    if problems:
        raise SystemExit(1)
