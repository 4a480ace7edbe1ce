from __future__ import annotations

import subprocess
import sys


def test_workflow_module_imports_no_heavy_libraries() -> None:
    """Workflow code runs in Temporal's sandbox on every replay: numpy, torch, PyAV or SQLAlchemy must
    not come in, not even indirectly."""
    probe = (
        "import sys, workflows.render, workflows.retention; "
        "print(sorted(m for m in ('numpy', 'torch', 'av', 'sqlalchemy', 'cv2', 'boto3') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
