"""The quality gate (`monologue gate`) on render records of the tiny dit preset and on MP4 files: bit-identical
renders pass on hashes, small differences pass the PSNR/SSIM band, large ones fail naming the frame, a
baseline that does not repeat itself fails, and mismatched inputs are refused clearly. Plus the two uses
issue 14 asks for: SWITCH residency is bit-identical to RESIDENT, and bf16 is within the band of fp32."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from click.testing import CliRunner

from cli.main import main as cli
from gpu_worker.models.dit.runtime import Precision
from gpu_worker.render_record import RecordSettings, render_record, stored_indices
from monologue.contracts import Residency
from monologue.gate import FRAMES_FILE, RECORD_FILE, Band, GateInputError, Verdict, frame_hash, gate, main, ssim

# 12 frames of the tiny preset at 256x256 in three chunks (N0 N1 I0): a seam, and a switch per stage.
SMALL = RecordSettings(preset="tiny", resolution="512", preview=True, seconds=0.48, chunk_frames=4, i_frames=4)
# The band bf16 must meet against fp32 on the tiny preset; measured on this clip: lowest PSNR 44.3 dB, SSIM 0.9993.
BF16_BAND = Band(min_psnr=40.0, min_ssim=0.99)


def _render(tmp_path_factory: pytest.TempPathFactory, name: str, **changes: object) -> Path:
    settings = RecordSettings(**{**SMALL.__dict__, **changes})
    out = tmp_path_factory.mktemp(name)
    render_record(settings, out)
    return out


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _render(tmp_path_factory, "fp32-resident", precision=Precision.FP32, residency=Residency.RESIDENT)


@pytest.fixture(scope="module")
def repeat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The baseline rendered again: the double baseline every comparison below should have."""
    return _render(tmp_path_factory, "fp32-resident-again", precision=Precision.FP32, residency=Residency.RESIDENT)


@pytest.fixture(scope="module")
def switched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _render(tmp_path_factory, "fp32-switch", precision=Precision.FP32, residency=Residency.SWITCH)


def _edited(record: Path, out: Path, frame: int, change: int, pixels: Any = slice(None)) -> Path:
    """A copy of `record` with `change` added to some pixels of one frame (its hash updated to match)."""
    shutil.copytree(record, out)
    frames = np.load(out / FRAMES_FILE)
    edited = frames[frame].astype(np.int16)
    edited[pixels] += change
    frames[frame] = np.clip(edited, 0, 255).astype(np.uint8)
    np.save(out / FRAMES_FILE, frames)
    meta = json.loads((out / RECORD_FILE).read_text())
    meta["frame_hashes"][frame] = frame_hash(frames[frame])
    (out / RECORD_FILE).write_text(json.dumps(meta))
    return out


def test_a_record_holds_every_frame_hash_and_the_frames_they_describe(baseline: Path) -> None:
    meta = json.loads((baseline / RECORD_FILE).read_text())
    frames = np.load(baseline / FRAMES_FILE)
    assert frames.shape == (12, 256, 256, 3) and frames.dtype == np.uint8
    assert meta["frame_hashes"] == [frame_hash(frame) for frame in frames]
    assert meta["settings"]["precision"] == "fp32" and meta["settings"]["residency"] == "resident"
    assert (meta["width"], meta["height"], meta["fps"], meta["stored_frames"]) == (256, 256, 25, list(range(12)))


def test_switch_residency_renders_the_frames_of_resident_bit_for_bit(
    baseline: Path, repeat: Path, switched: Path
) -> None:
    report = gate(baseline, switched, baseline_repeat=repeat)
    assert report.verdict is Verdict.PASS and report.bit_identical and report.differing == 0, report.reason
    assert report.scores == [] and report.reason == "bit-identical: all 12 frame hashes match"


def test_bf16_differs_from_fp32_but_stays_within_the_band(
    baseline: Path, repeat: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    bf16 = _render(tmp_path_factory, "bf16", precision=Precision.BF16)
    report = gate(baseline, bf16, baseline_repeat=repeat, band=BF16_BAND)
    assert not report.bit_identical and report.differing > 0
    assert report.verdict is Verdict.PASS, report.reason
    assert len(report.scores) == report.differing and all(s.psnr_db >= 40 for s in report.scores)


def test_one_slightly_changed_frame_passes_the_band_with_its_psnr(baseline: Path, tmp_path: Path) -> None:
    candidate = _edited(baseline, tmp_path / "slight", frame=5, change=2, pixels=np.s_[::7, ::5])
    report = gate(baseline, candidate)
    assert report.verdict is Verdict.PASS and report.differing == 1, report.reason
    (score,) = report.scores
    assert score.frame == 5 and 35 < score.psnr_db < 80 and score.ssim > 0.95 and score.within_band


def test_one_heavily_changed_frame_fails_naming_it(
    baseline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    candidate = _edited(baseline, tmp_path / "heavy", frame=9, change=90, pixels=np.s_[64:192, 64:192])
    assert main([str(baseline), str(candidate)]) == 1
    text = capsys.readouterr().out
    assert text.startswith("FAIL: 1 of 12 frames differ; 1 outside the band (worst: frame 9)")
    assert "frame      9  PSNR" in text and "OUT" in text
    assert main([str(baseline), str(candidate), "--min-psnr", "5"]) == 1  # PSNR alone would pass; SSIM does not
    assert main([str(baseline), str(candidate), "--min-psnr", "5", "--min-ssim", "0.1"]) == 0  # a looser band


def test_a_baseline_that_does_not_repeat_itself_fails_whatever_the_candidate(baseline: Path, tmp_path: Path) -> None:
    drifted = _edited(baseline, tmp_path / "drifted", frame=3, change=1, pixels=np.s_[0, 0])
    report = gate(baseline, baseline, baseline_repeat=drifted)
    assert report.verdict is Verdict.FAIL
    assert report.reason.startswith("baseline is not deterministic: 1 of 12 frames differ (first: frame 3)")


def test_mismatched_inputs_fail_with_a_clear_message(baseline: Path, tmp_path: Path) -> None:
    shorter = tmp_path / "shorter"
    shutil.copytree(baseline, shorter)
    meta = json.loads((shorter / RECORD_FILE).read_text())
    meta["frame_hashes"] = meta["frame_hashes"][:8]
    meta["stored_frames"] = list(range(8))
    (shorter / RECORD_FILE).write_text(json.dumps(meta))
    np.save(shorter / FRAMES_FILE, np.load(shorter / FRAMES_FILE)[:8])
    assert gate(baseline, shorter).reason == "frame counts differ: baseline has 12 frames, candidate 8"

    small = _write_mp4(tmp_path / "small.mp4", np.zeros((12, 128, 128, 3), np.uint8))
    report = gate(baseline, small)
    assert (report.verdict, report.reason) == (Verdict.FAIL, "frame sizes differ: baseline 256x256, candidate 128x128")
    faster = _write_mp4(tmp_path / "faster.mp4", np.load(baseline / FRAMES_FILE), rate=30)
    assert gate(baseline, faster).reason == "frame rates differ: baseline 25 fps, candidate 30 fps"


def test_unreadable_inputs_are_bad_input(baseline: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(baseline), str(tmp_path / "missing")]) == 2
    assert "no such render record" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt"
    shutil.copytree(baseline, corrupt)
    frames = np.load(corrupt / FRAMES_FILE)
    frames[2] ^= 1  # pixels that no longer match record.json's hash
    np.save(corrupt / FRAMES_FILE, frames)
    with pytest.raises(GateInputError, match="stored frame 2 does not match"):
        gate(baseline, corrupt)
    (tmp_path / "notes.txt").write_text("not a video")
    assert main([str(baseline), str(tmp_path / "notes.txt"), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["verdict"] == "error"


def _write_mp4(path: Path, frames: np.ndarray, rate: int = 25) -> Path:
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=rate, options={"crf": "0", "threads": "1"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv444p"
        for frame in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def test_mp4_inputs_are_decoded_and_compared(baseline: Path, tmp_path: Path) -> None:
    frames = np.load(baseline / FRAMES_FILE)
    first, second = _write_mp4(tmp_path / "a.mp4", frames), _write_mp4(tmp_path / "b.mp4", frames)
    assert gate(first, second).bit_identical  # the same encode decodes to the same pixels
    report = gate(baseline, first)  # the record's exact frames against their (RGB → YUV) encode
    assert report.differing == 12 and len(report.scores) == 12 and report.verdict is Verdict.PASS, report.reason


def test_only_stored_frames_are_measured_and_the_rest_are_named(baseline: Path, tmp_path: Path) -> None:
    assert stored_indices(12, 100) == list(range(12)) and stored_indices(12, 4) == [0, 3, 7, 11]
    assert stored_indices(12, 1) == [0] and stored_indices(12, 0) == []
    sparse = tmp_path / "sparse"
    shutil.copytree(baseline, sparse)
    meta = json.loads((sparse / RECORD_FILE).read_text())
    meta["stored_frames"] = stored_indices(12, 4)
    (sparse / RECORD_FILE).write_text(json.dumps(meta))
    np.save(sparse / FRAMES_FILE, np.load(sparse / FRAMES_FILE)[meta["stored_frames"]])
    candidate = _edited(baseline, tmp_path / "two", frame=3, change=1, pixels=np.s_[0, :])
    candidate = _edited(candidate, tmp_path / "two-more", frame=4, change=1, pixels=np.s_[0, :])
    report = gate(sparse, candidate)
    assert [s.frame for s in report.scores] == [3] and report.unmeasured == [4]
    assert report.verdict is Verdict.PASS and "1 differing frames are not stored" in report.reason


def test_ssim_is_scikit_images_gaussian_ssim() -> None:
    metrics = pytest.importorskip("skimage.metrics")
    rng = np.random.default_rng(3)
    base = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    for noise in (0, 3, 40):
        other = np.clip(base + rng.integers(-noise, noise + 1, base.shape), 0, 255).astype(np.uint8)
        expected = metrics.structural_similarity(
            base, other, channel_axis=-1, gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255
        )
        assert ssim(base, other) == pytest.approx(expected, abs=1e-6)


def test_the_cli_runs_the_gate_and_exits_with_its_verdict(baseline: Path, switched: Path) -> None:
    result = CliRunner().invoke(cli, ["gate", str(baseline), str(switched), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["verdict"] == "pass"
    assert "--baseline-repeat" in CliRunner().invoke(cli, ["gate", "--help"]).output


def test_records_are_made_and_gated_with_torch_and_numpy_alone(tmp_path: Path) -> None:
    """The GPU machine has no PyAV, pydantic or click: `python -m gpu_worker.render_record` and
    `python -m monologue.gate` must run without them."""
    probe = f"""
import runpy, sys
for name in ("av", "temporalio", "fastapi", "sqlalchemy", "pydantic", "structlog", "boto3", "click", "skimage"):
    sys.modules[name] = None  # as if not installed
sys.argv = ["render_record", {str(tmp_path)!r}, "--preview", "--seconds", "0.16", "--chunk-frames", "4"]
runpy.run_module("gpu_worker.render_record", run_name="__main__")
from monologue.gate import main
sys.exit(main([{str(tmp_path)!r}, {str(tmp_path)!r}, "--baseline-repeat", {str(tmp_path)!r}]))
"""
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert "4 frames 256x256 at 25 fps (4 stored), auto/resident on cpu" in ran.stdout
    assert "PASS: bit-identical: all 4 frame hashes match" in ran.stdout
