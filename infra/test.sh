#!/usr/bin/env bash
# Set up and run the whole test suite (this is what CI runs). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/setup.sh
bash infra/postgres.sh
# Debian packages the tests need; a test whose tool is missing fails rather than skips. Browser tests drive
# Debian's Chromium (Playwright's own browser download needs the internet); the warp seam, blink and sway
# tests synthesise 25 s of speech with espeak-ng; the metrics tests run Debian's Prometheus server and the WebRTC tests
# coturn and Janus themselves, on loopback (never their system services: policy-rc.d keeps the packages from starting them).
sudo_=""; [ "$(id -u)" -eq 0 ] || sudo_="sudo"
missing=()
for tool in chromium espeak-ng; do command -v "$tool" >/dev/null || missing+=("$tool"); done
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)  # burned-in captions' font
if [ ${#missing[@]} -gt 0 ]; then
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq "${missing[@]}" >/dev/null
fi
services=()  # packages that bring a system service: the tests run them on loopback themselves
command -v prometheus >/dev/null || services+=(prometheus)
command -v turnserver >/dev/null || services+=(coturn)  # the WebRTC tests' TURN server (cli/turn.py)
command -v janus >/dev/null || services+=(janus)  # the SFU tests' Janus (cli/janus.py)
if [ ${#services[@]} -gt 0 ]; then
  made_policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_ tee /usr/sbin/policy-rc.d >/dev/null && $sudo_ chmod +x /usr/sbin/policy-rc.d
    made_policy=1
  fi
  $sudo_ apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_ apt-get install -y -qq --no-install-recommends \
    "${services[@]}" >/dev/null
  [ -z "$made_policy" ] || $sudo_ rm -f /usr/sbin/policy-rc.d
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export MONOLOGUE_TEST_POSTGRES_URL=${MONOLOGUE_TEST_POSTGRES_URL:-postgresql+psycopg://postgres:postgres@127.0.0.1:5432/postgres}
ruff check .
mypy
# Two workers (pytest-xdist), a test file each at a time (its module fixtures started once): most of the suite's time
# is spent waiting on real time (live speech, leases, restarts), not on the CPU. MONOLOGUE_TEST_WORKERS=0: one process.
python -m pytest -n "${MONOLOGUE_TEST_WORKERS:-2}" --dist loadfile "$@"
