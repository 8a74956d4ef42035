"""``bench run --save-predictions``: the per-sample predictions behind each eval point's accuracies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.run.predictions import load_predictions
from bench_stability_gap.harness.results.schema import load_result


@pytest.mark.slow  # a whole CLI run that trains the joint models on the way (it checks they leave no npz)
def test_save_predictions_writes_an_npz_that_reproduces_the_curves(tiny_protocol_file: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    base = ["run", "-p", str(tiny_protocol_file), "-m", "vanilla", "--results-dir", str(results), "--no-mlflow",
            "--no-progress", "--device", "cpu"]
    out = CliRunner().invoke(main, base + ["--save-predictions"])
    assert out.exit_code == 0, out.output
    (result_json,) = [
        p for p in (results / "runs").rglob("*.json") if "/vanilla/" in str(p)]
    npz = result_json.with_name(result_json.stem + ".predictions.npz")
    assert npz.exists() and str(npz) in out.output
    result = load_result(result_json)
    points = load_predictions(npz)
    assert [(p["session"], p["update"]) for p in points] == [(c.session, u) for c in result.curves for u in c.updates]
    # each point's all-class accuracy, recomputed from its predictions, is the stored curve value
    for p in points:
        curve = next(c for c in result.curves if c.session == p["session"])
        stored = curve.all[curve.updates.index(p["update"])]
        assert np.mean(p["predicted"] == p["label"]) == stored
    assert not np.load(npz)["missing"].size
    # off by default: the reference runs trained on the way (joint) and a plain run leave none
    assert len(list(results.rglob("*.predictions.npz"))) == 1
