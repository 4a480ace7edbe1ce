"""Monologue's shared package: settings, logging, storage, database models and the data contracts
that cross Temporal. Everything here is importable by every process; nothing here imports torch."""

from pathlib import Path

__version__ = "0.1.0"
SAMPLES = Path(__file__).resolve().parent / "samples"  # the bundled portrait.jpg and speech.wav (package data)
