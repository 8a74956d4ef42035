#!/usr/bin/env bash
# The lint and type check CI runs (ci/test.sh calls this before the tests): ruff over harness/, methods/
# and leaderboard/ (rules and line length in pyproject.toml, [tool.ruff]), then mypy over the same three
# packages ([tool.mypy]). Exit status non-zero when either finds anything.
#   bash ci/lint.sh            # both; needs the `lint` extra (ci/install.sh installs it)
set -uo pipefail
cd "$(dirname "$0")/.."
status=0
echo "==> ruff check harness methods leaderboard"
.venv/bin/ruff check harness methods leaderboard || status=1

# mypy checks the package as it is imported: the folders install as bench_stability_gap.harness, .methods,
# .leaderboard (and .protocols), and harness/ reaches methods/ and leaderboard/ by relative imports
# (`from ..methods.registry import ...`), which mypy resolves only under that name. The editable install
# maps the names with an import hook mypy cannot follow, so a bench_stability_gap/ of links to the folders
# stands in for it, kept beside mypy's cache (same paths each run, so the cache stays valid); the messages
# name the repository's own paths.
shadow=.mypy_cache/package
mkdir -p "$shadow/bench_stability_gap"
for folder in harness methods leaderboard protocols; do ln -sfn "$PWD/$folder" "$shadow/bench_stability_gap/$folder"; done
echo "==> mypy -p bench_stability_gap.harness -p bench_stability_gap.methods -p bench_stability_gap.leaderboard"
MYPYPATH="$shadow" .venv/bin/mypy --namespace-packages --explicit-package-bases \
    -p bench_stability_gap.harness -p bench_stability_gap.methods -p bench_stability_gap.leaderboard \
    2>&1 | sed "s#\\($PWD/\\)\\?$shadow/bench_stability_gap/##g"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit $status
