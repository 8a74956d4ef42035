#!/usr/bin/env bash
# The README's test command: install everything the tests need, then run the whole suite, both tiers
# (the fast one first, so a plain failure shows within minutes; then the tests marked `slow`).
# Arguments go to pytest, e.g. `bash ci/test.sh -m "not slow"` for the fast tier alone (one pass).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export MLFLOW_DISABLE_TELEMETRY=true
# Caches (deployed model, trunk features) go to a throwaway folder so a run proves a clean start.
export BENCH_CACHE_DIR="${BENCH_CACHE_DIR:-$(mktemp -d)}"
# The wheel, installed alone into a fresh venv, must list its methods and finish a reduced run.
[ "${BENCH_SKIP_WHEEL_SMOKE:-0}" = 1 ] || bash ci/wheel-smoke.sh
if [ $# -gt 0 ]; then
  .venv/bin/python -m pytest -q "$@"
else
  start=$SECONDS
  .venv/bin/python -m pytest -q -m "not slow"
  fast=$((SECONDS - start))
  .venv/bin/python -m pytest -q -m slow
  echo "==> fast tier ${fast} s, slow tier $((SECONDS - start - fast)) s (wall clock, on this machine's load)"
fi
