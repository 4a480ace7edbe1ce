"""Write random infinitetalk weights in the exact folder layout and tensor names of the originals.

    python -m gpu_worker.models.infinitetalk.make_checkpoint OUT [--preset tiny|wan2.1-i2v-14b] [--seed 0]

OUT gets `Wan2.1-I2V-14B-480P/` (config.json, two DiT shards and their index, Wan2.1_VAE.pth, the umT5 and CLIP
.pth files, a umT5 tokenizer under google/umt5-xxl), `chinese-wav2vec2-base/` (config.json,
preprocessor_config.json, model.safetensors saved as transformers' Wav2Vec2ForPreTraining writes it, weight norm as
weight_g/weight_v) and `InfiniteTalk/single/infinitetalk.safetensors`, every name and shape from layout.py (the
original definitions), so the family loads it exactly as it loads the real downloads. The tokenizer is built here
(a tiny unigram model over a fixed vocabulary), never downloaded. Tests use the tiny preset.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import safetensors.torch
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import Wav2Vec2Config, Wav2Vec2ForPreTraining

from gpu_worker.models.infinitetalk import layout
from gpu_worker.models.infinitetalk.config import InfiniteTalkConfig, preset

WORDS = ("a", "the", "calm", "studio", "soft", "light", "person", "talks", "speaks", "smiles", "face", "warm")


def _random(shapes: layout.Shapes, generator: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Weights ~ N(0, 1/fan_in), norms ~ 1 + N(0, 0.1), biases ~ N(0, 0.02): nothing zero or one by accident, so a
    tensor loaded under the wrong name shows in the output."""
    tensors = {}
    for key, shape in shapes.items():
        noise = torch.randn(shape, generator=generator)
        if key.endswith(("gamma", "norm.weight")) or (".norm" in key and key.endswith("weight") and len(shape) == 1):
            value = 1 + 0.1 * noise
        elif key.endswith("bias") or len(shape) <= 1:
            value = 0.02 * noise
        else:
            value = noise / math.sqrt(max(1, math.prod(shape[1:])))
        tensors[key] = value.to(dtype).contiguous()
    return tensors


def _wan_config(config: InfiniteTalkConfig) -> dict[str, object]:
    """config.json as the Wan download has it (WanModel keyword arguments), with any tiny widths the real file
    leaves to the defaults."""
    dit, real = config.dit, preset("wan2.1-i2v-14b").dit
    values: dict[str, object] = {"_class_name": "WanModel", "_diffusers_version": "0.30.0", "model_type": "i2v"}
    values |= {name: getattr(dit, name) for name in ("dim", "eps", "ffn_dim", "freq_dim", "in_dim", "num_heads")}
    values |= {name: getattr(dit, name) for name in ("num_layers", "out_dim", "text_len")}
    extra = (
        "text_dim",
        "image_dim",
        "intermediate_dim",
        "output_dim",
        "context_tokens",
        "audio_blocks",
        "audio_channels",
    )
    return values | {name: getattr(dit, name) for name in extra if getattr(dit, name) != getattr(real, name)}


def write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A umT5-style tokenizer (pad 0, </s> 1, <unk> 2, metaspace, </s> appended) over a fixed tiny vocabulary."""
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(f"▁{word}", -1.0) for word in WORDS] + [(chr(c), -3.0) for c in range(ord("a"), ord("z") + 1)]
    if len(pieces) > vocab_size:
        raise ValueError(f"the test tokenizer needs {len(pieces)} pieces, the T5 vocabulary has {vocab_size}")
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    special = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special))
    settings = {"tokenizer_class": "T5Tokenizer", "extra_ids": 0, "model_max_length": 512, **special}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))


def _wav2vec(folder: Path, config: InfiniteTalkConfig, seed: int) -> None:
    dit = config.dit
    small = dit.audio_channels < 768
    settings = Wav2Vec2Config(
        hidden_size=dit.audio_channels,
        num_hidden_layers=dit.audio_blocks,
        num_attention_heads=2 if small else 12,
        intermediate_size=2 * dit.audio_channels if small else 3072,
        conv_dim=(16,) * 7 if small else (512,) * 7,
        num_conv_pos_embeddings=16 if small else 128,
        num_conv_pos_embedding_groups=2 if small else 16,
        codevector_dim=8 if small else 256,
        proj_codevector_dim=8 if small else 256,
        num_codevectors_per_group=4 if small else 320,
        architectures=["Wav2Vec2ForPreTraining"],
    )
    torch.manual_seed(seed)
    state = Wav2Vec2ForPreTraining(settings).state_dict()
    # Older transformers saved weight norm as weight_g / weight_v: the layout of the chinese-wav2vec2-base files.
    renamed = {
        key.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        ): value
        for key, value in state.items()
    }
    folder.mkdir(parents=True, exist_ok=True)
    settings.to_json_file(folder / "config.json")
    extractor = {"do_normalize": True, "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1}
    extractor |= {"padding_side": "right", "padding_value": 0.0, "return_attention_mask": False, "sampling_rate": 16000}
    (folder / "preprocessor_config.json").write_text(json.dumps(extractor))
    safetensors.torch.save_file({k: v.contiguous() for k, v in renamed.items()}, folder / "model.safetensors")


def write(out: Path, config: InfiniteTalkConfig, seed: int = 0) -> Path:
    """Write the three parts under `out`; returns `out`."""
    generator = torch.Generator().manual_seed(seed)
    wan = out / layout.WAN_DIR
    wan.mkdir(parents=True, exist_ok=True)
    (wan / layout.DIT_CONFIG).write_text(json.dumps(_wan_config(config), indent=2))
    dit, adapter = layout.dit_layout(config.dit)
    dit_tensors = _random(dit, generator, torch.bfloat16)
    keys = sorted(dit_tensors)
    halves = [keys[: len(keys) // 2], keys[len(keys) // 2 :]]
    weight_map = {}
    for index, part in enumerate(halves, start=1):
        name = layout.shard_name(index, len(halves))
        safetensors.torch.save_file({key: dit_tensors[key] for key in part}, wan / name)
        weight_map |= {key: name for key in part}
    index_file = {
        "metadata": {"total_size": sum(t.numel() * 2 for t in dit_tensors.values())},
        "weight_map": weight_map,
    }
    (wan / layout.DIT_INDEX).write_text(json.dumps(index_file, indent=2))
    torch.save(_random(layout.vae_layout(config.vae), generator, torch.float32), wan / layout.VAE_FILE)
    torch.save(_random(layout.t5_layout(config.t5), generator, torch.bfloat16), wan / layout.T5_FILE)
    torch.save(_random(layout.clip_layout(config.clip), generator, torch.float16), wan / layout.CLIP_FILE)
    write_tokenizer(wan / layout.T5_TOKENIZER, config.t5.vocab)
    _wav2vec(out / layout.WAV2VEC_DIR, config, seed)
    adapter_path = out / layout.ADAPTER_FILES[0]
    adapter_path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(_random(adapter, generator, torch.bfloat16), adapter_path)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(write(args.out, preset(args.preset), args.seed))


if __name__ == "__main__":
    main()
