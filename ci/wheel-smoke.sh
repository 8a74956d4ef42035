#!/usr/bin/env bash
# Packaging smoke test: build the wheel, install it (not the checkout) into a fresh venv, and check
# that the installed package alone can list its methods and finish a reduced run. Catches package data
# missing from the wheel and imports that only work from a checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python=${PYTHON:-python3}
echo "==> wheel smoke test in $work"
# Built from a copy of the files git tracks or would track (ignored ones, such as .venv and build/, left
# out): setuptools never prunes build/lib, so a deleted module would still ship from a checkout's build/,
# and the egg-info a build writes beside the sources would shadow the installed entry points of anything
# running from the checkout meanwhile (the test suite runs this script beside other tests).
git rev-parse --is-inside-work-tree >/dev/null 2>&1 \
  || { echo "wheel smoke test: the wheel is built from the files git tracks, and $(pwd) is not a git checkout" >&2; exit 2; }
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null \
  | tar -xf - -C "$work/src"
.venv/bin/python -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w "$work/dist" \
  "$work/src" 2>&1 | grep -v "is ignored" || true
"$python" -m venv "$work/venv"
wheel=$(ls "$work"/dist/bench_stability_gap-*.whl)
# The dependencies come from ./.venv (installed by ci/install.sh under the same constraints), lent by link:
# exactly the closure the wheel declares, so an undeclared import still fails below, without unpacking
# torch and its CUDA libraries (several GB, two minutes) a second time.
.venv/bin/python ci/lend_dependencies.py "$wheel" embedded "$work/lent" animal-mnist
echo "$work/lent" > "$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/lent.pth"
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$wheel" 2>&1 | grep -v "is ignored" || true
cd "$work"  # away from the checkout, so nothing can import from it
export BENCH_CACHE_DIR="$work/cache" MLFLOW_DISABLE_TELEMETRY=true
listing=$(venv/bin/bench ls methods)  # captured first: grep -q closing the pipe early would fail pipefail
grep -q "^  vanilla " <<<"$listing" || { echo "wheel: bench ls methods lacks vanilla:" >&2; echo "$listing" >&2; exit 1; }
venv/bin/python - <<'PY'
import yaml
from bench_stability_gap.harness.spec.protocol import load_protocol
spec = load_protocol("tiny_cil").model_dump(mode="json")
spec["name"] = "tiny_cil_smoke"
# what is checked is that the installed package runs every stage, not what it learns: the least of each
spec["sessions"] = 2
spec["pretrain_data"].update(train_per_class=60, test_per_class=4)
for source in spec["stream_data"]:
    source.update(train_per_class=40, test_per_class=4)
spec["pretrain"].update(updates=20, batch_size=32)
spec["training"].update(updates=3, batch={"new": 8, "old": 8})
spec["eval"] = {"every": 3, "batch_size": 256}
spec["joint"].update(updates=8, batch_size=16)
if spec.get("validation"):  # the held-out split must stay smaller than the reduced classes
    spec["validation"]["per_class"] = 5
open("smoke.yaml", "w").write(yaml.safe_dump(spec))
PY
venv/bin/bench run -p smoke.yaml -m vanilla+sgm --no-progress --results-dir "$work/results" | tail -3
ls "$work"/results/runs/tiny_cil_smoke/vanilla__sgm/*.json >/dev/null
venv/bin/bench leaderboard build --results-dir "$work/results" --out "$work/site" | tail -1  # templates, pandas, matplotlib
[ -f "$work/site/index.html" ] || { echo "wheel: the leaderboard build wrote no index.html" >&2; exit 1; }
echo "==> wheel smoke test passed"
