"""The GPU worker's tests on a bare GPU machine (torch, numpy, Pillow; no service stack).

`python -m pytest tests/gpu_worker -m gpu` must collect there. Where a service package is missing, a test
module that needs one (PyAV for the fMP4 reader, boto3 for the publisher, ...) is left out of collection
instead of failing it, and the terminal summary names it. Where everything is installed nothing changes.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import SERVICE_PACKAGES

_LEFT_OUT: list[str] = []


def _service_stack_missing() -> bool:
    return any(importlib.util.find_spec(name) is None for name in sorted(SERVICE_PACKAGES))


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if not _service_stack_missing():
        return None
    module = ".".join(collection_path.relative_to(config.rootpath).with_suffix("").parts)
    try:
        importlib.import_module(module)
    except pytest.skip.Exception:  # the module skips itself (a package it needs is missing): collected, it says why
        return None
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] in SERVICE_PACKAGES:
            _LEFT_OUT.append(f"{module} (needs {missing.name})")
            return True
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT_OUT:
        terminalreporter.write_line("not collected here (the service stack is missing): " + ", ".join(_LEFT_OUT))
