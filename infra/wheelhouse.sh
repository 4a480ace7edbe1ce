#!/usr/bin/env bash
# The wheels the lent GPU image lacks, for its Python (3.12, x86-64), into .whl/ (git-ignored):
#
#   bash infra/wheelhouse.sh          # here, where PyPI is reachable
#
# infra/gpu_check.sh installs whatever .whl/ holds (pip --no-index --no-deps --target, put on PYTHONPATH); the device
# call names .whl in `carry` (it counts towards the 64 MiB a call may send: these are about 4 MB). The image has
# torch, transformers, tokenizers, huggingface-hub, safetensors, accelerate, regex, requests, Pillow and pytest
# (/work/.library/device/KINDS.md); of what the infinitetalk family needs it lacks diffusers (the version
# infra/constraints.txt pins) and diffusers' importlib-metadata.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$(command -v python3 || command -v python)}
version() { grep -i "^$1==" infra/constraints.txt | head -n 1 | cut -d= -f3; }
mkdir -p .whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "diffusers==$(version diffusers)" "importlib_metadata==$(version importlib_metadata)"
ls -la .whl
