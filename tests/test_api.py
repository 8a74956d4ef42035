"""The Python API: ``run`` returns the stored, validated result; ``load_results`` one row per run."""

from __future__ import annotations

import importlib
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.schema import ProtocolStamp, RunResult, load_result, save_result
from bench_stability_gap.harness.api import LOAD_COLUMNS, load_results, results_columns, run
from bench_stability_gap.harness.run.options import RunOptions


def test_load_results_of_an_empty_folder_is_an_empty_frame_with_the_columns(tmp_path: Path) -> None:
    frame = load_results(tmp_path)
    assert frame.empty and list(frame.columns) == results_columns()
    assert {"run_id", "method", "seed", "S_delta", "P_delta_paper", "bwt", "forgetting", *LOAD_COLUMNS} <= set(frame.columns)
    with pytest.raises(BenchError, match="does not exist"):
        load_results(tmp_path / "nowhere")


def test_a_results_folder_that_is_missing_or_a_file_is_named_so_by_the_api_and_the_cli(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from support import refused

    from bench_stability_gap.harness.api import table
    from bench_stability_gap.harness.cli import main

    (tmp_path / "a-file").write_text("")
    said = {name: f"Results folder {tmp_path / name} {what}: run `bench run ...` first"
            for name, what in (("nowhere", "does not exist"), ("a-file", "is a file, not a folder"))}
    for name, message in said.items():
        for call in (load_results, table):
            with pytest.raises(BenchError, match=re.escape(message)):
                call(tmp_path / name)
    # the CLI says the same of a missing folder (a file is refused by click's own folder check first)
    out = CliRunner().invoke(main, ["leaderboard", "table", "--results-dir", str(tmp_path / "nowhere")])
    refused(out, said["nowhere"], lines=1)


def test_load_results_one_row_per_run_and_a_corrupt_file_named(tmp_path: Path) -> None:
    for seed in (0, 1):
        save_result(tmp_path, joint_run(f"j{seed}", seed))
        save_result(tmp_path, two_session_run(f"v{seed}", "vanilla", seed))
    save_result(tmp_path, two_session_run("lonely", "lwf", 5))  # no joint run for seed 5: a row with its reason
    bad = tmp_path / "runs" / "hand" / "vanilla" / "seed9-cut.json"
    bad.write_text("{")
    with pytest.warns(UserWarning, match="seed9-cut.json"):
        frame = load_results(tmp_path)
    assert sorted(frame["run_id"]) == ["j0", "j1", "lonely", "v0", "v1"]
    rows = frame.set_index("run_id")
    assert rows.loc["v0", "reason"] == "" and rows.loc["lonely", "reason"].startswith("no joint reference for seed 5")
    # the metrics are the leaderboard's (recomputed against the references): BWT by hand for this curve:
    # R11 = 0.9 (session 2's before point), R22 = 0.7 (session 2, last point), R31 = 0.65, R32 = 0.55 (session 3, last)
    # BWT = ((0.65 - 0.9) + (0.55 - 0.7)) / 2 = -0.2 -> -20 points
    assert rows.loc["v0", "bwt"] == pytest.approx(-20.0)
    assert rows.loc["v0", "path"].endswith(".json")


def test_run_checks_settings_before_anything_trains(tiny_protocol_file: Path, tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="bogus"):
        run(str(tiny_protocol_file), "vanilla", 0, results_dir=tmp_path, mlflow=False, device="cpu", bogus=1)
    assert not (tmp_path / "runs").exists()


def test_run_returns_the_stored_result(tiny_protocol_file: Path, results_with_joint: Path) -> None:
    results = results_with_joint  # the joint reference is stored already: this run trains vanilla only
    result = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu",
                 lr=0.002)
    assert result.overrides == {"lr": 0.002} and result.config["lr"] == 0.002
    (path,) = [p for p in (results / "runs").rglob("*.json") if result.run_id in p.name]
    assert load_result(path).model_dump(mode="json") == result.model_dump(mode="json")  # what was stored
    frame = load_results(results)
    assert result.run_id in set(frame["run_id"])


def test_running_a_stored_run_again_completes_its_missing_or_unfinished_mlflow_record(
        tiny_protocol_file: Path, results_with_joint: Path, mlflow_template: Path, tmp_path: Path) -> None:
    """A run stored without MLflow (--no-mlflow, or a stop while it logged) had no complete record until
    `bench sync`; the same command again found the result, trained nothing, and left the record missing."""
    import shutil

    from mlflow.tracking import MlflowClient

    results, db = results_with_joint, tmp_path / "team" / "store.db"
    db.parent.mkdir()
    shutil.copyfile(mlflow_template, db)
    uri = f"sqlite:///{db}"
    first = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu")
    client = MlflowClient(tracking_uri=uri)

    def records() -> list[Any]:
        ids = [e.experiment_id for e in client.search_experiments() if e.name.startswith("bench/")]
        return [r for r in client.search_runs(ids) if r.data.tags["bench.run_id"] == first.run_id] if ids else []

    assert records() == []
    again = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, tracking_uri=uri, device="cpu")
    assert again.run_id == first.run_id  # found, not trained
    (made,) = records()
    assert made.data.tags["bench.synced"] == "true" and made.info.status == "FINISHED"
    run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, tracking_uri=uri, device="cpu")
    assert [r.info.run_id for r in records()] == [made.info.run_id]  # complete: left as it is
    # an unfinished record (the process stopped while it logged) is replaced by a whole one
    client.delete_run(made.info.run_id)
    cut = client.create_run(made.info.experiment_id, tags={"bench.run_id": first.run_id})
    run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, tracking_uri=uri, device="cpu")
    (whole,) = records()
    assert whole.info.run_id != cut.info.run_id and whole.data.tags["bench.synced"] == "true"


def test_a_sweep_run_again_completes_the_mlflow_records_of_its_done_rows(tiny_protocol_file: Path, tmp_path: Path,
                                                                         results_with_joint: Path,
                                                                         mlflow_template: Path) -> None:
    """A sweep made with --no-mlflow, run again with MLflow, planned its rows as done and left them unmirrored
    (`bench run` of the same run completes its record)."""
    import shutil

    from mlflow.tracking import MlflowClient

    from bench_stability_gap.harness.api import sweep

    grid = write_grid(tmp_path / "grid.yaml", tiny_protocol_file, ["finetune"])
    results, db = results_with_joint, tmp_path / "team" / "store.db"
    db.parent.mkdir()
    shutil.copyfile(mlflow_template, db)
    uri = f"sqlite:///{db}"
    first = sweep(str(grid), results_dir=results, mlflow=False, device="cpu")
    again = sweep(str(grid), results_dir=results, tracking_uri=uri, device="cpu")
    assert list(again["run_id"]) == list(first["run_id"])  # done: nothing trained
    client = MlflowClient(tracking_uri=uri)
    ids = [e.experiment_id for e in client.search_experiments() if e.name.startswith("bench/")]
    mirrored = {r.data.tags["bench.run_id"] for r in client.search_runs(ids)}
    assert set(first["run_id"]) <= mirrored


def test_a_stored_run_made_by_other_code_is_not_taken_for_an_identical_one(tiny_protocol_file: Path,
                                                                              results_with_joint: Path) -> None:
    """After an edit to the method's code (a new release, an edited plugin), `bench run` and sweeps said the
    run was stored already, while the leaderboard split it from runs of the current code into a row of its
    own: the row could never be completed without --rerun on every run."""
    import json

    from bench_stability_gap.harness.api import run_options
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.harness.sweep.plan import stored_run

    results = results_with_joint
    first = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu")
    options, spec = run_options(results, "cpu"), load_protocol(str(tiny_protocol_file))
    (path,) = [p for p in (results / "runs").rglob("*.json") if first.run_id in p.name]
    assert stored_run(spec, "vanilla", {}, 0, options) == path
    data = json.loads(path.read_text())
    data["method"]["code_hash"] = "0" * 64
    path.write_text(json.dumps(data))
    assert stored_run(spec, "vanilla", {}, 0, options) is None
    again = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu")
    assert again.run_id != first.run_id and stored_run(spec, "vanilla", {}, 0, options) is not None


def write_grid(path: Path, protocol: Path, methods: list[str]) -> Path:
    path.write_text(yaml.safe_dump({"name": path.stem, "seeds": [0],
                                    "runs": [{"protocol": str(protocol), "methods": methods}]}))
    return path


def counting(monkeypatch: pytest.MonkeyPatch, target: str, key: Callable[..., Any]) -> Counter:
    """Count the calls of the function at ``target`` (module.attribute), by ``key`` of their arguments."""
    module, _, name = target.rpartition(".")
    real = getattr(importlib.import_module(module), name)
    calls: Counter = Counter()

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[key(*args)] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(target, counted)
    return calls


def test_sweep_runs_a_grid_on_one_workbench_and_skips_what_is_stored(tiny_protocol_file: Path, tmp_path: Path,
                                                                     results_with_joint: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from bench_stability_gap.harness.api import sweep

    grid = write_grid(tmp_path / "grid.yaml", tiny_protocol_file, ["finetune"])
    results = results_with_joint  # the joint reference is stored (and in the folder, not in the sweep's rows)
    # every workbench made, whoever makes it (the sweep's stages, or a run that is given none)
    prepared = counting(monkeypatch, "bench_stability_gap.harness.run.workbench.prepare",
                        lambda protocol, seed, options: protocol.name)
    monkeypatch.setattr("bench_stability_gap.harness.run.pipeline.prepare",
                        importlib.import_module("bench_stability_gap.harness.run.workbench").prepare)
    frame = sweep(str(grid), results_dir=results, mlflow=False, device="cpu")
    assert list(zip(frame["method"], frame["seed"])) == [("finetune", 0)]  # the sweep's run (not the references)
    assert frame.loc[0, "reason"] == "" and frame.loc[0, "S_delta"] == frame.loc[0, "S_delta"]  # scored, not NaN
    # its stages (the deployed model, the A_best reference runs, the method run) shared one workbench
    assert prepared == {"tiny_cil_reduced": 1}
    again = sweep(str(grid), results_dir=results, mlflow=False, device="cpu")  # all stored: nothing runs
    assert list(again["run_id"]) == list(frame["run_id"]) and prepared == {"tiny_cil_reduced": 1}


def test_a_run_a_concurrent_sweep_stored_after_this_sweep_planned_is_reused_not_trained_again(
        tiny_protocol_file: Path, tmp_path: Path, results_with_joint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sweeps of one grid: the other one finished the run (and let go of its claim) between this sweep's
    plan, which found it missing, and this sweep's turn to run it."""
    from bench_stability_gap.harness import api
    from bench_stability_gap.harness.sweep.plan import load_sweep

    grid = write_grid(tmp_path / "grid.yaml", tiny_protocol_file, ["finetune"])
    results = results_with_joint
    planned = api.plan_sweep(load_sweep(str(grid)), None, api.run_options(results, "cpu"))
    assert planned is not None and [r.done for r in planned] == [None]  # missing when this sweep planned
    other = run(str(tiny_protocol_file), "finetune", 0, results_dir=results, mlflow=False, device="cpu")
    monkeypatch.setattr(api.sweeping, "plan_sweep", lambda *args, **kwargs: planned)  # this sweep's plan, made before
    trained = counting(monkeypatch, "bench_stability_gap.harness.run.pipeline._continual_result",
                       lambda protocol, bench, spec, *rest: spec.text)
    frame = api.sweep(str(grid), results_dir=results, mlflow=False, device="cpu")
    assert list(frame["run_id"]) == [other.run_id] and not trained  # reused: nothing trained twice
    assert len(list((results / "runs").rglob("*.json"))) == 3  # the joint reference, vanilla (A_best) and one finetune
    # a plain run still repeats a stored run when asked to (``rerun``): the reuse is the sweep's rule only
    again = run(str(tiny_protocol_file), "finetune", 0, results_dir=results, mlflow=False, device="cpu", rerun=True)
    assert again.run_id != other.run_id and trained == {"finetune": 1}


def test_a_run_parses_each_stored_result_once_and_an_identical_run_is_not_trained_again(
        tiny_protocol_file: Path, results_with_joint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    results = results_with_joint
    parses = counting(monkeypatch, "bench_stability_gap.harness.results.schema.parse_result", lambda data, path: path)
    first = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu")
    stored = sorted((results / "runs").rglob("*.json"))
    assert len(stored) == 2  # the joint reference, and vanilla (the protocol's A_best set: the run is its own)
    # the joint reference was there before: read once, not once per question the run asks of the folder
    assert max(parses.values()) == 1 and set(parses) <= set(stored), parses
    parses.clear()
    again = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu")
    assert again.run_id == first.run_id and sorted((results / "runs").rglob("*.json")) == stored  # nothing trained
    assert sorted(parses) == stored and set(parses.values()) == {1}
    retrained = run(str(tiny_protocol_file), "vanilla", 0, results_dir=results, mlflow=False, device="cpu",
                    rerun=True)
    assert retrained.run_id != first.run_id and retrained.curves == first.curves


def test_sweep_of_a_bf16_protocol_plans_against_bf16_runs(tiny_protocol_file: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA an embedded protocol computes in bf16 by default: a stored bf16 run covers the sweep's row,
    an fp32 one does not (the sweep would run it again, as it must)."""
    import torch

    from bench_stability_gap.harness import api
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.methods.registry import build_method, code_hash, method_settings, parse_method

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine, as far as planning sees
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    protocol = load_protocol(str(tiny_protocol_file))
    assert protocol.embedded  # bf16 by default on CUDA
    grid = write_grid(tmp_path / "grid.yaml", tiny_protocol_file, ["finetune"])
    stamp = ProtocolStamp(name=protocol.name, version=protocol.version, hash=protocol.spec_hash)
    config = method_settings(build_method("finetune", protocol, {})[1])
    graphs: list[list[Any]] = []
    monkeypatch.setattr(api.sweeping, "run_local_sweep", lambda graph, *a, **k: graphs.append(graph))  # nothing trains

    def stored_in(precision: str, device: str) -> tuple[Path, RunResult]:
        results = tmp_path / precision
        run = two_session_run(f"f{precision}", "finetune")
        made_by = run.method.model_copy(update={"code_hash": code_hash([parse_method("finetune").base])})
        made_on = RunOptions(results_dir=tmp_path, device=device).numerics  # this (mocked CUDA) machine
        run = run.model_copy(update={"protocol": stamp, "config": config, "method": made_by,
                                     "options": {"device": device, "precision": precision, "numerics": made_on}})
        save_result(results, run)
        return results, run

    results, bf16 = stored_in("bf16", "cuda:0")
    frame = api.sweep(str(grid), results_dir=results, mlflow=False, device="cuda")
    assert graphs == [[]] and list(frame["run_id"]) == [bf16.run_id]  # done: the bf16 run covers it
    results, _ = stored_in("fp32", "cpu")
    api.sweep(str(grid), results_dir=results, mlflow=False, device="cuda")
    assert [(s.kind, s.method) for s in graphs[1] if s.kind == "run"] == [("run", "finetune")]  # to run in bf16


def test_table_refuses_an_unknown_format_naming_it_and_the_choices(tmp_path: Path) -> None:
    from bench_stability_gap.harness.api import table

    with pytest.raises(BenchError, match=r"table fmt 'docx' is not a table format: choose one of markdown, text"):
        table(tmp_path, fmt="docx")  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", ["0", 0.5, True, None])
def test_a_seed_that_is_not_an_integer_is_refused_before_any_compute(seed: Any, tmp_path: Path, monkeypatch) -> None:
    """From Python a seed of the wrong type reached numpy's seeding (a TypeError) or, as True, trained a
    deployed model as seed 1 under another name."""
    from bench_stability_gap.harness.run import workbench

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared for a seed that is not an integer")

    monkeypatch.setattr(workbench, "prepare", prepared)
    with pytest.raises(BenchError, match=f"--seed {re.escape(repr(seed))} is a {type(seed).__name__}; a seed is an "
                                         f"integer, e.g. 0."):
        run("tiny_cil", "vanilla", seed, results_dir=tmp_path, mlflow=False)


def _api_calls(tmp_path: Path) -> list[tuple[Callable[[], Any], str]]:
    """(call, what the refusal says) for arguments of the wrong type or value."""
    from bench_stability_gap.harness import api

    root = tmp_path / "r"
    return [
        (lambda: api.run(results_dir=5), "results_dir takes a folder path (str or Path) or None, not 5 of type int"),
        (lambda: api.run(method=None), "method takes a method string"),  # type: ignore[arg-type]
        (lambda: api.run(method=["vanilla"]), "method takes a method string"),  # type: ignore[arg-type]
        (lambda: api.run(results_dir=root, mlflow="no"), "mlflow takes True or False, not 'no' of type str"),  # type: ignore[arg-type]
        (lambda: api.sweep(5), "sweep takes a sweep's name or YAML path"),  # type: ignore[arg-type]
        (lambda: api.sweep("table1_tiny_cil", 1, results_dir=root), "seeds takes a list of seeds"),  # type: ignore[arg-type]
        (lambda: api.sweep("table1_tiny_cil", 0, results_dir=root), "seeds takes a list of seeds"),  # type: ignore[arg-type]
        (lambda: api.sweep("table1_tiny_cil", [], results_dir=root), "seeds [] names no seed"),
        (lambda: api.table(tmp_path, protocols="tiny_cil"), "protocols takes a list of str"),
        (lambda: api.table(tmp_path, columns="acc"), "columns takes a list of str"),
        (lambda: api.table(tmp_path, columns=[3]), "columns takes a list of str"),  # type: ignore[list-item]
        (lambda: api.table(None), "results_dir takes a folder path (str or Path), not None"),  # type: ignore[arg-type]
        (lambda: api.load_results(None), "results_dir takes a folder path (str or Path), not None"),  # type: ignore[arg-type]
        (lambda: api.table(tmp_path, fmt="csv", columns=["bogus"]), "Unknown column 'bogus'"),
        (lambda: api.run_options(tmp_path, checkpoint_every=-1), "checkpoint_every takes a whole number of updates"),
        (lambda: api.run_options(tmp_path, checkpoint_every=True), "checkpoint_every takes a whole number"),
        (lambda: api.run_options(tmp_path, progress="yes"), "progress takes True or False"),  # type: ignore[arg-type]
    ]


def test_arguments_of_the_wrong_type_are_refused_naming_the_argument(tmp_path: Path, monkeypatch) -> None:
    """From Python a number where a path belongs was a TypeError, a str where a list belongs was iterated letter
    by letter ("Unknown protocol 't'"), 'no' passed as a true flag, seeds=0 or [] ran the sweep's seeds."""
    from bench_stability_gap.harness.run import pipeline

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared despite a bad argument")

    monkeypatch.setattr(pipeline, "prepare", prepared)
    for call, message in _api_calls(tmp_path):
        with pytest.raises(BenchError, match=re.escape(message)):
            call()
    assert not (tmp_path / "r" / "runs").exists()
