"""Loading the user's folders, unchanged and strictly: every tensor of every file lands in a model, every
parameter comes from a file, and shapes agree, or a CheckpointError names the file, the key and the shapes.

`InfiniteTalkWeights.build(name, dtype)` is the one path from the folders to a ready model (on the CPU, eval,
no gradients): the model is built on the meta device (accelerate), the files are read (safetensors memory-mapped,
the .pth files through torch.load with mmap and weights_only), renamed (rename.py), checked, cast and assigned.
`check()` runs the same path on the files' shapes alone (meta tensors), so a node can refuse to start in seconds
instead of failing a render: nothing is read but headers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from accelerate import init_empty_weights
from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan
from torch import Tensor, nn
from transformers import CLIPVisionConfig, CLIPVisionModel, UMT5Config, UMT5EncoderModel, Wav2Vec2Config, Wav2Vec2Model

from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.models.infinitetalk import layout, rename
from gpu_worker.models.infinitetalk.config import InfiniteTalkConfig
from gpu_worker.models.infinitetalk.dit import InfiniteTalkDiT
from gpu_worker.models.infinitetalk.lora import LoraFile, Update

MODEL_NAMES = ("dit", "vae", "t5", "clip", "wav2vec")


@dataclass(frozen=True)
class Locations:
    """Where each part is: the Wan2.1-I2V-14B-480P folder, the chinese-wav2vec2-base folder, the adapter file."""

    wan: Path
    wav2vec: Path
    adapter: Path

    @classmethod
    def under(cls, root: Path) -> Locations:
        return cls(root / layout.WAN_DIR, root / layout.WAV2VEC_DIR, layout.adapter_file(root))


def _file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise CheckpointError(f"infinitetalk weights: {what} {path} does not exist")
    return path


def _read(path: Path, shapes_only: bool) -> dict[str, Tensor]:
    """A file's tensors (memory-mapped), or meta tensors of their shapes."""
    if path.suffix == ".safetensors":
        if not shapes_only:
            return safetensors.torch.load_file(path)
        with safetensors.safe_open(path, "pt") as handle:  # type: ignore[no-untyped-call]
            return {key: torch.empty(handle.get_slice(key).get_shape(), device="meta") for key in handle.keys()}  # noqa: SIM118
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a truncated or foreign file: say which
        raise CheckpointError(f"infinitetalk weights: {path} is not a readable torch checkpoint ({exc})") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"infinitetalk weights: {path} holds a {type(state).__name__}, not a state dict")
    return {key: torch.empty(value.shape, device="meta") for key, value in state.items()} if shapes_only else state


def dit_files(wan: Path, adapter: Path) -> list[Path]:
    """The Wan shards the index names (each checked to exist), then the adapter (read last: its tensors win, as
    the original's merged_state_dict.update does, multitalk.py lines 220-224)."""
    index_path = _file(wan / layout.DIT_INDEX, "the DiT shard index")
    weight_map = json.loads(index_path.read_text()).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"infinitetalk weights: {index_path} has no weight_map")
    shards = sorted(set(weight_map.values()))
    return [_file(wan / shard, f"the DiT shard listed in {index_path.name}") for shard in shards] + [
        _file(adapter, "the InfiniteTalk adapter")
    ]


class InfiniteTalkWeights:
    """The family's configuration and files; builds each model from them."""

    def __init__(self, config: InfiniteTalkConfig, locations: Locations, lora: LoraFile | None = None) -> None:
        wan_config = _file(locations.wan / layout.DIT_CONFIG, "the Wan config")
        try:
            self.config = config.with_dit(json.loads(wan_config.read_text()), str(wan_config))
        except (ValueError, TypeError) as exc:
            raise CheckpointError(f"infinitetalk weights: {exc}") from exc
        self.locations = locations
        self.lora = lora  # merged into the DiT's weights as they load (lora.py)
        self.wav2vec_config = Wav2Vec2Config.from_json_file(
            _file(locations.wav2vec / "config.json", "the wav2vec2 config")
        )
        dit = self.config.dit
        if (self.wav2vec_config.num_hidden_layers, self.wav2vec_config.hidden_size) != (
            dit.audio_blocks,
            dit.audio_channels,
        ):
            raise CheckpointError(
                f"infinitetalk weights: {locations.wav2vec} has {self.wav2vec_config.num_hidden_layers} layers of "
                f"{self.wav2vec_config.hidden_size}, the adapter takes {dit.audio_blocks} of {dit.audio_channels}"
            )

    def describe(self) -> str:
        where = self.locations
        lora = f", LoRA {self.lora.path} at {self.lora.strength}" if self.lora else ""
        return f"{where.wan}, {where.wav2vec}, {where.adapter}{lora} (preset {self.config.name})"

    def files(self, name: str) -> list[Path]:
        where = self.locations
        if name == "dit":
            return dit_files(where.wan, where.adapter)
        if name == "wav2vec":
            found = [where.wav2vec / file for file in layout.WAV2VEC_FILES if (where.wav2vec / file).is_file()]
            return found[:1] or [_file(where.wav2vec / layout.WAV2VEC_FILES[0], "the wav2vec2 weights")]
        file = {"vae": layout.VAE_FILE, "t5": layout.T5_FILE, "clip": layout.CLIP_FILE}[name]
        return [_file(where.wan / file, f"the {name} checkpoint")]

    def empty(self, name: str) -> nn.Module:
        """The named model with its parameters on the meta device."""
        builders: dict[str, Callable[[], nn.Module]] = {
            "dit": lambda: InfiniteTalkDiT(self.config.dit),
            "vae": lambda: _vae(self.config),
            "t5": lambda: UMT5EncoderModel(_t5_config(self.config)),
            "clip": lambda: CLIPVisionModel(_clip_config(self.config)),
            "wav2vec": lambda: Wav2Vec2Model(self.wav2vec_config),
        }
        with init_empty_weights(include_buffers=False):
            model = builders[name]().eval()
        if hasattr(model, "tie_weights"):
            model.tie_weights()  # umT5's encoder.embed_tokens is `shared`: one parameter, one file tensor
        return model

    def keymap(self, name: str) -> rename.KeyMap:
        maps = {"dit": rename.dit_map, "t5": rename.t5_map, "wav2vec": rename.wav2vec_map}
        if name in maps:
            return maps[name]()
        return rename.vae_map(self.config) if name == "vae" else rename.clip_map(self.config)

    def state(self, name: str, model: nn.Module, dtype: torch.dtype, shapes_only: bool = False) -> dict[str, Tensor]:
        """The model's state from its files, renamed, checked against the model, the DiT's LoRA merged, cast to
        `dtype`."""
        tensors: dict[str, Tensor] = {}
        origin: dict[str, Path] = {}
        for path in self.files(name):
            for key, value in _read(path, shapes_only).items():
                tensors[key], origin[key] = value, path
        keymap = self.keymap(name)
        updates = None
        if name == "dit" and self.lora is not None:
            updates = self.lora.updates(keymap, _expected(model), shapes_only)
        return convert(tensors, origin, keymap, model, dtype, updates)

    def build(self, name: str, dtype: torch.dtype = torch.float32) -> nn.Module:
        """The named model with its weights, on the CPU, eval, gradients off."""
        if name not in MODEL_NAMES:
            raise ValueError(f"unknown infinitetalk model {name!r}; known: {', '.join(MODEL_NAMES)}")
        model = self.empty(name)
        model.load_state_dict(self.state(name, model, dtype), strict=False, assign=True)
        if hasattr(model, "tie_weights"):
            model.tie_weights()  # umT5's encoder.embed_tokens is `shared`
        left = [key for key, parameter in model.named_parameters() if parameter.is_meta]
        if left:
            raise CheckpointError(f"infinitetalk {name}: parameters {left[:5]} were not loaded")
        return model.requires_grad_(False)

    def check(self) -> None:
        """Every file's names and shapes against every model, reading headers only (node start)."""
        for name in MODEL_NAMES:
            self.state(name, self.empty(name), torch.float32, shapes_only=True)


def _expected(model: nn.Module) -> dict[str, tuple[int, ...]]:
    shapes = {key: tuple(parameter.shape) for key, parameter in model.named_parameters()}
    persistent = model.state_dict(keep_vars=True)
    return shapes | {key: tuple(buffer.shape) for key, buffer in model.named_buffers() if key in persistent}


def convert(
    tensors: dict[str, Tensor],
    origin: dict[str, Path],
    keymap: rename.KeyMap,
    model: nn.Module,
    dtype: torch.dtype,
    updates: dict[str, Update] | None = None,
) -> dict[str, Tensor]:
    """Rename `tensors` (original names, each from its file in `origin`) to the model's, or raise CheckpointError
    naming every unexpected, missing or misshapen key with its file and both shapes. `updates` (a LoRA's, by our
    names) are added in fp32 before the one cast to `dtype` (fp32 for the model's `FP32_PARAMETERS` prefixes)."""
    expected = _expected(model)
    fp32: tuple[str, ...] = getattr(model, "FP32_PARAMETERS", ())  # kept in fp32 (the DiT's modulation and head)
    state: dict[str, Tensor] = {}
    problems: list[str] = []
    for key, tensor in tensors.items():
        where = origin[key]
        try:
            rule, names = keymap.rule(key)
        except KeyError:
            problems.append(f"{where}: unexpected key {key!r} (shape {tuple(tensor.shape)})")
            continue
        if not names:
            continue  # in the file on purpose, never run (rename.py says which)
        pieces = tensor.chunk(len(rule.parts), dim=0) if rule.parts else (tensor,)
        for ours, piece in zip(names, pieces, strict=True):
            want = expected.get(ours)
            if want is None:
                problems.append(
                    f"{where}: unexpected key {key!r} (shape {tuple(tensor.shape)}; the model has no {ours})"
                )
                continue
            if rule.reshape and piece.numel() == math.prod(want):
                piece = piece.reshape(want)
            if tuple(piece.shape) != want:
                file_shape = tuple(tensor.shape)
                model_shape = (want[0] * len(rule.parts), *want[1:]) if rule.parts else want
                problems.append(f"{where}: key {key!r} has shape {file_shape}, the model expects {model_shape}")
                continue
            if updates and ours in updates and not piece.is_meta:
                piece = updates[ours].merged(piece)  # fp32: the file's values + the LoRA's, rounded once below
            # A copy the model owns: the file's tensors are memory maps, whose storage cannot be freed and refilled
            # (offload and switch residency resize storages in place).
            cast = torch.float32 if ours.startswith(fp32) else dtype
            state[ours] = (
                piece if piece.is_meta else piece.to(cast if piece.is_floating_point() else piece.dtype, copy=True)
            )
    files = ", ".join(sorted({str(path) for path in origin.values()}))
    for ours, want in expected.items():
        if ours not in state and not any(ours in problem for problem in problems):
            original, _ = keymap.original(ours) if _knows(keymap, ours) else (ours, 0)
            problems.append(f"{files}: missing key {original!r} (the model expects shape {want})")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise CheckpointError(f"infinitetalk {keymap.name} weights do not match the model: {shown}")
    return state


def _knows(keymap: rename.KeyMap, ours: str) -> bool:
    try:
        keymap.original(ours)
    except KeyError:
        return False
    return True


def _vae(config: InfiniteTalkConfig) -> AutoencoderKLWan:
    vae = config.vae
    return AutoencoderKLWan(
        base_dim=vae.base_dim,
        z_dim=vae.z_dim,
        dim_mult=list(vae.dim_mult),
        num_res_blocks=vae.num_res_blocks,
        temperal_downsample=list(vae.temporal_downsample),
    )


def _t5_config(config: InfiniteTalkConfig) -> UMT5Config:
    t5 = config.t5
    return UMT5Config(
        vocab_size=t5.vocab,
        d_model=t5.dim,
        d_kv=t5.dim_attn // t5.num_heads,
        d_ff=t5.dim_ffn,
        num_layers=t5.num_layers,
        num_heads=t5.num_heads,
        relative_attention_num_buckets=t5.num_buckets,
        relative_attention_max_distance=128,  # t5.py T5RelativeEmbedding max_dist
        feed_forward_proj="gated-gelu",  # gelu_new: the tanh GELU of t5.py line 51
        layer_norm_epsilon=1e-6,
        dropout_rate=0.0,
        is_encoder_decoder=False,
    )


def _clip_config(config: InfiniteTalkConfig) -> CLIPVisionConfig:
    clip = config.clip
    return CLIPVisionConfig(
        hidden_size=clip.dim,
        intermediate_size=clip.mlp_ratio * clip.dim,
        num_hidden_layers=clip.num_layers - 1,  # the first 31 of 32 run (use_31_block)
        num_attention_heads=clip.num_heads,
        image_size=clip.image_size,
        patch_size=clip.patch_size,
        hidden_act="gelu",  # nn.GELU (activation 'gelu', clip.py line 143)
        layer_norm_eps=clip.eps,
        projection_dim=clip.embed_dim,
    )
