#!/usr/bin/env bash
# The README's test command: install everything the tests need, lint and type-check (ci/lint.sh), then run
# the whole suite, both tiers (the tests marked `slow` and the rest). Arguments go to pytest, e.g.
# `bash ci/test.sh -m "not slow"` for the fast tier alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
# Lint and type check first: a finding fails CI before the suite's minutes are spent.
bash ci/lint.sh
export MLFLOW_DISABLE_TELEMETRY=true
# Caches (deployed model, trunk features) go to a throwaway folder so a run proves a clean start.
export BENCH_CACHE_DIR="${BENCH_CACHE_DIR:-$(mktemp -d)}"
# One pytest session over both tiers (the wheel smoke test, ci/wheel-smoke.sh, is one of the slow tests),
# spread by pytest-xdist over one worker per core (at most 4, so a big machine does not run dozens of joint
# trainings at once). The suite is bound by its CPU: on a quiet 2-core machine 2 workers took 818 s (23.6
# CPU-minutes) where 3 took 904 s, each extra worker collecting every test module and importing torch, and
# contending for the cores. The workers share one cache (deployed models, trunk features, decoded datasets)
# and the joint reference the tests copy, each built once under a file lock by the first worker that needs it
# (tests/conftest.py); each keeps its own temporary folders; the tests sharing a Ray cluster run on one worker
# (`xdist_group`). Under workers the slow tier is handed out first, so its long tests do not queue behind one
# another at the end.
workers=${BENCH_TEST_WORKERS:-$(nproc)}
[ "$workers" -gt 4 ] && workers=4
args=("$@")
[ $# -gt 0 ] || args=(--durations=15)  # the whole suite: and which tests took the time
# The same code takes twice as long in a shared machine's slow hours: a fixed piece of work timed before and
# after (ci/speed_probe.py) turns the suite's seconds into a ratio that two runs can compare.
# (The line goes to stderr by `>&2`: `tee /dev/stderr` would reopen, and so empty, a log file stderr is sent to.)
probe() { local line; line=$(.venv/bin/python ci/speed_probe.py); echo "$line" >&2; sed -E 's/^speed probe: ([0-9.]+) s.*/\1/' <<< "$line"; }
before=$(probe)
start=$SECONDS
.venv/bin/python -m pytest -q -n "$workers" --dist loadgroup "${args[@]}"
took=$((SECONDS - start))
after=$(probe)
echo "==> tests: $took s wall clock on $workers worker(s), on this machine's load:" \
     "$(awk -v t="$took" -v a="$before" -v b="$after" 'BEGIN { printf "%.0f", 2 * t / (a + b) }') times the speed probe"
