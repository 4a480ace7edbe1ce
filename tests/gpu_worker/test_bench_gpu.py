"""`monologue bench gpu` runs end to end (here on the CPU with the tiny preset) and reports every figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu_worker.bench_gpu import GpuReport, bench_gpu, describe, main
from gpu_worker.quantize import QuantMode
from gpu_worker.weight_memory import weight_memory


@pytest.fixture(scope="module")
def report() -> GpuReport:
    """A warm-up session of N0, then a measured one of N0 N1 I0 (chunks of 8 + 4 frames: fast)."""
    return bench_gpu(chunks=3, warmup_chunks=1, chunk_frames=8, i_frames=4, switch_rounds=2)


def test_the_gpu_benchmark_reports_every_figure_on_a_tiny_cpu_run(report: GpuReport) -> None:
    assert report.errors == {}
    assert (report.device, report.preset, report.width, report.height) == ("cpu", "tiny", 256, 256)
    assert (report.residency, report.weights_dtype) == ("resident", "float32")  # Precision.AUTO on the CPU
    assert report.warmup_chunks == 1 and report.chunks == 3
    assert report.frames == 8 + 8 + 4  # N0 N1 I0 of the warm session only
    assert report.load_s > 0 and report.warmup_s > 0
    assert report.cold_ttff_ms > 0 and report.warm_ttff_ms > 0
    assert report.frames_per_s > 0 and report.realtime_ratio > 0
    assert set(report.chunk_ms_p50) == set(report.stage_ms_p50) == {"N", "I"}
    for stages in report.stage_ms_p50.values():
        assert set(stages) == {"context", "audio_to_video", "super_resolution", "decode_publish"}
    assert report.switch_in_render_ms == {}  # resident: no switches in the render
    assert report.peak_mb_after_all >= report.peak_mb_after_10 > 0 and report.peak_mb_warmup > 0
    assert report.allocated_mb_after_all > 0 and report.allocated_mb_after_10 > 0
    assert report.a2v_step["tflop"] > 0 and report.a2v_step["tflops"] > 0
    assert report.a2v_step["dtype"] == "float32" and report.a2v_step["share_of_peak"] is None  # no card
    assert 0 < report.sr_attention["skipped_blocks"] < 1 and report.sr_attention["useful_vs_dense"] > 0
    # The isolated switch, on an N chunk's and an I chunk's inputs, into each model.
    assert report.switch_ms["dtype"] == "float32"
    assert {kind: set(models) for kind, models in report.switch_ms.items() if kind != "dtype"} == {
        "N": {"a2v", "sr"},
        "I": {"a2v", "sr"},
    }
    assert report.tflop_per_frame["total"] > 0 and "TFLOP/frame" in report.flops_text
    assert report.render_tflops is None  # only for full-size frames on a GPU
    assert set(report.parameters) == {"vae_encoder", "audio_encoder", "text_encoder", "a2v", "sr", "vae_decoder"}
    # weight memory per model (parameters and buffers), as gpu_worker.weight_memory counts it on the meta device
    assert report.quantize == "none"
    assert report.weight_bytes == weight_memory("tiny", torch.float32, QuantMode.NONE)


def test_the_summary_prints_every_figure(report: GpuReport) -> None:
    text = describe(report)
    for label in ("tiny preset on the CPU", "TTFF cold", "TTFF warm", "throughput", "stage p50 N", "stage p50 I"):
        assert label in text
    for label in ("peak memory", "A2V step", "SR attention", "switch N→a2v", "switch I→sr", "total", "weight MiB"):
        assert label in text


def test_switch_residency_records_each_chunks_visible_switch_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Also the command line: JSON on stdout, the same JSON in --json-out, progress lines on stderr."""
    out = tmp_path / "bench.json"
    flags = ["--residency", "switch", "--chunks", "2", "--warmup-chunks", "1", "--chunk-frames", "8", "--no-flops"]
    main([*flags, "--json", "--json-out", str(out), "--progress"])
    printed, progress = capsys.readouterr()
    report = GpuReport(**json.loads(printed))
    assert json.loads(out.read_text()) == json.loads(printed)
    assert "chunk N0 (8 frames)" in progress and "warm-up session done" in progress
    assert report.errors == {} and report.residency == "switch" and report.chunks == 2
    assert set(report.switch_in_render_ms) == {"N"} and report.switch_in_render_ms["N"]["max"] >= 0
    assert "switch" in report.stage_ms_p50["N"]
    assert report.a2v_step == {} and report.switch_ms == {}  # the models are not resident: measured resident
    assert report.tflop_per_frame == {}  # --no-flops
    assert "switch in N" in describe(report)
