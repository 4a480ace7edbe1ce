"""Weight memory of the dit family per model, counted on the meta device: what quantization saves, for any preset,
on any machine (`python -m gpu_worker.weight_memory --preset h200 --precision bf16 --quantize int8`).

Each model is built as a loading module builds it (`TorchModule.load`: parameters cast to the precision's dtype,
the DiTs' block linears quantized), but under `torch.device("meta")`, so nothing is allocated or drawn: the h200
preset counts in a second. The bytes are those of the parameters and buffers (`gpu_worker.quantize.tensor_bytes`),
what a resident model holds on the device besides its activations. Importable with torch alone.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from gpu_worker.models.dit import build_family
from gpu_worker.models.dit.checkpoint import BUILDERS, Weights
from gpu_worker.models.dit.config import preset
from gpu_worker.models.dit.runtime import Precision, TorchModule
from gpu_worker.quantize import QuantMode, replace_linears, tensor_bytes


def weight_memory(preset_name: str, dtype: torch.dtype, quantize: QuantMode) -> dict[str, int]:
    """Bytes of parameters and buffers of each of the family's models (by name) under `dtype` and `quantize`."""
    config = preset(preset_name)
    family = build_family(Weights(config, seed=0), quantize=quantize)  # constructed only: nothing loads
    sizes: dict[str, int] = {}
    for module in family.modules():
        if not isinstance(module, TorchModule):
            continue
        for name in module.model_names:
            with torch.device("meta"):
                model = BUILDERS[name](config)
            for parameter in model.parameters():
                parameter.data = parameter.data.to(dtype)
            if name in module.quantized_models:  # no device check: the meta device has no FP8 to ask about
                replace_linears(model.get_submodule("blocks"), quantize)
            sizes[name] = tensor_bytes(model)
    return sizes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--preset", default="h200", help="the dit preset (tiny, h200)")
    parser.add_argument("--precision", type=Precision, default=Precision.BF16, choices=[Precision.BF16, Precision.FP32])
    parser.add_argument("--quantize", type=QuantMode, default=QuantMode.INT8, choices=list(QuantMode))
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args(argv)
    dtype = args.precision.dtype("cuda")  # an explicit precision: the same dtype on any device
    baseline = weight_memory(args.preset, dtype, QuantMode.NONE)
    quantized = weight_memory(args.preset, dtype, args.quantize)
    if args.json:
        print(json.dumps({"preset": args.preset, args.precision.value: baseline, args.quantize.value: quantized}))
        return
    print(f"preset {args.preset}: weight memory per model, {args.precision} vs {args.quantize} (MiB)")
    for name, size in baseline.items():
        print(f"  {name:<14} {size / 2**20:10.1f} {quantized[name] / 2**20:10.1f}  x{quantized[name] / size:.3f}")
    total, total_quantized = sum(baseline.values()), sum(quantized.values())
    print(f"  {'total':<14} {total / 2**20:10.1f} {total_quantized / 2**20:10.1f}  x{total_quantized / total:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
