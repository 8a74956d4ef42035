"""ci/compare_result_jsons.py, the check behind every "same numbers" claim: it pairs each stored run of two
results folders (seed by seed) and fails on any difference that is not a run's name or time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench_stability_gap.harness.results.schema import load_result, save_result

SCRIPT = Path(__file__).parents[1] / "ci" / "compare_result_jsons.py"
FIXTURES = Path(__file__).parent / "browser" / "fixtures"


def compare(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=60)


def folder(root: Path) -> Path:
    for path in sorted(FIXTURES.glob("vanilla-seed*.json")):
        save_result(root, load_result(path))
    return root


def test_every_seed_of_a_folder_is_compared_and_a_difference_in_any_fails(tmp_path: Path) -> None:
    """Runs were paired by their folder alone: of two seeds of one method, only the last file was compared,
    so a difference in seed 0 passed as 'same numbers'."""
    before, after = folder(tmp_path / "before"), folder(tmp_path / "after")
    same = compare(before, after)
    assert same.returncode == 0 and "2 runs compared, 0 differences" in same.stdout, same.stdout
    (seed0,) = [p for p in after.rglob("*.json") if json.loads(p.read_text())["seed"] == 0]
    data = json.loads(seed0.read_text())
    data["curves"][0]["old"][1] += 1e-9
    seed0.write_text(json.dumps(data))
    changed = compare(before, after)
    assert changed.returncode == 1 and "seed 0" in changed.stdout and ".curves[0].old[1]" in changed.stdout, changed.stdout
    (first,) = [p for p in before.rglob("*.json") if json.loads(p.read_text())["seed"] == 0]
    files = compare(first, seed0)  # two files compare directly
    assert files.returncode == 1 and ".curves[0].old[1]" in files.stdout, files.stdout


def test_help_and_a_wrong_call_say_how_to_use_it(tmp_path: Path) -> None:
    assert compare("--help").returncode == 0 and "Usage" in compare("--help").stdout
    wrong = compare(tmp_path)
    assert wrong.returncode == 2 and "Usage" in wrong.stdout
