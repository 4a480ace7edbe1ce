"""Key maps from the original checkpoints' tensor names to the library models' (diffusers, transformers).

Each checkpoint file is loaded as the original repository wrote it; a `KeyMap` renames every tensor once,
by the first of its rules whose original pattern matches the whole key. A rule may split one original tensor
into parts (CLIP's fused to_qkv), reshape it (CLIP's class and position embeddings carry batch axes in the
original), or drop it on purpose (`None`: tensors the original file holds and image-to-video never runs, each
rule saying which). A key no rule matches is an unexpected key: the loader names it with its file.

Patterns: `{n}` a block index, `{p}` weight or bias, `{x}` one name of the set the rule lists, `{rest}` any
tail. Every rename below was checked against the sources:

- Wan DiT (Wan2.1 `wan/modules/model.py`, InfiniteTalk `wan/modules/multitalk_model.py` lines 115-365) →
  diffusers WanTransformer3DModel, as diffusers' `scripts/convert_wan_to_diffusers.py` (TRANSFORMER_KEYS_RENAME_DICT)
  does with substring replacement; here as anchored patterns, because substring replacement would also rewrite
  InfiniteTalk's `audio_cross_attn.q_linear` ("cross_attn.q" → "attn2.to_q") and `norm_x` is left alone. The
  original calls its norms in the order norm1 (self-attention, no affine), norm3 (cross-attention, affine),
  norm2 (feed-forward, no affine); diffusers numbers them in call order, so the affine `norm3` is `norm2`.
  The audio adapter keeps its original names: our blocks carry it under them (dit.py).
- Wan VAE (`wan/modules/vae.py`) → diffusers AutoencoderKLWan (`convert_vae` in the same script): the
  decoder's flat `upsamples` list becomes per-level `up_blocks` of resnets and one upsampler.
- umT5-XXL (`wan/modules/t5.py`, T5Encoder) → transformers UMT5EncoderModel: the gated GELU's `gate.0` is
  `wi_0` (the GELU branch), `fc1` is `wi_1`, `fc2` is `wo`; each layer's relative position embedding is its
  `relative_attention_bias` (umT5 keeps one per layer: shared_pos=False, t5.py line 471).
- CLIP (`wan/modules/clip.py`, VisionTransformer) → transformers CLIPVisionModel with the original's first 31
  layers (`use_31_block`, clip.py line 295: the output of block 31 of 32, before any final norm).
- wav2vec2 (`chinese-wav2vec2-base`, saved by transformers' Wav2Vec2ForPreTraining) → Wav2Vec2Model: the
  `wav2vec2.` prefix goes, weight norm's `weight_g`/`weight_v` become the parametrization's `original0`/`1`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpu_worker.models.infinitetalk.config import InfiniteTalkConfig

_SLOTS = {"n": r"\d+", "p": r"weight|bias", "rest": r".+"}


@dataclass(frozen=True)
class Rule:
    original: str
    ours: str | None  # None: in the file on purpose, not used (the reason is the comment where it is made)
    choices: tuple[str, ...] = ()  # what {x} may be
    parts: tuple[str, ...] = ()  # {part}: the original tensor is these, concatenated on dim 0
    reshape: bool = False  # the original tensor has the model's values in another shape (batch axes)
    _compiled: tuple[re.Pattern[str], re.Pattern[str] | None] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        slots = {**_SLOTS, "x": "|".join(map(re.escape, self.choices)) or "(?!)", "part": "|".join(self.parts)}
        ours = None if self.ours is None else _pattern(self.ours, slots)
        object.__setattr__(self, "_compiled", (_pattern(self.original, slots), ours))

    def forward(self, key: str) -> list[str] | None:
        """Our keys for an original key, [] if this rule drops it, None if it does not match."""
        found = self._compiled[0].fullmatch(key)
        if found is None:
            return None
        if self.ours is None:
            return []
        names = found.groupdict()
        return [self.ours.format(**names, part=part) for part in self.parts or ("",)]

    def inverse(self, key: str) -> tuple[str, int] | None:
        """(original key, part index) for one of our keys, or None."""
        pattern = self._compiled[1]
        found = pattern.fullmatch(key) if pattern is not None else None
        if found is None:
            return None
        names = found.groupdict()
        part = names.pop("part", "")
        return self.original.format(**names), (self.parts.index(part) if self.parts else 0)


def _pattern(template: str, slots: dict[str, str]) -> re.Pattern[str]:
    pieces = re.split(r"\{(\w+)\}", template)
    regex = "".join(
        re.escape(piece) if index % 2 == 0 else f"(?P<{piece}>{slots[piece]})" for index, piece in enumerate(pieces)
    )
    return re.compile(regex)


class KeyMap:
    """One component's rules. `ours(key)` renames an original key (KeyError if no rule knows it)."""

    def __init__(self, name: str, rules: Iterable[Rule]) -> None:
        self.name = name
        self.rules = tuple(rules)

    def rule(self, key: str) -> tuple[Rule, list[str]]:
        for rule in self.rules:
            names = rule.forward(key)
            if names is not None:
                return rule, names
        raise KeyError(key)

    def ours(self, key: str) -> list[str]:
        return self.rule(key)[1]

    def original(self, key: str) -> tuple[str, int]:
        """The original key one of our keys comes from (and which part of it)."""
        for rule in self.rules:
            found = rule.inverse(key)
            if found is not None:
                return found
        raise KeyError(key)


def dit_map() -> KeyMap:
    """Wan2.1-I2V + InfiniteTalk → our InfiniteTalkDiT (diffusers WanTransformer3DModel + the adapter)."""
    qkv = ("q", "k", "v")
    rules = [
        Rule("patch_embedding.{p}", "patch_embedding.{p}"),
        Rule("text_embedding.0.{p}", "condition_embedder.text_embedder.linear_1.{p}"),
        Rule("text_embedding.2.{p}", "condition_embedder.text_embedder.linear_2.{p}"),
        Rule("time_embedding.0.{p}", "condition_embedder.time_embedder.linear_1.{p}"),
        Rule("time_embedding.2.{p}", "condition_embedder.time_embedder.linear_2.{p}"),
        Rule("time_projection.1.{p}", "condition_embedder.time_proj.{p}"),
        Rule("img_emb.proj.0.{p}", "condition_embedder.image_embedder.norm1.{p}"),
        Rule("img_emb.proj.1.{p}", "condition_embedder.image_embedder.ff.net.0.proj.{p}"),
        Rule("img_emb.proj.3.{p}", "condition_embedder.image_embedder.ff.net.2.{p}"),
        Rule("img_emb.proj.4.{p}", "condition_embedder.image_embedder.norm2.{p}"),
        Rule("head.head.{p}", "proj_out.{p}"),
        Rule("head.modulation", "scale_shift_table"),
        Rule("blocks.{n}.modulation", "blocks.{n}.scale_shift_table"),
        Rule("blocks.{n}.self_attn.{x}.{p}", "blocks.{n}.attn1.to_{x}.{p}", choices=qkv),
        Rule("blocks.{n}.self_attn.o.{p}", "blocks.{n}.attn1.to_out.0.{p}"),
        Rule("blocks.{n}.self_attn.norm_{x}.weight", "blocks.{n}.attn1.norm_{x}.weight", choices=("q", "k")),
        Rule("blocks.{n}.cross_attn.{x}.{p}", "blocks.{n}.attn2.to_{x}.{p}", choices=qkv),
        Rule("blocks.{n}.cross_attn.o.{p}", "blocks.{n}.attn2.to_out.0.{p}"),
        Rule("blocks.{n}.cross_attn.norm_{x}.weight", "blocks.{n}.attn2.norm_{x}.weight", choices=("q", "k")),
        Rule("blocks.{n}.cross_attn.{x}_img.{p}", "blocks.{n}.attn2.add_{x}_proj.{p}", choices=("k", "v")),
        Rule("blocks.{n}.cross_attn.norm_k_img.weight", "blocks.{n}.attn2.norm_added_k.weight"),
        Rule("blocks.{n}.norm3.{p}", "blocks.{n}.norm2.{p}"),  # the cross-attention's norm (see the docstring)
        Rule("blocks.{n}.ffn.0.{p}", "blocks.{n}.ffn.net.0.proj.{p}"),
        Rule("blocks.{n}.ffn.2.{p}", "blocks.{n}.ffn.net.2.{p}"),
        # InfiniteTalk's adapter, under its own names.
        Rule("blocks.{n}.audio_cross_attn.{x}.{p}", "blocks.{n}.audio_cross_attn.{x}.{p}",
             choices=("q_linear", "kv_linear", "proj")),
        Rule("blocks.{n}.norm_x.{p}", "blocks.{n}.norm_x.{p}"),
        Rule("audio_proj.{x}.{p}", "audio_proj.{x}.{p}", choices=("proj1", "proj1_vf", "proj2", "proj3", "norm")),
    ]  # fmt: skip
    return KeyMap("dit", rules)


def _resnet(original: str, ours: str) -> list[Rule]:
    """A Wan VAE residual block: Sequential(RMS_norm, SiLU, conv, RMS_norm, SiLU, Dropout, conv) + shortcut."""
    return [
        Rule(f"{original}.residual.0.gamma", f"{ours}.norm1.gamma"),
        Rule(f"{original}.residual.2.{{p}}", f"{ours}.conv1.{{p}}"),
        Rule(f"{original}.residual.3.gamma", f"{ours}.norm2.gamma"),
        Rule(f"{original}.residual.6.{{p}}", f"{ours}.conv2.{{p}}"),
        Rule(f"{original}.shortcut.{{p}}", f"{ours}.conv_shortcut.{{p}}"),
    ]


def vae_map(config: InfiniteTalkConfig) -> KeyMap:
    """Wan2.1_VAE.pth → diffusers AutoencoderKLWan (its encoder keeps the flat list, the decoder is per level)."""
    rules = [Rule("conv1.{p}", "quant_conv.{p}"), Rule("conv2.{p}", "post_quant_conv.{p}")]
    for part in ("encoder", "decoder"):
        rules += [Rule(f"{part}.conv1.{{p}}", f"{part}.conv_in.{{p}}")]
        rules += _resnet(f"{part}.middle.0", f"{part}.mid_block.resnets.0")
        rules += _resnet(f"{part}.middle.2", f"{part}.mid_block.resnets.1")
        rules += [
            Rule(f"{part}.middle.1.norm.gamma", f"{part}.mid_block.attentions.0.norm.gamma"),
            Rule(
                f"{part}.middle.1.{{x}}.{{p}}", f"{part}.mid_block.attentions.0.{{x}}.{{p}}", choices=("to_qkv", "proj")
            ),
            Rule(f"{part}.head.0.gamma", f"{part}.norm_out.gamma"),
            Rule(f"{part}.head.2.{{p}}", f"{part}.conv_out.{{p}}"),
        ]
    rules += _resnet("encoder.downsamples.{n}", "encoder.down_blocks.{n}")
    rules += [
        Rule("encoder.downsamples.{n}.{x}.{p}", "encoder.down_blocks.{n}.{x}.{p}", choices=("resample.1", "time_conv"))
    ]
    # The decoder's flat list (vae.py Decoder3d): per level, num_res_blocks + 1 residual blocks, then (but for the
    # last level) one Resample.
    per_level = config.vae.num_res_blocks + 2
    for level in range(len(config.vae.dim_mult)):
        for resnet in range(config.vae.num_res_blocks + 1):
            flat = level * per_level + resnet
            rules += _resnet(f"decoder.upsamples.{flat}", f"decoder.up_blocks.{level}.resnets.{resnet}")
        if level < len(config.vae.dim_mult) - 1:
            flat = level * per_level + config.vae.num_res_blocks + 1
            upsampler = f"decoder.up_blocks.{level}.upsamplers.0"
            rules += [
                Rule(
                    f"decoder.upsamples.{flat}.{{x}}.{{p}}",
                    f"{upsampler}.{{x}}.{{p}}",
                    choices=("resample.1", "time_conv"),
                )
            ]
    return KeyMap("vae", rules)


def t5_map() -> KeyMap:
    """models_t5_umt5-xxl-enc-bf16.pth (T5Encoder) → transformers UMT5EncoderModel."""
    layer = "encoder.block.{n}.layer"
    rules = [
        Rule("token_embedding.weight", "shared.weight"),  # tied: encoder.embed_tokens is the same tensor
        Rule("blocks.{n}.norm1.weight", f"{layer}.0.layer_norm.weight"),
        Rule("blocks.{n}.attn.{x}.weight", f"{layer}.0.SelfAttention.{{x}}.weight", choices=("q", "k", "v", "o")),
        Rule("blocks.{n}.pos_embedding.embedding.weight", f"{layer}.0.SelfAttention.relative_attention_bias.weight"),
        Rule("blocks.{n}.norm2.weight", f"{layer}.1.layer_norm.weight"),
        Rule("blocks.{n}.ffn.gate.0.weight", f"{layer}.1.DenseReluDense.wi_0.weight"),
        Rule("blocks.{n}.ffn.fc1.weight", f"{layer}.1.DenseReluDense.wi_1.weight"),
        Rule("blocks.{n}.ffn.fc2.weight", f"{layer}.1.DenseReluDense.wo.weight"),
        Rule("norm.weight", "encoder.final_layer_norm.weight"),
    ]
    return KeyMap("t5", rules)


def clip_map(config: InfiniteTalkConfig) -> KeyMap:
    """models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth (XLMRobertaCLIP) → CLIPVisionModel, 31 layers."""
    last = config.clip.num_layers - 1
    layer = "encoder.layers.{n}"
    rules = [
        # Image-to-video runs the visual tower up to its penultimate block: the last block, the projection head,
        # the text tower and the logit scale are in the file and never run (post_norm loads into post_layernorm,
        # which only the pooled output, unused, goes through).
        Rule(f"visual.transformer.{last}.{{rest}}", None),
        Rule("visual.post_norm.{p}", "post_layernorm.{p}"),
        Rule("visual.head", None),
        Rule("textual.{rest}", None),
        Rule("log_scale", None),
        Rule("visual.patch_embedding.weight", "embeddings.patch_embedding.weight"),
        Rule("visual.cls_embedding", "embeddings.class_embedding", reshape=True),
        Rule("visual.pos_embedding", "embeddings.position_embedding.weight", reshape=True),
        Rule("visual.pre_norm.{p}", "pre_layrnorm.{p}"),
        Rule("visual.transformer.{n}.norm1.{p}", f"{layer}.layer_norm1.{{p}}"),
        Rule("visual.transformer.{n}.norm2.{p}", f"{layer}.layer_norm2.{{p}}"),
        Rule("visual.transformer.{n}.attn.to_qkv.{p}", f"{layer}.self_attn.{{part}}_proj.{{p}}", parts=("q", "k", "v")),
        Rule("visual.transformer.{n}.attn.proj.{p}", f"{layer}.self_attn.out_proj.{{p}}"),
        Rule("visual.transformer.{n}.mlp.0.{p}", f"{layer}.mlp.fc1.{{p}}"),
        Rule("visual.transformer.{n}.mlp.2.{p}", f"{layer}.mlp.fc2.{{p}}"),
    ]
    return KeyMap("clip", rules)


def wav2vec_map() -> KeyMap:
    """chinese-wav2vec2-base (Wav2Vec2ForPreTraining, or a bare Wav2Vec2Model) → transformers Wav2Vec2Model."""
    conv = "encoder.pos_conv_embed.conv"
    rules = [
        # Pre-training heads (quantizer, projections): in the file, not part of the encoder.
        Rule("quantizer.{rest}", None),
        Rule("project_hid.{p}", None),
        Rule("project_q.{p}", None),
        Rule(f"wav2vec2.{conv}.weight_g", f"{conv}.parametrizations.weight.original0"),
        Rule(f"wav2vec2.{conv}.weight_v", f"{conv}.parametrizations.weight.original1"),
        Rule("wav2vec2.{rest}", "{rest}"),
        Rule(f"{conv}.weight_g", f"{conv}.parametrizations.weight.original0"),
        Rule(f"{conv}.weight_v", f"{conv}.parametrizations.weight.original1"),
        Rule("{rest}", "{rest}"),
    ]
    return KeyMap("wav2vec", rules)
