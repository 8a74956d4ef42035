"""A store a command writes (an MLflow tracking store, an Optuna study database) that the user names must lie in
a folder that exists: a typo in its path is refused before any compute, naming the missing folder, instead
of creating a new, empty store that the runs then scatter into. A new database file in an existing folder is
what a user who wants a new store gives: it is announced as new, in one line, and used. The same rule holds
for run, sweep, sync and tune, as the read commands (the leaderboard) refuse a store that is not there."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import support
import yaml
from results_factory import two_session_run
from support import invoke

from bench_stability_gap.harness.results.schema import save_result

refused = partial(support.refused, lines=1)


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "results"


@pytest.fixture(autouse=True)
def no_compute(monkeypatch) -> None:
    """The backbone check is the last before compute: reaching it means every store check passed."""
    from bench_stability_gap.harness.tools import preflight

    def reached(*_args, **_kwargs):
        raise AssertionError("the store checks passed: compute would start")

    monkeypatch.setattr(preflight, "check_backbone", reached)


def test_run_refuses_a_tracking_store_in_a_folder_that_does_not_exist(results, tmp_path) -> None:
    db = tmp_path / "nonexistent_dir" / "typo.db"
    out = invoke("run", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{db}")
    refused(out, f"{tmp_path / 'nonexistent_dir'} does not exist", "nothing has run")
    assert not db.parent.exists() and not (results / "runs").exists() and not (results / "mlflow.db").exists()


def test_run_refuses_a_file_store_whose_parent_folder_does_not_exist(results, tmp_path) -> None:
    store = tmp_path / "missing" / "mlruns"
    out = invoke("run", "--results-dir", str(results), "--tracking-uri", f"file://{store}",
                 env={"MLFLOW_ALLOW_FILE_STORE": "true"})
    refused(out, f"{tmp_path / 'missing'} does not exist")
    assert not store.parent.exists()


def test_sweep_refuses_a_tracking_store_in_a_folder_that_does_not_exist(results, tmp_path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "typo", "seeds": [0],
                                     "runs": [{"protocol": "tiny_cil", "methods": ["vanilla"]}]}))
    db = tmp_path / "nonexistent_dir" / "typo.db"
    out = invoke("sweep", str(sweep), "--results-dir", str(results), "--tracking-uri", f"sqlite:///{db}")
    refused(out, f"{db.parent} does not exist")
    assert not db.parent.exists()


def test_sync_refuses_a_misspelt_folder_and_announces_a_new_file(tmp_path) -> None:
    results = tmp_path / "results"
    save_result(results, two_session_run())
    db = tmp_path / "nonexistent_dir" / "typo.db"
    out = invoke("sync", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{db}")
    refused(out, f"{db.parent} does not exist", "nothing was synced")
    assert not db.parent.exists()
    # a new file in a folder that exists: what asking for a new store looks like; said once, then used
    new = tmp_path / "team.db"
    out = invoke("sync", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{new}")
    assert out.exit_code == 0, out.output
    assert sum(f"new MLflow store {new}" in line for line in out.output.splitlines()) == 1, out.output
    assert new.is_file()
    again = invoke("sync", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{new}")
    assert again.exit_code == 0 and "new MLflow store" not in again.output, again.output


def test_tune_refuses_a_study_storage_in_a_folder_that_does_not_exist(tmp_path) -> None:
    db = tmp_path / "missing" / "dir" / "x.db"
    out = invoke("tune", "tiny_cil", "vanilla", "--trials", "1", "--results-dir", str(tmp_path / "r"),
                 "--storage", f"sqlite:///{db}")
    refused(out, f"{tmp_path / 'missing' / 'dir'} does not exist", "Nothing was written")
    assert not (tmp_path / "missing").exists() and not (tmp_path / "r").exists()


def test_a_new_store_file_in_an_existing_folder_is_announced_and_allowed(results, tmp_path, capsys) -> None:
    from bench_stability_gap.harness.sweep.study_checks import check_storage
    from bench_stability_gap.harness.tools.preflight import check_outputs

    check_outputs(results, f"sqlite:///{tmp_path / 'new.db'}", True)
    check_storage(f"sqlite:///{tmp_path / 'study.db'}", results)
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 2, said
    assert f"new MLflow store {tmp_path / 'new.db'}" in said[0]
    assert f"new study database {tmp_path / 'study.db'}" in said[1]
    # the defaults, which bench creates inside the results folder it writes anyway, are not announced
    check_outputs(tmp_path / "fresh", None, True)
    check_storage(f"sqlite:///{tmp_path / 'fresh' / 'tuning' / 'optuna.db'}", tmp_path / "fresh", given=False)
    assert capsys.readouterr().err == ""
