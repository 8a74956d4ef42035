#!/usr/bin/env bash
# The README's test command: install everything the tests need, then run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
export MLFLOW_DISABLE_TELEMETRY=true
# Caches (deployed model, trunk features) go to a throwaway folder so a run proves a clean start.
export BENCH_CACHE_DIR="${BENCH_CACHE_DIR:-$(mktemp -d)}"
.venv/bin/python -m pytest -q "$@"
