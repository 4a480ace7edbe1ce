#!/usr/bin/env bash
# Regenerate infra/constraints.txt: the newest versions pyproject.toml allows, resolved in a fresh venv.
# Run after changing a dependency in pyproject.toml; review the diff (it is what CI will install).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[dev]"
{
  echo "# Exact versions CI and infra/setup.sh install (pip's -c): regenerate with infra/lock.sh after changing pyproject.toml."
  echo "# torch is pinned in infra/setup.sh (the CPU build)."
  "$venv/bin/python" -m pip freeze --exclude-editable | grep -v -i '^torch=='
} > infra/constraints.txt
echo "wrote infra/constraints.txt ($(grep -vc '^#' infra/constraints.txt) packages)"
