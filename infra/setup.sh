#!/usr/bin/env bash
# Create ./.venv with Monologue and everything its tests need. Safe to run again (it only tops up).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
python -m pip install -q --disable-pip-version-check --upgrade pip
# The CPU build first: an unpinned `torch` would pull a CUDA build of several GB.
python -m pip install -q --disable-pip-version-check "torch==2.13.0"
# Exact versions from the lock (infra/constraints.txt, made by infra/lock.sh): CI installs what was tested.
python -m pip install -q --disable-pip-version-check -c infra/constraints.txt -e ".[dev]"
echo "setup: $(python --version), torch $(python -c 'import torch; print(torch.__version__)'), temporal $(temporal --version | head -1)"
