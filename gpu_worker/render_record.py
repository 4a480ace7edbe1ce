"""Render records: one render of the dit family, kept as evidence for the quality gate (`monologue gate`).

An optimisation (bf16 weights, switching models in and out of the device, a faster kernel) is only
ported if its frames still match a baseline. A render record is that evidence, written by running the
pipeline directly, with no service stack (the GPU machine has torch and numpy, no PyAV or pydantic):

    python -m gpu_worker.render_record OUT_DIR --preset tiny --resolution 512 --seconds 2 --seed 7 \\
        --precision fp32 --residency resident [--quantize int8]

OUT_DIR/record.json holds the settings, the frame size and rate, and every frame's SHA-256 as the
pipeline computes it (`DecodePublishStage`); OUT_DIR/frames.npy holds the frames themselves (uint8,
T×H×W×3) for the PSNR/SSIM comparison when hashes differ. A 720p frame is 2.8 MB, so only
`--keep-frames` of them are stored (all of a short render; evenly spaced ones of a long one); the hashes
always cover every frame. The portrait and speech are the bundled samples (monologue/samples).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_worker.models.dit import build_family
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import preset
from gpu_worker.models.dit.runtime import Precision, default_device
from gpu_worker.pipeline import ChunkRequest, OutputSpec, Pipeline
from gpu_worker.quantize import QuantMode
from gpu_worker.samples import sample_portrait, sample_speech
from monologue.contracts import Family, Residency, Resolution
from monologue.gate import FRAMES_FILE, RECORD_FILE, RECORD_FORMAT  # the gate reads what this writes (numpy only)
from monologue.plan import AUDIO_RATE, plan_chunks


@dataclass(frozen=True)
class RecordSettings:
    """What was rendered: everything that changes the frames, and the switches under test."""

    family: Family = Family.DIT
    preset: str = "tiny"
    resolution: str = "512"
    preview: bool = False
    seconds: float = 2.0
    seed: int = 7
    weights_seed: int = 1  # random weights from this seed (no checkpoint is ever downloaded) ...
    weights: str | None = None  # ... or a checkpoint folder of the preset's (make_checkpoint's: the GPU check's)
    precision: Precision = Precision.AUTO
    residency: Residency = Residency.RESIDENT
    quantize: QuantMode = QuantMode.NONE  # the DiTs' block linears (gpu_worker/quantize.py)
    chunk_frames: int = 40
    i_frames: int = 4
    fps: int = 25

    def __post_init__(self) -> None:  # accept the enums' values too ("bf16"), as record.json holds them
        kinds = (("family", Family), ("precision", Precision), ("residency", Residency), ("quantize", QuantMode))
        for name, kind in kinds:
            object.__setattr__(self, name, kind(getattr(self, name)))


@dataclass
class RenderRecord:
    """record.json: the settings, where it ran, and a hash of every frame (in timeline order)."""

    settings: RecordSettings
    width: int
    height: int
    fps: int
    frame_hashes: list[str]
    stored_frames: list[int]  # timeline indices of the frames in frames.npy, in order
    device: str = ""
    torch_version: str = ""
    format: int = RECORD_FORMAT
    environment: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def stored_indices(total: int, keep: int) -> list[int]:
    """Which frames to store: all of them if `keep` allows, else `keep` evenly spaced ones from the first to
    the last. The same (total, keep) always gives the same indices, so two records made with the same
    settings store the same frames."""
    if keep >= total:
        return list(range(total))
    if keep <= 0:
        return []
    if keep == 1:
        return [0]
    return [step * (total - 1) // (keep - 1) for step in range(keep)]


class _TimelineSink:
    """Writes a chunk's frames into the stored-frame array at their timeline positions."""

    def __init__(self, frames: np.ndarray, slots: dict[int, int]) -> None:
        self.frames, self.slots, self.first_frame = frames, slots, 0

    def write(self, frames: np.ndarray) -> None:
        for offset, frame in enumerate(frames):
            slot = self.slots.get(self.first_frame + offset)
            if slot is not None:
                self.frames[slot] = frame


def render_record(settings: RecordSettings, out_dir: Path, *, keep_frames: int = 250) -> RenderRecord:
    """Render the bundled samples with `settings`; write OUT_DIR/record.json and OUT_DIR/frames.npy."""
    if settings.family is not Family.DIT:
        raise ValueError(f"render records are made for the dit family only, not {settings.family}")
    out_dir.mkdir(parents=True, exist_ok=True)
    weights = (
        Weights.open(settings.weights)
        if settings.weights is not None
        else Weights(preset(settings.preset), seed=settings.weights_seed)
    )
    family = build_family(weights, precision=settings.precision, quantize=settings.quantize)
    pipeline = Pipeline(family, residency=settings.residency)

    output = OutputSpec(fps=settings.fps, resolution=Resolution(settings.resolution), preview=settings.preview)
    total = max(1, round(settings.seconds * settings.fps))
    plan = plan_chunks(
        total, n_frames=settings.chunk_frames, i_frames=settings.i_frames, stride=Family.DIT.temporal_stride
    )
    audio = sample_speech(total * AUDIO_RATE // settings.fps)
    portrait = sample_portrait()
    session = pipeline.start_session(portrait, output, audio)
    width, height = session.frame_width, session.frame_height

    kept = stored_indices(total, keep_frames)
    frames = np.lib.format.open_memmap(
        out_dir / FRAMES_FILE, mode="w+", dtype=np.uint8, shape=(len(kept), height, width, 3)
    )
    sink = _TimelineSink(frames, {frame: slot for slot, frame in enumerate(kept)})
    hashes: list[str] = [""] * total
    for spec in plan:
        sink.first_frame = spec.first_frame
        result = pipeline.run_chunk(session, ChunkRequest(spec, seed=settings.seed), sink)
        hashes[spec.first_frame : spec.end_frame] = result.frame_hashes
    frames.flush()
    del frames  # close the memory map before the record says the frames are there

    record = RenderRecord(
        settings=settings,
        width=width,
        height=height,
        fps=settings.fps,
        frame_hashes=hashes,
        stored_frames=kept,
        device=default_device(),
        torch_version=torch.__version__,
        environment={"python": platform.python_version(), "machine": platform.machine()},
    )
    (out_dir / RECORD_FILE).write_text(json.dumps(record.to_json(), indent=1) + "\n")
    return record


def _parser() -> argparse.ArgumentParser:
    defaults = RecordSettings()
    parser = argparse.ArgumentParser(
        prog="python -m gpu_worker.render_record", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("out_dir", type=Path, help="where record.json and frames.npy go (created)")
    parser.add_argument("--family", type=Family, default=defaults.family, choices=[Family.DIT])
    parser.add_argument("--preset", default=defaults.preset, help="model size: tiny (CPU) or h200")
    parser.add_argument("--resolution", default=defaults.resolution, choices=["512", "720p", "1080p", "source"])
    parser.add_argument("--preview", action="store_true", help="half resolution (fast CPU records)")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="seconds of speech to render")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="the session seed (noise)")
    parser.add_argument("--weights-seed", type=int, default=defaults.weights_seed, help="seed of the random weights")
    parser.add_argument("--weights", default=None, help="a checkpoint folder of the preset (make_checkpoint's)")
    parser.add_argument("--precision", type=Precision, default=defaults.precision, choices=list(Precision))
    parser.add_argument("--residency", type=Residency, default=defaults.residency, choices=list(Residency))
    parser.add_argument("--quantize", type=QuantMode, default=defaults.quantize, choices=list(QuantMode))
    parser.add_argument("--chunk-frames", type=int, default=defaults.chunk_frames, help="frames per N chunk")
    parser.add_argument("--i-frames", type=int, default=defaults.i_frames, help="frames per I chunk")
    parser.add_argument("--keep-frames", type=int, default=250, help="frames to store in frames.npy (evenly spaced)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = vars(_parser().parse_args(argv))
    out_dir, keep = args.pop("out_dir"), args.pop("keep_frames")
    record = render_record(RecordSettings(**args), out_dir, keep_frames=keep)
    settings = record.settings
    quantized = "" if settings.quantize is QuantMode.NONE else f"/{settings.quantize} DiT linears"
    print(
        f"{out_dir}: {len(record.frame_hashes)} frames {record.width}x{record.height} at {record.fps} fps "
        f"({len(record.stored_frames)} stored), {settings.precision}/{settings.residency}{quantized} "
        f"on {record.device}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
