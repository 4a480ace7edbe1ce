#!/usr/bin/env bash
# Set up, start the embedded stack and render the bundled sample. Extra arguments go to `monologue demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
exec monologue demo "$@"
