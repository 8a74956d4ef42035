#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one pass, on a lent machine whose image has PyTorch but no network.
# The project's other requirements travel as wheels in .whl and Fashion-MNIST in .devdata (both made by
# ci/gpu_bundle.sh on a machine with the project installed). Every step has its own time limit and
# writes its log under $OUT; a step that fails does not stop the next.
#   OUT=/tmp/gpu bash ci/gpu_checks.sh [STEP...]   (default: every step, in the order below)
set -u
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site MLFLOW_DISABLE_TELEMETRY=true BENCH_CACHE_DIR=/tmp/bench-cache PYTHONUNBUFFERED=1
mkdir -p /usr/share/datasets && cp -r .devdata/fashion-mnist /usr/share/datasets/
mkdir -p /tmp/bin && printf '#!/usr/bin/env python3\nimport sys\nfrom bench_stability_gap.harness.cli import entry\nentry()\n' >/tmp/bin/bench
chmod +x /tmp/bin/bench && export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch, timm, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| timm', timm.__version__, '| peft', peft.__version__, '| cpus', __import__('os').cpu_count())"

STEPS=" ${*:-pytest perf_tiny perf_paper perf_paper_synthetic run_tiny run_synthetic compare} "
# The time guard: the device tool lends 15 minutes, start-up and transfers included. Every step's limit is
# cut to what is left of BUDGET_S (default 600 s, install included), and a step with under 20 s left is skipped
# (it says so), so the results of the steps that ran always come back.
BUDGET_S=${BUDGET_S:-600}
step() {  # step NAME SECONDS command...
    local name=$1 limit=$2; shift 2
    [[ $STEPS == *" $name "* ]] || return 0
    local left=$((BUDGET_S - SECONDS))
    if ((left < 20)); then echo "== $name: skipped, ${left} s of the ${BUDGET_S} s budget left"; return 0; fi
    ((limit > left)) && limit=$left
    local t0=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s (limit $limit s)"
    grep -v -E "it/s|upd/s|batch/s|s/it" "$OUT/$name.log" | tail -n "${TAIL:-14}"
}
step pytest 110 python3 -m pytest -q -p no:cacheprovider tests/test_stage_time.py tests/test_precision.py tests/test_decode.py \
    tests/test_backbone.py tests/test_fastoptim.py tests/test_resident.py \
    tests/test_host_syncs.py::test_on_cuda_no_update_synchronises
# the rooflines are measured in the run's precision (bf16 under autocast); each stage's share beside it
step perf_tiny 70 bench perf -p tiny_cil --device cuda --repeats 3 --updates 20
step perf_paper 80 bench perf --paper -p cil_places_lt_synthetic --budget-of cil_places_lt --device cuda
# the synthetic protocol's own projection, to set beside the measured run below
step perf_paper_synthetic 45 bench perf --paper -p cil_places_lt_synthetic --device cuda
TAIL=20 step run_tiny 80 bench run -p tiny_cil -m vanilla --device cuda --no-mlflow --no-progress --results-dir "$OUT/results"
TAIL=40 step run_synthetic 230 bench run -p cil_places_lt_synthetic -m vanilla --device cuda --no-mlflow --no-progress \
    --results-dir "$OUT/results"
# each stored run's stage times (wall and GPU seconds), to set against perf_paper_synthetic's projection
TAIL=30 step compare 15 python3 ci/stage_times.py "$OUT/results"
tar czf "$OUT/results.tgz" -C "$OUT" results 2>/dev/null
rm -rf "$OUT/results"
