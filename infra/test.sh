#!/usr/bin/env bash
# Set up and run the whole test suite (this is what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
bash infra/postgres.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export MONOLOGUE_TEST_POSTGRES_URL=${MONOLOGUE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/postgres}
ruff check .
python -m pytest "$@"
