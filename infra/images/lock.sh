#!/usr/bin/env bash
# Regenerate the image locks infra/images/requirements-{api,node,gpu}.txt: every package of the image's extra
# (pyproject.toml) at the version CI tested (infra/constraints.txt, made by infra/lock.sh: run that first), with
# its hashes, for Linux x86_64 and Python 3.11 (the images' python:3.11-slim base). Resolved by uv from PyPI in
# a throwaway venv; review the diff.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "uv==0.13.8"
# The lock's versions, and torch at the version infra/setup.sh installs (the lock leaves torch out).
{ cat infra/constraints.txt; echo "torch==2.13.0"; } > "$venv/constraints.txt"
compile() {  # compile EXTRA [uv options...]
  local extra=$1
  shift
  "$venv/bin/uv" pip compile pyproject.toml --quiet --extra "$extra" --constraint "$venv/constraints.txt" \
    --python-version 3.11 --python-platform x86_64-manylinux_2_28 --generate-hashes \
    --index-url https://pypi.org/simple --custom-compile-command "bash infra/images/lock.sh" \
    --no-emit-package monologue "$@" -o "infra/images/requirements-$extra.txt"
}
compile api
compile gpu  # torch from PyPI: the CUDA build, with its nvidia-* and triton runtime wheels
# The CPU node installs torch's CPU build from PyTorch's own index (node.Dockerfile): none of the CUDA wheels.
# (nvidia-ml-py is not one: NVML's Python binding, which a CPU node imports and finds no GPU with.)
cuda_only=$(grep -oE '^(nvidia-[a-z0-9-]+|triton|cuda-[a-z0-9-]+)==' infra/images/requirements-gpu.txt | tr -d '=' |
  grep -vx nvidia-ml-py)
# shellcheck disable=SC2046
compile node --no-emit-package torch $(printf -- '--no-emit-package %s ' $cuda_only)
for extra in api node gpu; do echo "infra/images/requirements-$extra.txt: $(grep -c '==' "infra/images/requirements-$extra.txt") packages"; done
