"""Write a random-initialised dit checkpoint (config.json + one safetensors file per model).

    python -m gpu_worker.models.dit.make_checkpoint OUT_DIR --preset tiny|h200 [--seed N] [--dtype bfloat16]
    python -m gpu_worker.models.dit.make_checkpoint --preset h200 --dry-run     # parameter counts only

For wiring, benchmarks and load tests before trained weights exist: the files have the exact keys,
shapes and layout a trained checkpoint has. With the default seed, a tiny checkpoint renders exactly what
the family's built-in smoke-test model renders. `--dry-run` builds the models on the meta device, so
counting the h200 preset's parameters allocates nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from gpu_worker.models.dit import SMOKE_SEED
from gpu_worker.models.dit.checkpoint import BUILDERS, MODEL_NAMES, Weights, save_checkpoint
from gpu_worker.models.dit.config import PRESETS, DiTConfig, preset
from gpu_worker.models.dit.layers import parameter_count

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parameter_counts(config: DiTConfig) -> dict[str, int]:
    """Parameters per model, counted on the meta device (no memory, any size)."""
    with torch.device("meta"):
        return {name: parameter_count(BUILDERS[name](config)) for name in MODEL_NAMES}


def describe(config: DiTConfig) -> str:
    counts = parameter_counts(config)
    lines = [f"preset {config.name}:"]
    lines += [f"  {name:<14} {count:>15,}" for name, count in counts.items()]
    lines.append(f"  {'total':<14} {sum(counts.values()):>15,}")
    return "\n".join(lines)


def make_checkpoint(out_dir: Path, config: DiTConfig, seed: int = SMOKE_SEED, dtype: torch.dtype | None = None) -> None:
    weights = Weights(config, seed=seed)
    save_checkpoint(out_dir, config, {name: weights.build(name) for name in MODEL_NAMES}, dtype)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a random-initialised dit checkpoint.")
    parser.add_argument("out_dir", type=Path, nargs="?", help="folder to write (created if missing)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=SMOKE_SEED)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="dtype of the stored tensors")
    parser.add_argument("--dry-run", action="store_true", help="print parameter counts, write nothing")
    args = parser.parse_args(argv)
    config = preset(args.preset)
    print(describe(config))
    if args.dry_run:
        return
    if args.out_dir is None:
        parser.error("OUT_DIR is required unless --dry-run")
    make_checkpoint(args.out_dir, config, args.seed, DTYPES[args.dtype])
    print(f"wrote {args.out_dir}")


if __name__ == "__main__":
    main()
