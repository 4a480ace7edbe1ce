"""The quality gate: does a candidate render still match its baseline? (`monologue gate BASELINE CANDIDATE`)

Every optimisation of the renderer (bf16 weights, switching models on and off the device, a new kernel)
is ported only if it passes this check against a render made without it. The rule, in order:

1. **The baseline must be deterministic.** With `--baseline-repeat`, the baseline rendered a second time
   must hash identical to the first, frame for frame; otherwise the gate fails ("baseline is not
   deterministic"): a difference to the candidate could then come from the noise, not the change.
2. **Same shape.** Both renders must have the same frame count, frame size and frame rate.
3. **Bit-identical frames pass.** If every frame's SHA-256 matches, the change altered nothing.
4. **Otherwise, a quality band.** Each differing frame (of those stored in both inputs) is scored by PSNR
   and SSIM against the baseline's; the gate passes if every one is within the band (default: PSNR ≥
   35 dB and SSIM ≥ 0.95), and lists the worst frames either way.

Inputs are render records (directories written by `python -m gpu_worker.render_record`: record.json with
the pipeline's per-frame hashes, frames.npy with the stored frames) or video files such as the MP4 of
`monologue render -o` (decoded with PyAV, imported only then; hashes are of the decoded RGB frames).
SSIM is the standard one (Wang et al. 2004: an 11-tap Gaussian window of σ 1.5, the means of each RGB
channel's map averaged), written here in numpy so the gate needs nothing but numpy; the tests check it
against scikit-image's `structural_similarity`. Exit codes: 0 pass, 1 fail, 2 bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

# A render record as gpu_worker/render_record.py writes it; bump the format when record.json changes shape.
RECORD_FILE, FRAMES_FILE, RECORD_FORMAT = "record.json", "frames.npy", 1
SSIM_SIGMA, SSIM_RADIUS = 1.5, 5  # 11 taps: scikit-image's gaussian_weights=True (truncate 3.5)
SSIM_K1, SSIM_K2, PEAK = 0.01, 0.03, 255.0


class Verdict(StrEnum):
    PASS = "pass"
    FAIL = "fail"


class InputKind(StrEnum):
    RECORD = "record"
    VIDEO = "video"


class GateInputError(ValueError):
    """An input the gate cannot read (exit code 2): missing, malformed, or of an unknown format."""


@dataclass(frozen=True)
class Band:
    """The worst a differing frame may be and still pass."""

    min_psnr: float = 35.0
    min_ssim: float = 0.95


@dataclass
class Video:
    """One side of a comparison: every frame's hash, and the pixels of the stored ones."""

    path: Path
    kind: InputKind
    width: int
    height: int
    fps: float
    frame_hashes: list[str]
    stored: dict[int, int]  # timeline frame → row of `frames`
    frames: np.ndarray  # (stored, H, W, 3) uint8; a memory map for records

    def frame(self, index: int) -> np.ndarray:
        return np.asarray(self.frames[self.stored[index]])


@dataclass
class FrameScore:
    frame: int
    psnr_db: float
    ssim: float
    within_band: bool


@dataclass
class GateReport:
    verdict: Verdict
    reason: str
    baseline: str
    candidate: str
    band: Band
    baseline_repeat: str | None = None
    frames: int = 0
    bit_identical: bool = False
    differing: int = 0
    scores: list[FrameScore] = field(default_factory=list)  # differing frames measured, in timeline order
    unmeasured: list[int] = field(default_factory=list)  # differing frames not stored in both inputs
    worst: list[FrameScore] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def frame_hash(frame: np.ndarray) -> str:
    """SHA-256 of a uint8 frame's bytes, as the pipeline's DecodePublishStage computes it."""
    return hashlib.sha256(np.ascontiguousarray(frame).tobytes()).hexdigest()


def load(path: Path) -> Video:
    """A render record (a directory) or a video file."""
    if path.is_dir():
        return _load_record(path)
    if path.is_file():
        return _load_video(path)
    raise GateInputError(f"{path}: no such render record (directory) or video file")


def _load_record(directory: Path) -> Video:
    try:
        record = json.loads((directory / RECORD_FILE).read_text())
        if record.get("format") != RECORD_FORMAT:
            raise GateInputError(
                f"{directory}: record format {record.get('format')!r}, this gate reads {RECORD_FORMAT}"
            )
        width, height, hashes = int(record["width"]), int(record["height"]), list(record["frame_hashes"])
        stored = {int(frame): row for row, frame in enumerate(record["stored_frames"])}
        fps = float(record["fps"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        if isinstance(err, GateInputError):
            raise
        raise GateInputError(f"{directory}: not a render record ({type(err).__name__}: {err})") from err
    frames_path = directory / FRAMES_FILE
    frames = np.load(frames_path, mmap_mode="r") if stored else np.zeros((0, height, width, 3), np.uint8)
    if frames.shape != (len(stored), height, width, 3) or frames.dtype != np.uint8:
        raise GateInputError(
            f"{frames_path}: {frames.shape} {frames.dtype}, record.json says {(len(stored), height, width, 3)} uint8"
        )
    video = Video(directory, InputKind.RECORD, width, height, fps, hashes, stored, frames)
    for index in stored:  # the pixels must be the frames the hashes describe
        if index >= len(hashes) or frame_hash(video.frame(index)) != hashes[index]:
            raise GateInputError(f"{frames_path}: stored frame {index} does not match record.json's hash")
    return video


def _load_video(path: Path) -> Video:
    try:
        import av
    except ImportError as err:
        raise GateInputError(f"{path}: reading video files needs PyAV (pip install av)") from err
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    except (av.FFmpegError, IndexError) as err:
        raise GateInputError(f"{path}: not a readable video ({type(err).__name__}: {err})") from err
    if not frames:
        raise GateInputError(f"{path}: the video has no frames")
    pixels = np.stack(frames)
    _, height, width, _ = pixels.shape
    hashes = [frame_hash(frame) for frame in pixels]
    stored = {index: index for index in range(len(pixels))}
    return Video(path, InputKind.VIDEO, width, height, float(rate or 0), hashes, stored, pixels)


def psnr(baseline: np.ndarray, candidate: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB of two uint8 frames (inf when they are equal)."""
    mse = float(np.mean((baseline.astype(np.float64) - candidate.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else float(10 * np.log10(PEAK**2 / mse))


def _gaussian_window() -> np.ndarray:
    taps = np.arange(-SSIM_RADIUS, SSIM_RADIUS + 1, dtype=np.float64)
    weights = np.exp(-0.5 * (taps / SSIM_SIGMA) ** 2)
    return np.asarray(weights / weights.sum(), dtype=np.float32)


def _blur_valid(maps: np.ndarray, axis: int) -> np.ndarray:
    """Gaussian blur of float32 `maps` along `axis`, keeping only positions whose window lies inside (no edge
    handling needed: SSIM leaves that strip out). In place where it can: a 720p frame takes about 0.3 s."""
    window = _gaussian_window()
    size = maps.shape[axis] - len(window) + 1

    def shifted(k: int) -> np.ndarray:  # maps[..., k : k + size, ...] along `axis`, a view
        return maps[(slice(None),) * axis + (slice(k, k + size),)]

    out: np.ndarray = np.multiply(shifted(0), window[0])
    scratch = np.empty_like(out)
    for k, weight in enumerate(window[1:], start=1):
        np.multiply(shifted(k), weight, out=scratch)
        out += scratch
    return out


def ssim(baseline: np.ndarray, candidate: np.ndarray) -> float:
    """Mean structural similarity of two (H, W, 3) uint8 frames: the Gaussian-window SSIM of Wang et al.,
    equal to scikit-image's `structural_similarity(a, b, channel_axis=-1, gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=255)` (its edge strip is likewise left out) to about 1e-6.

    float32 for speed; the pixels are centred on 0 first so the variances (E[x²] - E[x]²) keep their digits."""
    if min(baseline.shape[:2]) < 2 * SSIM_RADIUS + 1:
        raise GateInputError(f"frames of {baseline.shape[1]}x{baseline.shape[0]} are too small for SSIM")
    x = baseline.astype(np.float32) - 128
    y = candidate.astype(np.float32) - 128
    blurred = _blur_valid(_blur_valid(np.stack([x, y, x * x, y * y, x * y]), axis=1), axis=2)
    mu_x, mu_y, xx, yy, xy = blurred
    var_x, var_y, cov = xx - mu_x * mu_x, yy - mu_y * mu_y, xy - mu_x * mu_y
    mu_x += 128
    mu_y += 128
    c1, c2 = (SSIM_K1 * PEAK) ** 2, (SSIM_K2 * PEAK) ** 2
    similarity = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return float(similarity.mean(dtype=np.float64))


def _shape_mismatch(first: Video, second: Video, names: tuple[str, str]) -> str | None:
    a, b = names
    if len(first.frame_hashes) != len(second.frame_hashes):
        return f"frame counts differ: {a} has {len(first.frame_hashes)} frames, {b} {len(second.frame_hashes)}"
    if (first.width, first.height) != (second.width, second.height):
        return f"frame sizes differ: {a} {first.width}x{first.height}, {b} {second.width}x{second.height}"
    if first.fps and second.fps and abs(first.fps - second.fps) > 1e-3:
        return f"frame rates differ: {a} {first.fps:g} fps, {b} {second.fps:g} fps"
    return None


def _differing(first: Video, second: Video) -> list[int]:
    return [index for index, (a, b) in enumerate(zip(first.frame_hashes, second.frame_hashes, strict=True)) if a != b]


def gate(
    baseline: Path, candidate: Path, *, baseline_repeat: Path | None = None, band: Band | None = None, worst: int = 5
) -> GateReport:
    """Apply the gate's rule (module docstring) to two renders. Raises GateInputError on unreadable input."""
    band = band or Band()
    base, cand = load(baseline), load(candidate)
    report = GateReport(Verdict.FAIL, "", str(baseline), str(candidate), band, frames=len(base.frame_hashes))
    if baseline_repeat is not None:
        report.baseline_repeat = str(baseline_repeat)
        repeat = load(baseline_repeat)
        mismatch = _shape_mismatch(base, repeat, ("baseline", "its repeat"))
        changed = [] if mismatch else _differing(base, repeat)
        if mismatch or changed:
            detail = mismatch or f"{len(changed)} of {len(base.frame_hashes)} frames differ (first: frame {changed[0]})"
            report.reason = f"baseline is not deterministic: {detail}; a difference to the candidate proves nothing"
            return report
    mismatch = _shape_mismatch(base, cand, ("baseline", "candidate"))
    if mismatch:
        report.reason = mismatch
        return report
    differing = _differing(base, cand)
    report.differing = len(differing)
    if not differing:
        report.verdict, report.bit_identical = Verdict.PASS, True
        report.reason = f"bit-identical: all {report.frames} frame hashes match"
        return report
    _score(report, base, cand, differing, worst)
    return report


def _score(report: GateReport, base: Video, cand: Video, differing: list[int], worst: int) -> None:
    band = report.band
    for index in differing:
        if index not in base.stored or index not in cand.stored:
            report.unmeasured.append(index)
            continue
        a, b = base.frame(index), cand.frame(index)
        quality, similarity = psnr(a, b), ssim(a, b)
        within = quality >= band.min_psnr and similarity >= band.min_ssim
        report.scores.append(FrameScore(index, round(quality, 3), round(similarity, 5), within))
    report.worst = sorted(report.scores, key=lambda score: (score.within_band, score.psnr_db, score.ssim))[:worst]
    outside = [score for score in report.scores if not score.within_band]
    counted = f"{len(differing)} of {report.frames} frames differ"
    if not report.scores:
        report.reason = f"{counted} and none of them is stored in both inputs (record more with --keep-frames)"
    elif outside:
        report.reason = f"{counted}; {len(outside)} outside the band (worst: frame {report.worst[0].frame})"
    else:
        report.verdict = Verdict.PASS
        low_psnr, low_ssim = min(s.psnr_db for s in report.scores), min(s.ssim for s in report.scores)
        report.reason = f"{counted}, all within the band (lowest PSNR {low_psnr:.2f} dB, lowest SSIM {low_ssim:.4f})"
    if report.unmeasured:
        report.reason += f"; {len(report.unmeasured)} differing frames are not stored and were not measured"


def describe(report: GateReport) -> str:
    """The report as text for a person."""
    lines = [f"{report.verdict.value.upper()}: {report.reason}", f"  baseline:  {report.baseline}"]
    if report.baseline_repeat:
        lines.append(f"  repeat:    {report.baseline_repeat}")
    lines.append(f"  candidate: {report.candidate}")
    if report.scores or report.unmeasured:
        band = report.band
        lines.append(
            f"  band: PSNR >= {band.min_psnr:g} dB and SSIM >= {band.min_ssim:g} per frame; "
            f"{len(report.scores)} differing frames measured"
        )
    if report.worst:
        lines.append("  worst frames:")
        lines += [
            f"    frame {s.frame:>6}  PSNR {s.psnr_db:7.2f} dB  SSIM {s.ssim:.4f}  {'ok' if s.within_band else 'OUT'}"
            for s in report.worst
        ]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="monologue gate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("baseline", type=Path, help="render record directory or video file")
    parser.add_argument("candidate", type=Path, help="render record directory or video file")
    parser.add_argument("--baseline-repeat", type=Path, help="the baseline rendered again: must hash identical")
    parser.add_argument("--min-psnr", type=float, default=Band.min_psnr, help="dB, per differing frame")
    parser.add_argument("--min-ssim", type=float, default=Band.min_ssim, help="per differing frame")
    parser.add_argument("--worst", type=int, default=5, help="how many of the worst frames to list")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the gate from the command line; returns the exit code (0 pass, 1 fail, 2 bad input)."""
    args = _parser().parse_args(argv)
    band = Band(min_psnr=args.min_psnr, min_ssim=args.min_ssim)
    try:
        report = gate(args.baseline, args.candidate, baseline_repeat=args.baseline_repeat, band=band, worst=args.worst)
    except GateInputError as err:
        if args.json:
            print(json.dumps({"verdict": "error", "error": str(err)}))
        else:
            print(f"gate: bad input: {err}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json()) if args.json else describe(report))
    return 0 if report.verdict is Verdict.PASS else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
