"""The user's folders load unchanged and strictly; a missing, extra or misshapen tensor is refused at once,
naming the file, the key and the shapes; the rename maps cover every original tensor and round-trip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models import check_configured_weights
from gpu_worker.models.dit.checkpoint import CheckpointError
from gpu_worker.models.infinitetalk import PRESET_ENV, WEIGHTS_ENV, layout, rename
from gpu_worker.models.infinitetalk.checkpoint import MODEL_NAMES, InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY, WAN_14B


def _weights(root: Path) -> InfiniteTalkWeights:
    return InfiniteTalkWeights(TINY, Locations.under(root))


def test_every_model_loads_strictly_from_the_original_layout(tiny_weights: Path) -> None:
    weights = _weights(tiny_weights)
    for name in MODEL_NAMES:
        model = weights.build(name)
        assert not any(parameter.is_meta for parameter in model.parameters()), name
    # The adapter's file wins where it overlaps the shards (the original's merge order); here it holds the adapter.
    dit = weights.build("dit")
    adapter = safetensors.torch.load_file(layout.adapter_file(tiny_weights))
    stored = adapter["blocks.1.audio_cross_attn.kv_linear.weight"].float()
    assert torch.equal(dit.state_dict()["blocks.1.audio_cross_attn.kv_linear.weight"], stored)
    shard = safetensors.torch.load_file(tiny_weights / layout.WAN_DIR / layout.shard_name(1, 2))
    key = next(k for k in shard if k.endswith("norm3.weight"))  # the original's cross-attention norm
    assert torch.equal(dit.state_dict()[key.replace("norm3", "norm2")], shard[key].float())


@pytest.mark.parametrize("config", [TINY, WAN_14B], ids=["tiny", "wan2.1-i2v-14b"])
def test_the_rename_maps_cover_every_original_tensor_and_round_trip(config: object) -> None:
    """Original layout (layout.py, from the original definitions) → our keys → back; every model key is reached."""
    weights = InfiniteTalkWeights.__new__(InfiniteTalkWeights)
    weights.config = config  # type: ignore[assignment]
    dit, adapter = layout.dit_layout(config.dit)  # type: ignore[attr-defined]
    originals = {
        "dit": dit | adapter,
        "vae": layout.vae_layout(config.vae),  # type: ignore[attr-defined]
        "t5": layout.t5_layout(config.t5),  # type: ignore[attr-defined]
        "clip": layout.clip_layout(config.clip),  # type: ignore[attr-defined]
    }
    for name, shapes in originals.items():
        keymap = weights.keymap(name)
        reached = set()
        for key in shapes:
            for part, ours in enumerate(keymap.ours(key)):
                assert keymap.original(ours) == (key, part), (name, key, ours)
                assert ours not in reached, f"{name}: two original tensors map to {ours}"
                reached.add(ours)
        if config is TINY:  # the models themselves only at test widths (the 14B ones are just names here)
            expected = {k for k, _ in weights.empty(name).named_parameters()}
            assert reached == expected, (name, sorted(reached ^ expected)[:5])


def test_the_adapter_names_are_not_rewritten_as_cross_attention() -> None:
    """diffusers' substring renames would turn audio_cross_attn.q_linear into audio_attn2.to_q_linear."""
    keymap = rename.dit_map()
    assert keymap.ours("blocks.3.audio_cross_attn.q_linear.weight") == ["blocks.3.audio_cross_attn.q_linear.weight"]
    assert keymap.ours("blocks.3.cross_attn.k_img.bias") == ["blocks.3.attn2.add_k_proj.bias"]
    assert keymap.ours("blocks.3.norm3.weight") == ["blocks.3.norm2.weight"]
    assert rename.wav2vec_map().ours("wav2vec2.encoder.pos_conv_embed.conv.weight_g") == [
        "encoder.pos_conv_embed.conv.parametrizations.weight.original0"
    ]


def _copy(tiny_weights: Path, tmp_path: Path) -> Path:
    root = tmp_path / "weights"
    shutil.copytree(tiny_weights, root)
    return root


def _edit_vae(root: Path, edit: object) -> None:
    path = root / layout.WAN_DIR / layout.VAE_FILE
    state = torch.load(path, weights_only=True)
    edit(state)  # type: ignore[operator]
    torch.save(state, path)


MISSING = r"Wan2.1_VAE.pth: missing key 'decoder.head.2.bias' \(the model expects shape \(3,\)\)"
EXTRA = r"Wan2.1_VAE.pth: unexpected key 'decoder.extra.weight' \(shape \(2,\)\)"
MISSHAPEN = r"Wan2.1_VAE.pth: key 'conv2.bias' has shape \(5,\), the model expects \(16,\)"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("decoder.head.2.bias"), MISSING),
        (lambda s: s.update({"decoder.extra.weight": torch.zeros(2)}), EXTRA),
        (lambda s: s.update({"conv2.bias": torch.zeros(5)}), MISSHAPEN),
    ],
    ids=["missing", "extra", "misshapen"],
)
def test_a_bad_tensor_is_refused_at_node_start_naming_file_key_and_shapes(
    tiny_weights: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: object, message: str
) -> None:
    root = _copy(tiny_weights, tmp_path)
    _edit_vae(root, edit)
    monkeypatch.setenv(WEIGHTS_ENV, str(root))
    monkeypatch.setenv(PRESET_ENV, "tiny")
    with pytest.raises(CheckpointError, match=message):
        check_configured_weights()  # headers only: what the node runs before it starts its workers
    with pytest.raises(CheckpointError, match=message):
        _weights(root).build("vae")


def test_a_missing_shard_or_adapter_is_named(tiny_weights: Path, tmp_path: Path) -> None:
    root = _copy(tiny_weights, tmp_path)
    (root / layout.WAN_DIR / layout.shard_name(2, 2)).unlink()
    with pytest.raises(CheckpointError, match=r"the DiT shard listed in .*index.json .*00002-of-00002.safetensors"):
        _weights(root).check()
    root = _copy(tiny_weights, tmp_path / "second")
    layout.adapter_file(root).unlink()
    with pytest.raises(CheckpointError, match=r"the InfiniteTalk adapter .*infinitetalk.safetensors does not exist"):
        _weights(root).check()


def test_a_shard_with_a_tensor_of_the_wrong_shape_names_the_shard(tiny_weights: Path, tmp_path: Path) -> None:
    root = _copy(tiny_weights, tmp_path)
    path = root / layout.WAN_DIR / layout.shard_name(1, 2)
    state = safetensors.torch.load_file(path)
    key = sorted(state)[0]
    state[key] = torch.zeros(7, 7)
    safetensors.torch.save_file(state, path)
    with pytest.raises(CheckpointError, match=rf"00001-of-00002.safetensors: key '{key}' has shape \(7, 7\)"):
        _weights(root).check()
