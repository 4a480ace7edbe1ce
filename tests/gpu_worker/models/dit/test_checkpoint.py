"""Weights: written by make_checkpoint, read back from a folder, an object store or S3, and refused with
a message naming the file, the key and both shapes when they do not fit the configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu_worker.models.dit import SMOKE_SEED, WEIGHTS_ENV, default_weights
from gpu_worker.models.dit.checkpoint import MODEL_NAMES, Checkpoint, CheckpointError, Weights
from gpu_worker.models.dit.config import TINY, DiTConfig, preset
from gpu_worker.models.dit.make_checkpoint import main as make_checkpoint_main, parameter_counts
from monologue.storage import LocalStore, S3Store
from tests.s3_server import S3Server


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny"
    make_checkpoint_main([str(folder), "--preset", "tiny"])
    return folder


def _same_weights(first: torch.nn.Module, second: torch.nn.Module) -> bool:
    one, two = first.state_dict(), second.state_dict()
    return one.keys() == two.keys() and all(torch.equal(one[key], two[key]) for key in one)


def test_make_checkpoint_writes_a_config_and_one_file_per_model(tiny_folder: Path) -> None:
    assert sorted(path.name for path in tiny_folder.iterdir()) == sorted(
        ["config.json", *(f"{name}.safetensors" for name in MODEL_NAMES)]
    )
    assert DiTConfig.from_json((tiny_folder / "config.json").read_text()) == TINY


def test_a_dry_run_prints_parameter_counts_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_checkpoint_main([str(tmp_path / "none"), "--preset", "h200", "--dry-run"])
    printed = capsys.readouterr().out
    a2v_line = next(line for line in printed.splitlines() if line.strip().startswith("a2v"))
    assert a2v_line.split()[1] == f"{parameter_counts(preset('h200'))['a2v']:,}"
    assert "total" in printed and not (tmp_path / "none").exists()


def test_a_written_checkpoint_loads_the_smoke_models_weights(tiny_folder: Path) -> None:
    """With the default seed, the files hold exactly the built-in smoke-test model."""
    loaded, smoke = Weights.open(tiny_folder), Weights(TINY, seed=SMOKE_SEED)
    for name in MODEL_NAMES:
        assert _same_weights(loaded.build(name), smoke.build(name)), name


def test_a_shape_mismatch_names_the_file_the_key_and_both_shapes(tiny_folder: Path) -> None:
    config = json.loads((tiny_folder / "config.json").read_text())
    config["a2v"]["dim"] = 96
    (tiny_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as error:
        Weights.open(tiny_folder).build("a2v")
    message = str(error.value)
    assert "a2v.safetensors" in message
    assert "key 'embed.weight' has shape (64, 16) in the file, the model expects (96, 16)" in message


def test_missing_and_unexpected_keys_are_named(tiny_folder: Path) -> None:
    weights = Weights.open(tiny_folder)
    state = weights.checkpoint.tensors("sr.safetensors")  # type: ignore[union-attr]
    state["extra.weight"] = state.pop("head.bias")
    from gpu_worker.models.dit.checkpoint import load_state
    from gpu_worker.models.dit.sr import SuperResolutionDiT

    with pytest.raises(
        CheckpointError, match=r"missing key 'head.bias' \(model shape \(16,\)\).*unexpected key 'extra.weight'"
    ):
        load_state(SuperResolutionDiT(TINY), state, "x/sr.safetensors")


def test_a_missing_file_or_folder_is_named(tiny_folder: Path, tmp_path: Path) -> None:
    (tiny_folder / "vae_decoder.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"has no vae_decoder\.safetensors"):
        Weights.open(tiny_folder).build("vae_decoder")
    with pytest.raises(CheckpointError, match="does not exist"):
        Weights.open(tmp_path / "nowhere")


def test_an_unknown_config_key_is_refused(tiny_folder: Path) -> None:
    config = json.loads((tiny_folder / "config.json").read_text())
    config["sr"]["windows"] = 3
    (tiny_folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"unknown keys \['windows'\]"):
        Weights.open(tiny_folder)


def test_weights_load_through_an_object_store(tiny_folder: Path, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "bucket")
    for path in tiny_folder.iterdir():
        store.put_file(f"weights/tiny/{path.name}", path)
    weights = Weights.open(Checkpoint(store=store, prefix="weights/tiny"))
    assert _same_weights(weights.build("sr"), Weights.open(tiny_folder).build("sr"))


def test_weights_load_from_an_s3_url(tiny_folder: Path, s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """MONOLOGUE_DIT_WEIGHTS=s3://bucket/prefix, credentials and endpoint from boto3's environment."""
    client = s3_server.client()
    client.create_bucket(Bucket="dit-weights")
    store = S3Store(bucket="dit-weights", prefix="tiny", client=client)
    for path in tiny_folder.iterdir():
        store.put_file(f"v1/{path.name}", path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_server.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", s3_server.region)
    monkeypatch.setenv(WEIGHTS_ENV, "s3://dit-weights/tiny/v1")
    weights = default_weights()
    assert weights.describe() == "s3://dit-weights/tiny/v1"
    assert _same_weights(weights.build("a2v"), Weights.open(tiny_folder).build("a2v"))


def test_without_the_environment_variable_the_family_uses_the_seeded_tiny_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(WEIGHTS_ENV, raising=False)
    weights = default_weights()
    assert (weights.config, weights.checkpoint, weights.seed) == (TINY, None, SMOKE_SEED)


def test_h200_preset_sizes() -> None:
    config = preset("h200")
    counts = parameter_counts(config)
    assert 300e6 < counts["a2v"] < 2e9
    assert config.a2v.dim % 128 == 0 and config.a2v.dim // config.a2v.heads == 128
    assert config.sr.dim % 128 == 0 and config.sr.dim // config.sr.heads == 128
    assert config.sr.block_size == 128
