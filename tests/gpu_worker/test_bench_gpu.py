"""`monologue bench gpu` runs end to end (here on the CPU with the tiny preset) and reports every figure."""

from __future__ import annotations

from gpu_worker.bench_gpu import bench_gpu, describe


def test_the_gpu_benchmark_reports_every_figure_on_a_tiny_cpu_run() -> None:
    report = bench_gpu(chunks=3)
    assert report.errors == {}
    assert (report.device, report.preset, report.width, report.height) == ("cpu", "tiny", 256, 256)
    assert report.frames == 40 + 40 + 4  # N0 N1 I0
    assert report.ttff_ms > 0 and report.frames_per_s > 0 and report.realtime_factor > 0
    assert set(report.stage_ms_p50) == {"context", "audio_to_video", "super_resolution", "decode_publish"}
    assert report.peak_mb_after_all >= report.peak_mb_after_10 > 0
    assert report.a2v_step_tflops is not None and report.a2v_step_tflops > 0
    assert 0 < report.sr_attention["skipped_blocks"] < 1 and report.sr_attention["useful_vs_dense"] > 0
    assert set(report.switch_ms) == {"a2v", "sr"}
    assert sum(report.parameters.values()) == 423_219  # the tiny preset, as documented
    assert "tiny preset on the CPU" in describe(report)


def test_the_gpu_benchmark_imports_with_torch_alone() -> None:
    """The GPU machine has torch, numpy and Pillow but no service stack: the benchmark must not need it."""
    import subprocess
    import sys

    probe = """
import sys
for name in ("av", "temporalio", "fastapi", "sqlalchemy", "pydantic", "structlog", "boto3", "psycopg"):
    sys.modules[name] = None  # as if not installed: importing fails, importlib.util.find_spec says None
import gpu_worker.bench_gpu
"""
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=120)
