"""The user's folders as the original code reads them, and every checkpoint's tensor names and shapes there.

    <MONOLOGUE_INFINITETALK_WEIGHTS>/              (or each part named on its own, see __init__.py)
        Wan2.1-I2V-14B-480P/
            config.json                             the DiT's WanModel keyword arguments
            diffusion_pytorch_model.safetensors.index.json
            diffusion_pytorch_model-0000N-of-0000M.safetensors
            Wan2.1_VAE.pth
            models_t5_umt5-xxl-enc-bf16.pth
            google/umt5-xxl/                        the umT5 tokenizer (tokenizer.json, tokenizer_config.json, ...)
            models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth
        chinese-wav2vec2-base/
            config.json, preprocessor_config.json, model.safetensors (or pytorch_model.bin)
        InfiniteTalk/single/infinitetalk.safetensors (or infinitetalk.safetensors)

File names: InfiniteTalk `wan/configs/wan_multitalk_14B.py` (t5, clip, vae), `wan/multitalk.py` lines 207-224 (the
shards and the adapter, merged into one state dict, the adapter's file last), `generate_infinitetalk.py` line 278
(wav2vec2 through transformers' from_pretrained). The `*_layout` functions give the original tensor names and
shapes, written from the original module definitions (cited per function); `make_checkpoint.py` writes random
folders from them and the tests load those through the rename maps, so a map that disagrees with these names
fails a strict load.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from gpu_worker.models.infinitetalk.config import ClipConfig, DiTConfig, T5Config, VAEConfig

WAN_DIR = "Wan2.1-I2V-14B-480P"
WAV2VEC_DIR = "chinese-wav2vec2-base"
ADAPTER_FILES = ("InfiniteTalk/single/infinitetalk.safetensors", "infinitetalk.safetensors")
DIT_CONFIG = "config.json"
DIT_INDEX = "diffusion_pytorch_model.safetensors.index.json"
VAE_FILE = "Wan2.1_VAE.pth"
T5_FILE = "models_t5_umt5-xxl-enc-bf16.pth"
T5_TOKENIZER = "google/umt5-xxl"
CLIP_FILE = "models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth"
WAV2VEC_FILES = ("model.safetensors", "pytorch_model.bin")

Shapes = dict[str, tuple[int, ...]]


def shard_name(index: int, count: int) -> str:
    return f"diffusion_pytorch_model-{index:05d}-of-{count:05d}.safetensors"


def _linear(name: str, out: int, inp: int, bias: bool = True) -> Shapes:
    return {f"{name}.weight": (out, inp), **({f"{name}.bias": (out,)} if bias else {})}


def _norm(name: str, dim: int) -> Shapes:
    return {f"{name}.weight": (dim,), f"{name}.bias": (dim,)}


def dit_layout(c: DiTConfig) -> tuple[Shapes, Shapes]:
    """(the Wan shards' tensors, the InfiniteTalk adapter's): Wan2.1 `wan/modules/model.py` WanModel (i2v,
    cross_attn_norm, qk_norm) and InfiniteTalk `wan/modules/multitalk_model.py` lines 216-541."""
    d, p = c.dim, c.patch_size
    wan: Shapes = {"patch_embedding.weight": (d, c.in_dim, *p), "patch_embedding.bias": (d,)}
    wan |= _linear("text_embedding.0", d, c.text_dim) | _linear("text_embedding.2", d, d)
    wan |= _linear("time_embedding.0", d, c.freq_dim) | _linear("time_embedding.2", d, d)
    wan |= _linear("time_projection.1", 6 * d, d)
    wan |= _norm("img_emb.proj.0", c.image_dim) | _linear("img_emb.proj.1", c.image_dim, c.image_dim)
    wan |= _linear("img_emb.proj.3", d, c.image_dim) | _norm("img_emb.proj.4", d)
    wan |= _linear("head.head", c.out_dim * p[0] * p[1] * p[2], d) | {"head.modulation": (1, 2, d)}
    adapter: Shapes = {}
    for n in range(c.num_layers):
        block = f"blocks.{n}"
        wan[f"{block}.modulation"] = (1, 6, d)
        for attention in ("self_attn", "cross_attn"):
            for name in ("q", "k", "v", "o"):
                wan |= _linear(f"{block}.{attention}.{name}", d, d)
            wan |= {f"{block}.{attention}.norm_q.weight": (d,), f"{block}.{attention}.norm_k.weight": (d,)}
        wan |= _linear(f"{block}.cross_attn.k_img", d, d) | _linear(f"{block}.cross_attn.v_img", d, d)
        wan |= {f"{block}.cross_attn.norm_k_img.weight": (d,)} | _norm(f"{block}.norm3", d)
        wan |= _linear(f"{block}.ffn.0", c.ffn_dim, d) | _linear(f"{block}.ffn.2", d, c.ffn_dim)
        # SingleStreamMutiAttention (attention.py lines 191-226; qk_norm off, qkv_bias on) and norm_x.
        adapter |= _linear(f"{block}.audio_cross_attn.q_linear", d, d)
        adapter |= _linear(f"{block}.audio_cross_attn.kv_linear", 2 * d, c.output_dim)
        adapter |= _linear(f"{block}.audio_cross_attn.proj", d, d) | _norm(f"{block}.norm_x", d)
    per_frame = c.audio_blocks * c.audio_channels
    adapter |= _linear("audio_proj.proj1", c.intermediate_dim, c.audio_window * per_frame)
    adapter |= _linear("audio_proj.proj1_vf", c.intermediate_dim, (c.audio_window + c.vae_scale - 1) * per_frame)
    adapter |= _linear("audio_proj.proj2", c.intermediate_dim, c.intermediate_dim)
    adapter |= _linear("audio_proj.proj3", c.context_tokens * c.output_dim, c.intermediate_dim)
    adapter |= _norm("audio_proj.norm", c.output_dim)
    return wan, adapter


def _resblock(name: str, inp: int, out: int) -> Shapes:
    """vae.py ResidualBlock (lines 186-220): RMS_norm gammas are (C, 1, 1, 1), convolutions 3x3x3."""
    shapes: Shapes = {f"{name}.residual.0.gamma": (inp, 1, 1, 1), f"{name}.residual.3.gamma": (out, 1, 1, 1)}
    shapes |= {f"{name}.residual.2.weight": (out, inp, 3, 3, 3), f"{name}.residual.2.bias": (out,)}
    shapes |= {f"{name}.residual.6.weight": (out, out, 3, 3, 3), f"{name}.residual.6.bias": (out,)}
    if inp != out:
        shapes |= {f"{name}.shortcut.weight": (out, inp, 1, 1, 1), f"{name}.shortcut.bias": (out,)}
    return shapes


def _middle(name: str, dim: int) -> Shapes:
    shapes = _resblock(f"{name}.0", dim, dim) | _resblock(f"{name}.2", dim, dim)
    shapes |= {f"{name}.1.norm.gamma": (dim, 1, 1), f"{name}.1.to_qkv.weight": (3 * dim, dim, 1, 1)}
    return shapes | {
        f"{name}.1.to_qkv.bias": (3 * dim,),
        f"{name}.1.proj.weight": (dim, dim, 1, 1),
        f"{name}.1.proj.bias": (dim,),
    }


def _conv(name: str, out: int, inp: int, kernel: tuple[int, ...]) -> Shapes:
    return {f"{name}.weight": (out, inp, *kernel), f"{name}.bias": (out,)}


def vae_layout(v: VAEConfig) -> Shapes:
    """vae.py WanVAE_ (lines 495-510): Encoder3d (lines 265-320), Decoder3d (lines 369-420), conv1/conv2."""
    z, levels = v.z_dim, len(v.dim_mult)
    shapes = _conv("conv1", 2 * z, 2 * z, (1, 1, 1)) | _conv("conv2", z, z, (1, 1, 1))
    dims = [v.base_dim * u for u in (1, *v.dim_mult)]
    shapes |= _conv("encoder.conv1", dims[0], 3, (3, 3, 3))
    flat = 0
    for level, (inp, out) in enumerate(itertools.pairwise(dims)):
        for _ in range(v.num_res_blocks):
            shapes |= _resblock(f"encoder.downsamples.{flat}", inp, out)
            inp, flat = out, flat + 1
        if level != levels - 1:
            shapes |= _conv(f"encoder.downsamples.{flat}.resample.1", out, out, (3, 3))
            if v.temporal_downsample[level]:
                shapes |= _conv(f"encoder.downsamples.{flat}.time_conv", out, out, (3, 1, 1))
            flat += 1
    shapes |= _middle("encoder.middle", dims[-1]) | {"encoder.head.0.gamma": (dims[-1], 1, 1, 1)}
    shapes |= _conv("encoder.head.2", 2 * z, dims[-1], (3, 3, 3))
    dims = [v.base_dim * u for u in (v.dim_mult[-1], *v.dim_mult[::-1])]
    shapes |= _conv("decoder.conv1", dims[0], z, (3, 3, 3)) | _middle("decoder.middle", dims[0])
    upsample = v.temporal_downsample[::-1]
    flat = 0
    for level, (inp, out) in enumerate(itertools.pairwise(dims)):
        inp = inp // 2 if level > 0 else inp  # the Resample before halved the channels
        for _ in range(v.num_res_blocks + 1):
            shapes |= _resblock(f"decoder.upsamples.{flat}", inp, out)
            inp, flat = out, flat + 1
        if level != levels - 1:
            shapes |= _conv(f"decoder.upsamples.{flat}.resample.1", out // 2, out, (3, 3))
            if upsample[level]:
                shapes |= _conv(f"decoder.upsamples.{flat}.time_conv", 2 * out, out, (3, 1, 1))
            flat += 1
    return shapes | {"decoder.head.0.gamma": (dims[-1], 1, 1, 1)} | _conv("decoder.head.2", 3, dims[-1], (3, 3, 3))


def t5_layout(t: T5Config) -> Shapes:
    """t5.py T5Encoder (lines 272-317) with shared_pos=False: a relative position embedding per block."""
    shapes: Shapes = {"token_embedding.weight": (t.vocab, t.dim), "norm.weight": (t.dim,)}
    for n in range(t.num_layers):
        block = f"blocks.{n}"
        shapes |= {f"{block}.norm1.weight": (t.dim,), f"{block}.norm2.weight": (t.dim,)}
        shapes |= {f"{block}.attn.{x}.weight": (t.dim_attn, t.dim) for x in ("q", "k", "v")}
        shapes |= {f"{block}.attn.o.weight": (t.dim, t.dim_attn)}
        shapes |= {f"{block}.ffn.gate.0.weight": (t.dim_ffn, t.dim), f"{block}.ffn.fc1.weight": (t.dim_ffn, t.dim)}
        shapes |= {f"{block}.ffn.fc2.weight": (t.dim, t.dim_ffn)}
        shapes |= {f"{block}.pos_embedding.embedding.weight": (t.num_buckets, t.num_heads)}
    return shapes


def clip_layout(c: ClipConfig) -> Shapes:
    """clip.py XLMRobertaCLIP (lines 328-404): VisionTransformer (pool 'token', pre_norm, no patch bias) and the
    XLM-RoBERTa text tower with its head (xlm_roberta.py; clip.py lines 303-325), and log_scale."""
    d, tokens = c.dim, (c.image_size // c.patch_size) ** 2 + 1
    shapes: Shapes = {"visual.patch_embedding.weight": (d, 3, c.patch_size, c.patch_size)}
    shapes |= {
        "visual.cls_embedding": (1, 1, d),
        "visual.pos_embedding": (1, tokens, d),
        "visual.head": (d, c.embed_dim),
    }
    shapes |= _norm("visual.pre_norm", d) | _norm("visual.post_norm", d) | {"log_scale": ()}
    for n in range(c.num_layers):
        block = f"visual.transformer.{n}"
        shapes |= _norm(f"{block}.norm1", d) | _norm(f"{block}.norm2", d)
        shapes |= _linear(f"{block}.attn.to_qkv", 3 * d, d) | _linear(f"{block}.attn.proj", d, d)
        shapes |= _linear(f"{block}.mlp.0", c.mlp_ratio * d, d) | _linear(f"{block}.mlp.2", d, c.mlp_ratio * d)
    t = c.text_dim
    shapes |= {"textual.token_embedding.weight": (c.text_vocab, t), "textual.type_embedding.weight": (1, t)}
    shapes |= {"textual.pos_embedding.weight": (c.text_positions, t)} | _norm("textual.norm", t)
    for n in range(c.text_layers):
        block = f"textual.blocks.{n}"
        shapes |= {
            key: shape for x in ("q", "k", "v", "o") for key, shape in _linear(f"{block}.attn.{x}", t, t).items()
        }
        shapes |= _norm(f"{block}.norm1", t) | _norm(f"{block}.norm2", t)
        shapes |= _linear(f"{block}.ffn.0", 4 * t, t) | _linear(f"{block}.ffn.2", t, 4 * t)
    middle = (t + c.embed_dim) // 2
    return (
        shapes
        | _linear("textual.head.0", middle, t, bias=False)
        | _linear("textual.head.2", c.embed_dim, middle, bias=False)
    )


def adapter_file(root: Path) -> Path:
    """The adapter under a weights root: the InfiniteTalk download's layout, or the file at the top."""
    for name in ADAPTER_FILES:
        if (root / name).is_file():
            return root / name
    return root / ADAPTER_FILES[0]
