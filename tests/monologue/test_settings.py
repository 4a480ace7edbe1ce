from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from monologue.settings import Settings, describe_settings, to_env


def test_defaults_put_all_state_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MONOLOGUE_HOME", str(tmp_path))
    settings = Settings()
    assert settings.db_url == f"sqlite:///{tmp_path / 'monologue.db'}"
    assert settings.storage.root == tmp_path / "objects"
    assert settings.temporal.ui_url == "http://127.0.0.1:8233"


def test_nested_environment_variables_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONOLOGUE_STORAGE__BACKEND", "s3")
    monkeypatch.setenv("MONOLOGUE_STORAGE__BUCKET", "videos")
    monkeypatch.setenv("MONOLOGUE_NODE__CAPACITY", "3")
    monkeypatch.setenv("MONOLOGUE_DATABASE_URL", "postgresql+psycopg://u@h/db")
    settings = Settings()
    assert (settings.storage.backend, settings.storage.bucket) == ("s3", "videos")
    assert settings.node.capacity == 3
    assert settings.db_url == "postgresql+psycopg://u@h/db"


def test_s3_without_bucket_is_refused_with_the_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONOLOGUE_STORAGE__BACKEND", "s3")
    with pytest.raises(ValidationError, match="MONOLOGUE_STORAGE__BUCKET"):
        Settings()


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MONOLOGUE_NODE__CAPACITY", "0")
    with pytest.raises(ValidationError, match="capacity"):
        Settings()


def test_unknown_top_level_setting_is_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(colour="blue")  # type: ignore[call-arg]


def test_to_env_rebuilds_the_same_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = Settings(home=tmp_path, log_level="debug")
    for key, value in to_env(original).items():
        monkeypatch.setenv(key, value)
    assert Settings() == original


def test_help_lists_every_setting() -> None:
    text = describe_settings()
    for name in (
        "MONOLOGUE_HOME",
        "MONOLOGUE_DATABASE_URL",
        "MONOLOGUE_STORAGE__BACKEND",
        "MONOLOGUE_TEMPORAL__ADDRESS",
        "MONOLOGUE_NODE__CAPACITY",
        "MONOLOGUE_LIMITS__MAX_UPLOAD_BYTES",
    ):
        assert name in text
