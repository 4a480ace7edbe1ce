"""The infinitetalk family: the open InfiniteTalk checkpoints people already have, run as Monologue chunks.

    reference        InfiniteTalkReference     portrait → size bucket, CLIP ViT-H tokens, its Wan VAE latent
    context          InfiniteTalkContext       speech → wav2vec2 windows per frame; prompt and negative → umT5
    audio_to_video   InfiniteTalkAudioToVideo  Wan2.1-I2V-14B + InfiniteTalk's audio adapter, InfiniteTalk's sampler,
                                               clips led by the previous clip's motion frames (roles.py)
    super_resolution PassThrough               (none: InfiniteTalk generates at the output size)
    decoder          InfiniteTalkDecoder       the Wan VAE decoder, streaming with a causal cache rebuilt from anchors

Model code from the field's libraries: diffusers' Wan transformer parts and AutoencoderKLWan, transformers'
UMT5EncoderModel, CLIPVisionModel and Wav2Vec2Model; the adapter is ours (dit.py). The user's files load
unchanged and strictly through documented rename maps (checkpoint.py, rename.py, layout.py).

Where the weights are, read here and nowhere else (the GPU machine has no pydantic-settings; the names follow the
MONOLOGUE_ settings):
- `MONOLOGUE_INFINITETALK_WEIGHTS`: a folder holding `Wan2.1-I2V-14B-480P/`, `chinese-wav2vec2-base/` and
  `InfiniteTalk/single/infinitetalk.safetensors` (or `infinitetalk.safetensors`), the README's download layout;
- or each part: `MONOLOGUE_INFINITETALK_WAN`, `MONOLOGUE_INFINITETALK_WAV2VEC`, `MONOLOGUE_INFINITETALK_ADAPTER`
  (these win over the folder);
- `MONOLOGUE_INFINITETALK_PRESET`: the architecture the files are held to (`wan2.1-i2v-14b`, the default, or `tiny`
  for the test checkpoints `make_checkpoint.py` writes);
- `MONOLOGUE_INFINITETALK_LORA`: a distilled LoRA's .safetensors (lightx2v's, FusionX), merged into the DiT as it
  loads (lora.py), with `MONOLOGUE_INFINITETALK_LORA_STRENGTH` (default 1); sessions may then ask for the `fast`
  sampling preset;
- `MONOLOGUE_INFINITETALK_QUANTIZE`: `none` (default), `int8` or `fp8`: the DiT's block linears stored quantized
  after the LoRA is merged (gpu_worker/quantize.py; the modulation and everything outside the blocks stay float).
With none set the family cannot load: there is no smoke-test model (its users bring their checkpoints), and a node
started with them set checks every file's names and shapes at start (`check_weights`). Nothing is ever downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpu_worker.models import FAMILIES
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.models.dit.runtime import Precision, TorchModule
from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import preset
from gpu_worker.models.infinitetalk.context import InfiniteTalkContext
from gpu_worker.models.infinitetalk.lora import LORA_ENV, LORA_STRENGTH_ENV, LoraFile
from gpu_worker.models.infinitetalk.reference import InfiniteTalkReference
from gpu_worker.models.infinitetalk.roles import InfiniteTalkAudioToVideo, InfiniteTalkDecoder, PassThrough
from gpu_worker.pipeline.module import ModelSet
from gpu_worker.quantize import QuantMode
from monologue.contracts import Family

_ENTRY = FAMILIES[Family.INFINITETALK]
WEIGHTS_ENV = _ENTRY.env("weights")
PART_ENVS = {part: _ENTRY.env(part) for part in ("wan", "wav2vec", "adapter")}
PRESET_ENV = _ENTRY.env("preset")
QUANTIZE_ENV = _ENTRY.env("quantize")


def configured() -> bool:
    return _ENTRY.weights_configured()


def default_weights() -> InfiniteTalkWeights:
    """The weights the environment names, or a CheckpointError saying what to set."""
    root = os.environ.get(WEIGHTS_ENV, "").strip()
    parts = {part: os.environ.get(name, "").strip() for part, name in PART_ENVS.items()}
    if not root and not all(parts.values()):
        raise CheckpointError(
            f"the infinitetalk family needs the InfiniteTalk checkpoints: set {WEIGHTS_ENV} to the folder holding "
            f"Wan2.1-I2V-14B-480P/, chinese-wav2vec2-base/ and infinitetalk.safetensors (or set all of "
            f"{', '.join(PART_ENVS.values())})"
        )
    under = Locations.under(Path(root).expanduser()) if root else None
    locations = Locations(
        wan=Path(parts["wan"]).expanduser() if parts["wan"] else under.wan,  # type: ignore[union-attr]
        wav2vec=Path(parts["wav2vec"]).expanduser() if parts["wav2vec"] else under.wav2vec,  # type: ignore[union-attr]
        adapter=Path(parts["adapter"]).expanduser() if parts["adapter"] else under.adapter,  # type: ignore[union-attr]
    )
    return InfiniteTalkWeights(preset(os.environ.get(PRESET_ENV, "wan2.1-i2v-14b").strip()), locations, _lora())


def _lora() -> LoraFile | None:
    """The LoRA the environment names, if any; a CheckpointError for a strength that is not a number."""
    path = os.environ.get(LORA_ENV, "").strip()
    strength = os.environ.get(LORA_STRENGTH_ENV, "").strip()
    if strength and not path:
        raise CheckpointError(f"{LORA_STRENGTH_ENV} is set ({strength}) but {LORA_ENV} names no LoRA to merge")
    strength = strength or "1"
    try:
        return LoraFile(Path(path).expanduser(), float(strength)) if path else None
    except ValueError as exc:
        raise CheckpointError(f"{LORA_STRENGTH_ENV}={strength!r}: a finite number, e.g. 1.0 ({exc})") from exc


def check_weights() -> None:
    """Every configured file's tensor names and shapes against the models (headers only; node start)."""
    if configured():
        default_weights().check()


def build_family(
    weights: InfiniteTalkWeights | None = None,
    precision: Precision = Precision.AUTO,
    quantize: QuantMode | None = None,
) -> ModelSet:
    """The five modules over `weights` (default: the environment's); they load when a Pipeline starts, the DiT's
    block linears stored as `quantize` says (default: `MONOLOGUE_INFINITETALK_QUANTIZE`, none)."""
    weights = weights or default_weights()
    quantize = QuantMode.from_env(QUANTIZE_ENV) if quantize is None else quantize
    models = ModelSet(
        name=Family.INFINITETALK,
        reference=InfiniteTalkReference(weights),
        context=InfiniteTalkContext(weights),
        audio_to_video=InfiniteTalkAudioToVideo(weights),
        super_resolution=PassThrough(),
        decoder=InfiniteTalkDecoder(weights),
    )
    for module in models.modules():
        if isinstance(module, TorchModule):
            module.precision = precision
            module.quantize = quantize
    return models
