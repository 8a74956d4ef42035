"""The whole pipeline on the embedded protocol with a reduced budget: CLI -> JSON -> MLflow."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import iter_results


def run_cli(*args: str):
    return CliRunner().invoke(main, ["run", "--no-progress", *args], catch_exceptions=False)


@pytest.mark.slow
def test_vanilla_run_writes_result_and_mlflow_and_is_reproducible(tiny_protocol_file, tmp_path, seeded_store):
    results = seeded_store(tmp_path / "results")
    args = ("--protocol", str(tiny_protocol_file), "--method", "vanilla", "--seed", "0", "--results-dir", str(results))
    first = run_cli(*args)
    assert first.exit_code == 0, first.output
    assert "No fp32 joint reference" in first.output  # trained and cached first, and said so
    for name in ("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha"):
        assert name in first.output

    second = run_cli(*args, "--rerun")  # trained again (without --rerun the stored run is reported)
    assert second.exit_code == 0 and "No fp32 joint reference" not in second.output

    runs = [r for _, r in iter_results(results)]
    joint = [r for r in runs if r.is_reference]
    cl = [r for r in runs if not r.is_reference]
    assert len(joint) == 1 and len(cl) == 2  # vanilla is tiny_cil's A_best reference: no extra run needed
    a, b = cl
    assert a.curves == b.curves  # same seed, same numbers
    assert a.metrics.S_delta == b.metrics.S_delta and a.metrics.alpha == b.metrics.alpha
    assert a.references.joint_run == joint[0].run_id
    assert a.budget.updates_per_session == [6, 6, 6, 6]
    assert a.budget.optimizer_steps == 24 and a.budget.samples_trained == 24 * 16
    assert [c.updates for c in a.curves] == [[0, 1, 2, 6]] * 4
    assert a.protocol.name == "tiny_cil_reduced" and a.method.distribution == "bench-stability-gap"
    assert 0.0 <= a.metrics.alpha <= 1.0
    for run in (a, joint[0]):  # where the time went, by stage, within the run's wall time
        assert set(run.stage_seconds) == {"train", "eval"} and min(run.stage_seconds.values()) > 0
        assert sum(run.stage_seconds.values()) <= run.wall_time_s
    assert re.search(r"\| [\d.]+ s, eval \d+ s, train \d+ s \| result:", first.output)  # and the summary says so

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bench/tiny_cil_reduced")
    mruns = {r.data.tags["bench.run_id"]: r for r in client.search_runs([exp.experiment_id])}
    # the joint reference the first run trained is mirrored too; every record is tagged with what it is to the
    # others (read from the result, as any path that mirrors it would): A_joint, and vanilla runs of the A_best set
    roles = {rid: r.data.tags.get("bench.reference") for rid, r in mruns.items()}
    assert roles == {joint[0].run_id: "joint", a.run_id: "best_new", b.run_id: "best_new"}
    m = mruns[a.run_id].data
    assert m.metrics["S_delta"] == pytest.approx(a.metrics.S_delta)
    assert m.metrics["alpha"] == pytest.approx(a.metrics.alpha)
    history = client.get_metric_history(mruns[a.run_id].info.run_id, "acc_old")
    assert [h.step for h in history] == [0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20, 24]  # one per step
    starts = client.get_metric_history(mruns[a.run_id].info.run_id, "session_start_acc_old")
    assert [h.step for h in starts] == [6, 12, 18]  # sessions 3..5 at update 0, apart from the previous session's end
    artifacts = {f.path for f in client.list_artifacts(mruns[a.run_id].info.run_id)}
    assert any(p.endswith(".json") for p in artifacts) and "curves.csv" in artifacts


@pytest.mark.slow
def test_uncached_trunk_gives_the_same_curves(tiny_protocol_file, results_with_joint):
    results = results_with_joint  # the joint reference is stored: what is compared is finetune's two runs
    base = ("--protocol", str(tiny_protocol_file), "--method", "finetune", "--results-dir", str(results), "--no-mlflow")
    assert run_cli(*base).exit_code == 0
    assert run_cli(*base, "--no-trunk-cache", "--rerun").exit_code == 0  # the cache is not part of a run's identity
    cached, uncached = [r for _, r in iter_results(results) if r.method.spec == "finetune"]
    # the trunk in another batch shape: on one intra-op thread its last bits may differ, and training on
    # features that differ in the last bits drifts a little: measured 2 images of the smallest eval set,
    # so the curves must agree to 3 (the features themselves are compared to float noise in test_datapath)
    from bench_stability_gap.harness.data.stream import build_stream
    from bench_stability_gap.harness.spec.protocol import load_protocol

    stream = build_stream(load_protocol(str(tiny_protocol_file)), 0)
    one_image = 1 / len(stream.test_ids(np.arange(stream.pretrain_classes)))
    for c, u in zip(cached.curves, uncached.curves):
        for key in ("old", "new", "all"):
            assert getattr(c, key) == pytest.approx(getattr(u, key), abs=3 * one_image + 1e-9)


def test_interrupted_run_leaves_no_result(tiny_protocol_file, tmp_path, monkeypatch, seeded_store):
    from bench_stability_gap.methods import baselines as mb

    def boom(self, batch):
        raise KeyboardInterrupt

    monkeypatch.setattr(mb.StandardMethod, "observe", boom)
    results = seeded_store(tmp_path / "r")
    out = CliRunner().invoke(main, ["run", "--no-progress", "--protocol", str(tiny_protocol_file), "--method",
                                    "vanilla", "--results-dir", str(results)])
    assert out.exit_code == 130
    files = list(results.rglob("*")) if results.exists() else []
    assert not [f for f in files if f.suffix in (".json", ".tmp")]


def test_joint_reference_takes_the_protocols_optimizer_settings_only(tiny_protocol):
    from bench_stability_gap.methods.configs import joint_config

    spec = tiny_protocol.model_copy(update={"joint": tiny_protocol.joint.model_copy(update={"lr": 0.0123})})
    config = joint_config(spec)
    assert (config.lr, config.weight_decay, config.layer_decay, config.trainable) == (0.0123, 0.05, 1.0, "body+head")


@pytest.mark.parametrize("argv", [["-m", "joint", "--set", "lr=0.5"], ["-m", "joint+sgm"], ["-m", "joint+oocf"]])
def test_a_variant_of_the_joint_reference_is_refused_before_any_compute(tiny_protocol_file, tmp_path, argv):
    results = tmp_path / "r"
    out = CliRunner().invoke(main, ["run", "--no-progress", "--no-mlflow", "-p", str(tiny_protocol_file),
                                    "--results-dir", str(results), *argv])
    assert out.exit_code == 2, out.output
    assert "joint is the harness's upper-bound reference" in out.output and "joint section" in out.output
    assert "Traceback" not in out.output and not list(results.rglob("*.json"))


@pytest.mark.slow
def test_a_run_trains_its_references_first_and_stores_what_it_was_scored_with(tiny_protocol_file, tmp_path):
    from bench_stability_gap.harness.results.metrics import best_new_accuracy
    from bench_stability_gap.leaderboard.aggregate import summarize
    from bench_stability_gap.leaderboard.sources import load_folder

    results = tmp_path / "r"
    out = run_cli("--protocol", str(tiny_protocol_file), "--method", "vanilla+oocf", "--results-dir", str(results),
                  "--no-mlflow")
    assert out.exit_code == 0, out.output
    assert "training the missing fp32 reference run(s) first: vanilla" in out.output
    runs = {r.label: r for _, r in iter_results(results)}
    assert set(runs) == {"joint", "vanilla", "vanilla+oocf"}
    run, ref = runs["vanilla+oocf"], runs["vanilla"]
    assert run.references.joint_run == ref.references.joint_run == runs["joint"].run_id
    assert run.references.best_new == best_new_accuracy([ref.curves, run.curves])
    assert set(run.references.best_new_runs.values()) <= {ref.run_id, run.run_id}
    # the leaderboard re-finds the same references: the P_Δ written at run time is not stale
    (board,) = summarize(load_folder(results).entries)
    scored = {e.run_id: e.metrics for e in board.entries if e.metrics is not None}
    assert scored[run.run_id] == run.metrics and scored[ref.run_id] == ref.metrics


def test_a_diverged_run_is_stored_as_such_never_as_a_score(tiny_protocol_file, results_with_joint, monkeypatch):
    import math

    from bench_stability_gap.methods import base
    from bench_stability_gap.methods.base import StepStats

    real, calls = base.StandardMethod.observe, {"n": 0}

    def blows_up(self, batch):
        stats = real(self, batch)
        if getattr(self, "name", None) != "finetune":  # the pre-training and joint learners have none
            return stats
        calls["n"] += 1
        return StepStats(loss=math.nan) if calls["n"] == 9 else stats  # session 3, its third update

    monkeypatch.setattr(base.StandardMethod, "observe", blows_up)
    results = results_with_joint  # the joint reference is stored: the run trains the A_best run and finetune
    out = run_cli("--protocol", str(tiny_protocol_file), "--method", "finetune", "--results-dir", str(results),
                  "--no-mlflow")
    assert out.exit_code == 0, out.output
    assert "diverged at update 3 of session 3: loss nan" in out.output and "status diverged" in out.output
    (run,) = [r for _, r in iter_results(results) if r.method.spec == "finetune"]
    assert run.status == "diverged" and run.metrics is None
    assert [c.session for c in run.curves] == [2, 3] and run.curves[-1].updates == [0, 1, 2]
    assert set(run.stage_seconds) == {"train", "eval"}  # where its time went, up to the divergence
    from bench_stability_gap.leaderboard.aggregate import summarize
    from bench_stability_gap.leaderboard.sources import load_folder

    (board,) = summarize(load_folder(results).entries)
    assert "finetune" not in {row.method for row in board.rows}
    assert any(e.run_id == run.run_id and "diverged" in e.reason for e in board.unranked)


@pytest.mark.slow
def test_sweep_runs_a_grid_then_resumes_and_prints_its_table(tiny_protocol_file, results_with_joint, tmp_path):
    sweep = tmp_path / "grid.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "grid", "seeds": [0],
        "runs": [{"protocol": str(tiny_protocol_file), "methods": ["finetune"]},
                 {"protocol": str(tiny_protocol_file), "methods": ["vanilla+oocf"], "set": {"lr": 2e-3}}]}))
    results, table = results_with_joint, tmp_path / "table.md"  # the joint reference stored: not the subject
    args = ["sweep", str(sweep), "--no-progress", "--no-mlflow", "--results-dir", str(results), "--table", str(table)]
    first = CliRunner().invoke(main, args, catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert "2 run(s), 0 already done, 2 to run" in first.output
    text = table.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "S_Δ" not in line]
    assert any("finetune" in r for r in rows) and any("vanilla+oocf [lr=0.002]" in r for r in rows)
    cl = {r.method.spec: r for _, r in iter_results(results) if not r.is_reference}
    assert cl["vanilla+oocf"].config["lr"] == 2e-3 and cl["vanilla+oocf"].config["oocf"] == {"old_rows": "decay"}
    assert "oocf" not in cl["finetune"].config  # modifier settings are recorded under the modifier's name
    # the A_best reference (vanilla, default settings) was trained first and sits in the table too
    assert any(r.startswith("| vanilla |") for r in rows)
    assert cl["vanilla+oocf"].references.best_new_methods == ["vanilla"]
    again = CliRunner().invoke(main, args, catch_exceptions=False)
    assert again.exit_code == 0 and "2 already done, 0 to run" in again.output
    assert sorted(r.label for _, r in iter_results(results) if not r.is_reference) == [
        "finetune", "vanilla", "vanilla+oocf [lr=0.002]"]


def test_sweep_with_a_bad_entry_fails_before_running_anything(tiny_protocol_file, tmp_path):
    sweep = tmp_path / "bad.yaml"
    sweep.write_text(yaml.safe_dump({"name": "bad", "seeds": [0], "runs": [
        {"protocol": str(tiny_protocol_file), "methods": ["finetune", "vanila+sgm"]}]}))
    out = CliRunner().invoke(main, ["sweep", str(sweep), "--results-dir", str(tmp_path / "r")])
    assert out.exit_code == 2 and "vanila" in out.output and "Did you mean: vanilla" in out.output
    assert not (tmp_path / "r" / "runs").exists()
    sweep.write_text(yaml.safe_dump({"name": "bad", "seeds": [], "runs": [{"protocol": "tiny_cil", "methods": ["vanilla"]}]}))
    out = CliRunner().invoke(main, ["sweep", str(sweep)])
    assert out.exit_code == 2 and "seeds" in out.output
    sweep.write_text(yaml.safe_dump({"name": "bad", "seeds": [0], "runs": []}))
    out = CliRunner().invoke(main, ["sweep", str(sweep)])
    assert out.exit_code == 2 and "runs" in out.output and "grid" in out.output
