#!/usr/bin/env bash
# The wheels the lent GPU image lacks, for its Python (3.12, x86-64), into .whl/ (git-ignored):
#
#   bash infra/wheelhouse.sh          # here, where PyPI is reachable
#
# infra/gpu_check.sh installs whatever .whl/ holds (pip --no-index --no-deps --target, put on PYTHONPATH); the device
# call names .whl in `carry` (it counts towards the 64 MiB a call may send: these are about 7 MB). The image has
# torch, transformers, tokenizers, huggingface-hub, safetensors, accelerate, regex, requests, Pillow and pytest
# (/work/.library/device/KINDS.md, listed in infra/gpu_image_packages.txt); of what the infinitetalk family needs it
# lacks the packages infra/wheelhouse.txt names (the versions infra/constraints.txt pins).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$(command -v python3 || command -v python)}
version() { grep -i "^$1==" infra/constraints.txt | head -n 1 | cut -d= -f3; }
mkdir -p .whl
wanted=()
while read -r name; do wanted+=("$name==$(version "$name")"); done < <(grep -v '^#' infra/wheelhouse.txt)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "${wanted[@]}"
ls -la .whl
