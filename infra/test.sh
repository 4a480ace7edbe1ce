#!/usr/bin/env bash
# Set up and run the whole test suite (this is what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
bash infra/postgres.sh
# Debian packages the tests need; a test whose tool is missing fails rather than skips. Browser tests drive
# Debian's Chromium (Playwright's own browser download needs the internet); the warp seam, blink and sway
# tests synthesise 25 s of speech with espeak-ng.
missing=()
for tool in chromium espeak-ng; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export MONOLOGUE_TEST_POSTGRES_URL=${MONOLOGUE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/postgres}
ruff check .
mypy
python -m pytest "$@"
