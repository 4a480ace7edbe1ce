"""Fixtures for the dit family's tests."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture
def speech() -> np.ndarray:
    """Four seconds of speech-like audio: a gliding harmonic tone with a syllable-rate envelope."""
    rate, seconds = 16_000, 4.0
    time = np.arange(int(rate * seconds)) / rate
    pitch = 140.0 + 30.0 * np.sin(2 * np.pi * 0.7 * time)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(harmonic * phase) / harmonic for harmonic in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4.0 * time)) ** 2
    return (0.1 * envelope * voice).astype(np.float32)
