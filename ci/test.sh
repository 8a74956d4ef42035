#!/usr/bin/env bash
# The README's test command: install everything the tests need, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export MLFLOW_DISABLE_TELEMETRY=true
# Caches (deployed model, trunk features) go to a throwaway folder so a run proves a clean start.
export BENCH_CACHE_DIR="${BENCH_CACHE_DIR:-$(mktemp -d)}"
# The wheel, installed alone into a fresh venv, must list its methods and finish a reduced run.
[ "${BENCH_SKIP_WHEEL_SMOKE:-0}" = 1 ] || bash ci/wheel-smoke.sh
.venv/bin/python -m pytest -q "$@"
