#!/usr/bin/env bash
# How long a new user waits for the first number: a fresh clone of this repository (its current branch, as
# committed), `bash ci/install.sh`, then the README's first command (read from the README's quick start),
# timed stage by stage with empty caches.
#
#   bash ci/first_hour.sh [WORKDIR]        # default WORKDIR: a new temporary folder (left in place)
#
# Stages: clone, install (ci/install.sh, pip and apt), then within the first run, from the run's own
# output lines (each timestamped as it arrives): start-up until the inputs are ready, the deployed
# model's training on S1, the joint reference, the A_best reference runs, the method's own run, and
# the seconds each stored result records (wall_time_s and its train/eval split). Needs network access
# to the package registries, as the README's first command does. Not part of ci/test.sh: the machines
# are shared, so a timing is a measurement to report, not a test to pass. It takes as long as a new
# user waits (about 10 minutes on a shared 2-core machine), and the clone with its .venv about 7 GB of
# disk: delete WORKDIR afterwards.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
log="$work/first_hour.log"
stamp() { while IFS= read -r line; do printf '%(%s)T %s\n' -1 "$line"; done; }
now() { date +%s.%N; }
secs() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):8.1f} s')" "$1" "$2"; }

branch=$(git -C "$repo" rev-parse --abbrev-ref HEAD)
first=$(sed -n 's/^bash ci\/install.sh && //p' "$repo/README.md" | head -n 1)   # the README's first command
[ -n "$first" ] || { echo "no 'bash ci/install.sh && COMMAND' line in README.md" >&2; exit 2; }
echo "timing: clone of $branch ($(git -C "$repo" rev-parse --short HEAD)), ci/install.sh, then: $first"

t0=$(now)
git clone -q --branch "$branch" "$repo" "$work/clone"
t1=$(now)
echo "clone                   $(secs "$t0" "$t1")"
cd "$work/clone"
bash ci/install.sh > "$work/install.log" 2>&1
t2=$(now)
echo "install (ci/install.sh) $(secs "$t1" "$t2")   log: $work/install.log"

export BENCH_CACHE_DIR="$work/cache" MLFLOW_DISABLE_TELEMETRY=true   # empty caches: a first run
$first --no-progress 2>&1 | stamp > "$log"
t3=$(now)
echo "first bench run         $(secs "$t2" "$t3")   log: $log"
echo "total to the first gap table $(secs "$t0" "$t3")"

# the first run, stage by stage: seconds between the lines that open each stage
.venv/bin/python - "$log" "$t2" <<'EOF'
import json, re, sys
from pathlib import Path

lines = [(int(l.split(" ", 1)[0]), l.split(" ", 1)[1].rstrip()) for l in open(sys.argv[1]) if " " in l]
opens = [("data path planned, trunk features made", r"^data path"),
         ("deployed model trained on S1", r"^Training the deployed model"),
         ("joint reference(s), then the run itself", r"^No joint reference"),
         ("A_best reference runs, then the run itself", r"^A_best for P_"),
         ("summary printed, then MLflow", r"^\S+ \| \S+ \| seed \d+ \| ")]
marks = [(float(sys.argv[2]), "start-up: imports, data path")]
for name, pattern in opens:
    hit = next((t for t, text in lines if re.search(pattern, text)), None)
    if hit is not None:
        marks.append((hit, name))
end = lines[-1][0] if lines else marks[-1][0]
print("\nfirst run, by stage (from the line that opens a stage to the next; the run itself has no opening")
print("line: its own record, below, says how long it took):")
for (t, name), (t_next, _) in zip(marks, marks[1:] + [(end, "")]):
    print(f"  {name:40s} {t_next - t:7.0f} s")
print("\nstored results (their own record):")
for path in sorted(Path("bench-results/runs").rglob("*.json")):
    r = json.loads(path.read_text())
    split = ", ".join(f"{k} {v:.0f} s" for k, v in (r.get("stage_seconds") or {}).items())
    print(f"  {r['method']['spec']:14s} seed {r['seed']}  {r['wall_time_s']:7.1f} s  ({split})")
EOF
