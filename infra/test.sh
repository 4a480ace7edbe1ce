#!/usr/bin/env bash
# Set up and run the whole test suite (this is what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
bash infra/postgres.sh
# Browser tests drive Debian's Chromium (Playwright's own browser download needs the internet).
if ! command -v chromium >/dev/null; then
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq chromium >/dev/null
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export MONOLOGUE_TEST_POSTGRES_URL=${MONOLOGUE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/postgres}
ruff check .
mypy
python -m pytest "$@"
