"""Tuning trials are results of their own kind: scored on the validation split to pick settings, never a test
board. A folder that holds only them (what ``bench tune`` leaves in a fresh results folder, or its
``tuning/`` folder itself) is refused by the leaderboard in one paragraph naming it; among other results they
are left out, said once. A tuned entry beside the results is read as one, never warned as a corrupt result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import support
from results_factory import joint_run, two_session_run
from support import invoke

from bench_stability_gap.harness.results.schema import save_result

TUNED = {"protocol": "hand", "protocol_hash": "h" * 16, "tuning_hash": "t" * 16, "method": "vanilla",
         "settings": {"lr": 0.001}, "trials": 2, "objective": "CK_delta", "direction": "minimize", "value": 0.1,
         "best_trial": 0, "best_run": "r1", "validation": {"per_class": 5}, "seed": 0, "study": "s",
         "storage": "sqlite:///x.db"}


def _unstamped(path: Path) -> Path:
    """The file as bench wrote trials before they were stamped: no ``scored_on`` in its protocol stamp."""
    data = json.loads(path.read_text())
    data["protocol"].pop("scored_on", None)
    path.write_text(json.dumps(data))
    return path


def tuned_folder(root: Path) -> Path:
    """What ``bench tune`` leaves in a fresh results folder: its trials (a joint reference and two runs) under
    tuning/runs, written before trials were stamped, and the tuned entry under tuned/."""
    for r in (joint_run("j1"), two_session_run("r1"), two_session_run("r2", "vanilla", 0, lift=0.1)):
        r = r.model_copy(update={"overrides": {"lr": 0.001}} if r.run_id == "r2" else {})
        _unstamped(save_result(root / "tuning", r))
    entry = root / "tuned" / "hand" / "vanilla.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps(TUNED))
    return root


@pytest.mark.parametrize("where", ["results folder", "its tuning folder"])
def test_a_folder_of_only_tuning_trials_is_refused_as_a_board(tmp_path, where) -> None:
    root = tuned_folder(tmp_path / "r")
    given = root if where == "results folder" else root / "tuning"
    out = invoke("leaderboard", "table", "--results-dir", str(given))
    support.refused(out, str(given), "validation split", "bench tune", lines=1)
    assert "corrupt" not in out.output and "| vanilla" not in out.output
    site = tmp_path / "site"
    out = invoke("leaderboard", "build", "--results-dir", str(given), "--out", str(site))
    support.refused(out, str(given), "validation split", lines=1)
    assert not site.exists()


def test_a_trial_is_known_by_its_stamp_wherever_its_file_lies(tmp_path) -> None:
    trial = two_session_run("r1")
    trial = trial.model_copy(update={"protocol": trial.protocol.model_copy(update={"scored_on": "validation"})})
    path = save_result(tmp_path / "made", trial)
    assert json.loads(path.read_text())["protocol"]["scored_on"] == "validation"
    flat = tmp_path / "copied"
    flat.mkdir()
    shutil.copy(path, flat / "trial.json")
    out = invoke("leaderboard", "table", "--results-dir", str(flat))
    support.refused(out, str(flat), "validation split", lines=1)


def test_a_tuned_entry_is_read_as_one_and_trials_beside_test_runs_are_left_out(tmp_path) -> None:
    root = tuned_folder(tmp_path / "r")
    # test runs copied in flat (no runs/ folder), so the whole folder is read, tuned/ and tuning/ included
    for r in (joint_run("tj"), two_session_run("t1")):
        shutil.copy(save_result(tmp_path / "made", r), root / f"{r.run_id}.json")
    out = invoke("leaderboard", "table", "--results-dir", str(root))
    assert out.exit_code == 0, out.output
    assert "corrupt" not in out.output
    warnings = [line for line in out.output.splitlines() if line.startswith("warning")]
    assert len(warnings) == 1 and "3 tuning trial(s)" in warnings[0] and "validation split" in warnings[0], warnings
    assert "lr=0.001" not in out.output  # the trial with its own settings is no row


def test_a_tuned_entry_that_is_not_valid_is_named_as_a_tuned_entry(tmp_path) -> None:
    root = tmp_path / "r"
    shutil.copy(save_result(tmp_path / "made", two_session_run("t1")), root.mkdir() or root / "t1.json")
    entry = root / "tuned" / "hand" / "vanilla.json"
    entry.parent.mkdir(parents=True)
    entry.write_text(json.dumps({**TUNED, "trials": 0}))
    out = invoke("leaderboard", "table", "--results-dir", str(root))
    assert out.exit_code == 0, out.output
    assert f"skipped {entry}: not a valid tuned entry" in out.output and "corrupt" not in out.output, out.output


def test_the_python_api_refuses_a_folder_of_only_tuning_trials_too(tmp_path) -> None:
    from bench_stability_gap.harness import api
    from bench_stability_gap.harness.errors import BenchError

    root = tuned_folder(tmp_path / "r")
    for read in (api.table, api.load_results):
        with pytest.raises(BenchError, match="holds only tuning trials"):
            read(root)


def test_validate_still_checks_a_trials_metrics_against_the_trials_beside_it(tmp_path) -> None:
    """Left out of every board, a trial is still re-checked by bench validate against the references it lies
    beside (the trials folder's own joint run)."""
    from bench_stability_gap.harness.results import metrics as M

    root = tmp_path / "r" / "tuning"
    joint, run = (r.model_copy(update={"protocol": r.protocol.model_copy(update={"scored_on": "validation"})})
                  for r in (joint_run(), two_session_run()))
    run.metrics = M.compute_metrics(run.curves, joint.reference, {2: 0.7, 3: 0.9})
    save_result(root, joint)
    target = save_result(root, run.model_copy(update={"metrics": run.metrics.model_copy(update={"CK_delta": -0.5})}))
    support.refused(invoke("validate", str(target)), "metrics.CK_delta is stored as -0.5", "curves and references give")
