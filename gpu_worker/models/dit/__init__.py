"""The dit family: the production GPU model, a latent video diffusion pipeline in five modules.

    reference        DiTReference       portrait → VAE latents at the canvas size and at 1/scale (reference.py)
    context          DiTContext         audio → log-mel → transformer → per-frame audio tokens; prompt →
                                        byte-level text tokens (context.py, audio_encoder.py, text_encoder.py)
    audio_to_video   DiTAudioToVideo    flow-matching DiT: noise → low-resolution latents, conditioned on the
                                        reference, the anchors' boundary latents, audio and text (a2v.py, flow.py)
    super_resolution DiTSuperResolution one-pass DiT with frame-window block-sparse attention → output-resolution
                                        latents (sr.py, sparse_attention.py)
    decoder          DiTDecoder         causal video VAE decoder, streaming chunk by chunk (vae.py)

Architectures are configured by `DiTConfig` (config.py); weights are one safetensors file per model next
to a config.json (checkpoint.py; `python -m gpu_worker.models.dit.make_checkpoint` writes random ones).

Where the weights come from when the family is built by name: the environment variable
`MONOLOGUE_DIT_WEIGHTS` (a local folder or an s3://bucket/prefix URL), read here and nowhere else (the
GPU machine has no pydantic-settings; the variable follows the MONOLOGUE_ naming of the Settings). When
it is unset, the family is the `tiny` preset with weights drawn from a fixed seed: a smoke-test model
that runs the real architecture and streaming on any CPU and renders deterministic, meaningless frames.
Nothing is ever downloaded. `MONOLOGUE_DIT_WARM_RESOLUTIONS` (default 720p) names the output resolutions
whose compiled attention kernels are built at load. `MONOLOGUE_DIT_QUANTIZE` (none, int8 or fp8; default none)
stores the two DiTs' block linears quantized (gpu_worker/quantize.py).

Importable with torch, numpy and safetensors alone (no service stack), like everything under models/.
"""

from __future__ import annotations

import os

from gpu_worker.models import FAMILIES
from gpu_worker.models.dit.checkpoint import Weights
from gpu_worker.models.dit.config import TINY
from gpu_worker.models.dit.context import DiTContext
from gpu_worker.models.dit.decoder import DiTDecoder
from gpu_worker.models.dit.reference import DiTReference
from gpu_worker.models.dit.roles import DiTAudioToVideo, DiTSuperResolution
from gpu_worker.models.dit.runtime import Precision, TorchModule
from gpu_worker.pipeline.module import ModelSet
from gpu_worker.quantize import QuantMode
from monologue.contracts import Family

WEIGHTS_ENV = FAMILIES[Family.DIT].env("weights")
# Output resolutions whose compiled attention kernels are built when the node loads the family (comma-separated).
WARM_ENV = FAMILIES[Family.DIT].env("warm_resolutions")
# How the DiTs' block linears store their weights (gpu_worker.quantize.QuantMode).
QUANTIZE_ENV = FAMILIES[Family.DIT].env("quantize")
SMOKE_SEED = 20_261_130


def default_weights() -> Weights:
    """The checkpoint `MONOLOGUE_DIT_WEIGHTS` names, else the seeded tiny smoke-test model."""
    location = os.environ.get(WEIGHTS_ENV, "").strip()
    if location:
        return Weights.open(location)
    return Weights(TINY, seed=SMOKE_SEED)


def warm_resolutions() -> tuple[str, ...]:
    """The output resolutions `MONOLOGUE_DIT_WARM_RESOLUTIONS` names (default 720p): their SR attention kernels
    compile when the family loads, so no chunk of a render at one of them compiles (a no-op on CPU)."""
    names = os.environ.get(WARM_ENV, "720p").split(",")
    return tuple(name.strip() for name in names if name.strip())


def quantize_mode() -> QuantMode:
    """The mode `MONOLOGUE_DIT_QUANTIZE` names (default none); ValueError naming the value and the known modes."""
    return QuantMode.from_env(QUANTIZE_ENV)


def build_family(
    weights: Weights | None = None, precision: Precision = Precision.AUTO, quantize: QuantMode | None = None
) -> ModelSet:
    """The dit family's five modules over `weights` (default: `default_weights()`), storing their parameters
    in `precision` (AUTO: bf16 on CUDA, fp32 on CPU) and the DiTs' block linears as `quantize` says (default:
    `quantize_mode()`); they load when a Pipeline starts."""
    weights = weights or default_weights()
    quantize = quantize_mode() if quantize is None else quantize
    super_resolution = DiTSuperResolution(weights)
    super_resolution.warm_resolutions = warm_resolutions()
    audio_to_video = DiTAudioToVideo(weights)  # its steps compile at the same canvases (gpu_worker/compiled.py)
    audio_to_video.warm_resolutions = super_resolution.warm_resolutions
    decoder = DiTDecoder(weights)  # its per-frame stage compiles at them too (decoder.py)
    decoder.warm_resolutions = super_resolution.warm_resolutions
    models = ModelSet(
        name=Family.DIT,
        reference=DiTReference(weights),
        context=DiTContext(weights),
        audio_to_video=audio_to_video,
        super_resolution=super_resolution,
        decoder=decoder,
    )
    for module in models.modules():
        if isinstance(module, TorchModule):
            module.precision = precision
            module.quantize = quantize
    return models
