"""Commands that need no compute answer without importing torch: importing it (and timm, MLflow) is what
makes a catalogue, a valid file or a refusal cost half a minute on a loaded machine. No wall-clock bound
here (shared machines make one flaky): ci/answer_times.py times them against ``bench --version``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench_stability_gap.harness.spec.protocol import load_protocol


def _bench(args: list[str], cwd: Path) -> tuple[int, str, bool]:
    """``bench ARGS`` in a fresh interpreter: (exit code, stdout + stderr, whether torch got imported)."""
    code = ("import sys\nfrom bench_stability_gap.harness.cli import main\n"
            f"try:\n    main({args!r})\nexcept SystemExit as stop:\n    code = stop.code or 0\n"
            "print('TORCH', 'torch' in sys.modules, code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)
    last = out.stdout.strip().splitlines()[-1].split()
    return int(last[2]), out.stdout + out.stderr, last[1] == "True"


def test_ls_methods_reads_the_catalogue_without_importing_any_method(tmp_path) -> None:
    code, text, torch = _bench(["ls", "methods"], tmp_path)
    assert code == 0 and not torch, text
    assert "vanilla" in text and "Rehearsal: half of each batch" in text and "sgm" in text


def test_validate_checks_a_valid_file_without_building_the_network(tmp_path) -> None:
    spec = tmp_path / "p.yaml"
    spec.write_text(_tiny_yaml())
    code, text, torch = _bench(["validate", str(spec)], tmp_path)
    assert code == 0 and not torch and "OK: protocol" in text and "--build" in text, text


def test_check_method_refuses_a_bad_setting_before_importing_torch(tmp_path) -> None:
    code, text, torch = _bench(["check-method", "vanilla", "--set", "lr=" + "9" * 5000], tmp_path)
    assert code == 2 and not torch and "lr" in text, text


def _tiny_yaml() -> str:
    import yaml

    return yaml.safe_dump(load_protocol("tiny_cil").model_dump(mode="json"), sort_keys=False)


def test_each_summary_read_from_source_is_the_class_attribute() -> None:
    from bench_stability_gap.methods.registry import METHOD_GROUP, MODIFIER_GROUP, entries, summary

    for group in (METHOD_GROUP, MODIFIER_GROUP):
        for entry in entries(group).values():
            assert summary(entry) == entry.load().summary, entry.name
