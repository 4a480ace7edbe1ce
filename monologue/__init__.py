"""Monologue's shared package: settings, logging, storage, database models and the data contracts
that cross Temporal. Everything here is importable by every process; nothing here imports torch."""

__version__ = "0.1.0"
