"""Every size is bounded before compute: a grid is counted, never built, and refused above its limit
(repeats collapsed); a FLOP budget and its eval schedule are bounded as ``updates`` is; an integer of
any length is refused as a value, with its place, never as a traceback."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
import yaml

from bench_stability_gap.harness.sweep.plan import MAX_GRID_RUNS, SweepGrid
from support import invoke as bench, refused

HUGE = "1" + "0" * 5000  # past Python's 4,300-digit int conversion limit

one_paragraph = partial(refused, lines=2, chars=1200)  # echoed values are cut


def sweep_file(tmp_path: Path, values: int, keys: int) -> Path:
    path = tmp_path / "sweep.yaml"
    grid = {"protocol": "tiny_cil", "methods": ["vanilla"],
            "set": {f"k{i}": list(range(values)) for i in range(keys)}}
    path.write_text(yaml.safe_dump({"name": "big", "seeds": [0], "grid": [grid]}))
    return path


@pytest.mark.parametrize("values,keys,size", [(10, 6, "1,000,000"), (1000, 4, "1,000,000,000,000")])
def test_a_grid_too_large_is_refused_at_once_without_being_built(tmp_path, values, keys, size):
    started = time.perf_counter()
    out = bench("sweep", str(sweep_file(tmp_path, values, keys)), "--dry-run", "--results-dir", str(tmp_path / "r"))
    one_paragraph(out, f"the grid holds {size} combinations", f"{MAX_GRID_RUNS:,}")
    assert time.perf_counter() - started < 30
    assert not (tmp_path / "r").exists()


def test_repeated_grid_values_plan_each_run_once():
    grid = SweepGrid(protocol="tiny_cil", methods=["vanilla", "vanilla", "lwf"],
                     set={"lr": [0.1, 0.1, 0.2, 0.1], "augment": [True, 1, True]})
    assert grid.methods == ["vanilla", "lwf"] and grid.set == {"lr": [0.1, 0.2], "augment": [True, 1]}
    assert len(grid.groups()) == 4


def flops_protocol(tmp_path: Path, training: dict | None = None, tflops_eval: dict | None = None) -> Path:
    spec = {"extends": "tiny_cil_flops", "name": "bounded"}
    if training:
        spec["training"] = training
    if tflops_eval:
        spec["eval"] = {"tflops": tflops_eval}
    path = tmp_path / "bounded.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize("training,tflops_eval,words", [
    ({"budget": {"tflops": 1e300}}, None, "training.budget.tflops"),
    ({"budget": {"tflops": 1e6}}, None, "training.budget.tflops"),
    ({"budget": {"tflops": 5e4}}, {"every": 10.0, "dense_every": None, "dense_until": 0}, "more than the 10,000,000"),
    (None, {"every": 1e-300}, "eval points"),
    (None, {"every": 0.04, "dense_every": 1e-12, "dense_until": 0.04}, "eval points"),
])
def test_flop_budgets_and_eval_steps_are_bounded_at_validation(tmp_path, training, tflops_eval, words):
    path = flops_protocol(tmp_path, training, tflops_eval)
    one_paragraph(bench("validate", "--build", str(path)), words)
    out = bench("run", "-p", str(path), "-m", "vanilla", "--no-mlflow", "--results-dir", str(tmp_path / "r"))
    one_paragraph(out, words)
    assert not [p for p in (tmp_path / "r").rglob("*") if p.is_file()]  # refused before anything was written


def test_validation_projects_the_updates_a_budget_buys():
    out = bench("validate", "--build", str(Path(__file__).parents[1] / "protocols" / "tiny_cil_flops.yaml"))
    assert out.exit_code == 0, out.output
    assert "training.budget.tflops 0.2173 buys at most" in out.output and "updates a session" in out.output


def test_a_budget_scale_of_any_length_is_refused(tmp_path):
    for factor in ("1" + "0" * 400, "1000000", "0"):
        out = bench("run", "-p", f"tiny_cil_flops@{factor}x", "--no-mlflow", "--results-dir", str(tmp_path / "r"))
        one_paragraph(out, "NAME@Kx scales")
    assert not (tmp_path / "r").exists()


def test_integers_of_any_length_are_refused_as_values(tmp_path):
    results = str(tmp_path / "r")
    out = bench("run", "-p", "tiny_cil", "-m", "vanilla", "--set", f"lr={HUGE}", "--no-mlflow", "--results-dir", results)
    one_paragraph(out, "an integer of 5,001 digits")
    protocol = tmp_path / "p.yaml"
    protocol.write_text(f"extends: tiny_cil\nname: huge\nsessions: {HUGE}\n")
    one_paragraph(bench("validate", str(protocol)), "an integer of 5,001 digits", "line 3")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(f"name: s\nseeds: [{HUGE}]\nruns: [{{protocol: tiny_cil, methods: [vanilla]}}]\n")
    one_paragraph(bench("sweep", str(sweep), "--dry-run", "--results-dir", results), "an integer of 5,001 digits")
    protocol.write_text(yaml.safe_dump({**yaml.safe_load("extends: tiny_cil\nname: tunable\n"),
                                        "validation": {"per_class": 5}, "tuning": {"trials": 2, "objective": "CK_delta"}}))
    space = tmp_path / "space.yaml"
    space.write_text(f"lr: {{low: 1, high: {HUGE}}}\n")
    one_paragraph(bench("tune", str(protocol), "vanilla", "--space", str(space), "--results-dir", results),
                  "an integer of 5,001 digits")
    assert not Path(results).exists()


def test_paths_that_are_not_files_are_named_as_what_they_are(tmp_path):
    """A device or a folder where a file is expected is named as what it is, not "does not exist"."""
    results = str(tmp_path / "r")
    weights = tmp_path / "w.yaml"
    for target, kind in (("/dev/zero", "a character device"), (str(tmp_path), "is a folder")):
        weights.write_text(yaml.safe_dump({"extends": "tiny_cil", "name": "w",
                                           "backbone": {"weights": f"file:{target}"}}))
        one_paragraph(bench("validate", str(weights)), kind, target)
        sweep = tmp_path / "s.yaml"
        sweep.write_text(yaml.safe_dump({"name": "s", "seeds": [0],
                                         "runs": [{"protocol": target + ("/" if target == str(tmp_path) else ""),
                                                   "methods": ["vanilla"]}]}))
        one_paragraph(bench("sweep", str(sweep), "--dry-run", "--results-dir", results), kind)
        extends = tmp_path / "e.yaml"
        extends.write_text(yaml.safe_dump({"extends": "link.yaml", "name": "e"}))  # a link to the device or folder
        link = tmp_path / "link.yaml"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        one_paragraph(bench("validate", str(extends)), kind)
        one_paragraph(bench("tune", "tiny_cil", "vanilla", "--space", target, "--results-dir", results), kind)
    assert not Path(results).exists()
