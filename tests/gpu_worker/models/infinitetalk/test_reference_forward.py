"""The DiT, loaded from the original layout through the project's checkpoint path (rename.py, diffusers' Wan
classes, dit.py), equals an independent plain-PyTorch forward that reads the original tensor names directly
(reference_forward.py, written from the original modules), on a random tiny checkpoint. A rename that sends a
tensor to the wrong place (cross_attn k ↔ v), an adapter that splits kv_linear the wrong way round, an audio window
gathered about the wrong centre, or a key name that layout.py and rename.py agree on but the original does not
have (the reference reads the original's names, and every file tensor must be read) fail here."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

pytest.importorskip("diffusers", reason="the infinitetalk family's models are diffusers' and transformers' classes")


from gpu_worker.models.infinitetalk.checkpoint import InfiniteTalkWeights, Locations
from gpu_worker.models.infinitetalk.config import TINY, DiTConfig
from tests.gpu_worker.models.infinitetalk.reference_forward import WAN_FOLDER, read_original, reference_forward

TOLERANCE = 1e-4  # of the output's largest magnitude: float32 rounding, not a loose match


# MLPProj's LayerNorm weights: make_checkpoint draws them as it draws biases (~0.02, its norm rule looks for
# ".norm" in the name), which shrinks the image tokens' share of the output to ~6e-4 of it, a few tolerances: a wrong
# image path would barely show. Here they are drawn as a norm's weights are, near 1 (the share is then ~0.17).
IMAGE_NORMS = ("img_emb.proj.0.weight", "img_emb.proj.4.weight")


@pytest.fixture(scope="module")
def original_weights(tiny_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny checkpoint (the original layout) with `IMAGE_NORMS` near 1."""
    root = tmp_path_factory.mktemp("infinitetalk-reference") / "weights"
    shutil.copytree(tiny_weights, root)
    generator = torch.Generator().manual_seed(4)
    for shard in (root / WAN_FOLDER).glob("diffusion_pytorch_model-*.safetensors"):
        tensors = safetensors.torch.load_file(shard)
        for key in set(IMAGE_NORMS) & set(tensors):
            noise = torch.randn(tensors[key].shape, generator=generator)
            tensors[key] = (1 + 0.1 * noise).to(tensors[key].dtype)
        safetensors.torch.save_file(tensors, shard)
    return root


def _inputs(c: DiTConfig) -> dict[str, torch.Tensor]:
    """Every input non-zero and in play: 3 latents (RoPE over time and the later-latent audio path), a
    non-square grid of 3 x 4 patches (rows and columns not interchangeable), a timestep inside the schedule."""
    generator = torch.Generator().manual_seed(11)
    frames = 3
    audio_frames = 1 + c.vae_scale * (frames - 1)
    return {
        "latents": torch.randn(1, c.in_dim, frames, 6, 8, generator=generator),
        "timestep": torch.tensor([637.0]),
        "text": torch.randn(1, c.text_len, c.text_dim, generator=generator),
        "image": torch.randn(1, 257, c.image_dim, generator=generator),
        "audio": torch.randn(1, audio_frames, c.audio_window, c.audio_blocks, c.audio_channels, generator=generator),
    }


def _gap(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference, relative to the reference's largest magnitude."""
    return float((ours - reference).abs().max() / reference.abs().max())


def test_the_dit_equals_an_independent_forward_on_the_original_names(original_weights: Path) -> None:
    """InfiniteTalkDiT through the real loader (the files renamed by rename.py) against reference_forward on the
    same files under their original names, to float32 rounding."""
    config = TINY.dit
    state = read_original(original_weights)
    model = InfiniteTalkWeights(TINY, Locations.under(original_weights)).build("dit")
    inputs = _inputs(config)
    with torch.no_grad():
        ours = model(**inputs)
        reference = reference_forward(state, config, **inputs)
    assert ours.shape == reference.shape == inputs["latents"][:, : config.out_dim].shape
    gap = _gap(ours, reference)
    assert gap < TOLERANCE, f"the DiT differs from the reference by {gap:.2e} of the output's scale"
    # Every tensor of the files was read by the reference (and a name it asks for that the files lack is a
    # KeyError above): the files hold the original's names, all of them, and nothing else.
    assert state.unread() == set()


def test_every_input_moves_the_output_far_beyond_the_tolerance(original_weights: Path) -> None:
    """Without this the comparison above could pass on inputs a wrong model ignores: each conditioning input,
    replaced by another draw (the timestep by another step), moves the reference's output by at least a hundred
    times the tolerance (here 0.05 to 0.7 of the output's scale). Another draw, not a rescaled input: the image
    tokens are layer-normed first, so halving them changes nothing."""
    config = TINY.dit
    state = read_original(original_weights)
    inputs = _inputs(config)
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        base = reference_forward(state, config, **inputs)
        for name in ("timestep", "text", "image", "audio"):
            shape = inputs[name].shape
            other = torch.tensor([250.0]) if name == "timestep" else torch.randn(shape, generator=generator)
            moved = _gap(reference_forward(state, config, **(inputs | {name: other})), base)
            assert moved > 100 * TOLERANCE, f"another {name} moves the output by only {moved:.2e}"
