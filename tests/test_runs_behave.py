"""Runs behave as a researcher expects day to day: an identical stored run is reported, not trained again;
progress written to a file is plain lines; the summary names the variant and a FLOP budget's spend; MLflow
step metrics of a method run and a joint run share one axis with one value per step."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.cli import main, summary_lines
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.progress_bar import MeasuredBar, PlainBar, progress_bar
from bench_stability_gap.harness.results.metrics import compute_metrics
from bench_stability_gap.harness.results.schema import TunedStamp, iter_results
from bench_stability_gap.harness.spec.protocol import load_protocol


def run_cli(*args: str):
    return CliRunner().invoke(main, ["run", "--device", "cpu", *args], catch_exceptions=False)


@pytest.mark.slow
def test_an_identical_stored_run_is_reported_and_trains_nothing(tiny_protocol_file: Path, results_with_joint: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    args = ("-p", str(tiny_protocol_file), "-m", "vanilla", "--results-dir", str(results_with_joint), "--no-mlflow")
    first = run_cli(*args, "--progress")  # the progress bars go to CliRunner's stderr: not a terminal
    assert first.exit_code == 0, first.output
    assert "\r" not in first.output  # plain lines, never a bar redrawn with carriage returns
    assert "tiny_cil_reduced vanilla: 24/24 upd, 100%" in first.output  # the run's line, at its end
    (stored,) = [(p, r) for p, r in iter_results(results_with_joint) if not r.is_reference]

    from bench_stability_gap.harness.run import pipeline

    def no_training(*_a, **_k):
        raise AssertionError("an identical stored run was trained again")

    monkeypatch.setattr(pipeline, "run_cl", no_training)
    again = run_cli(*args)
    assert again.exit_code == 0, again.output
    assert "nothing trained" in again.output and "--rerun" in again.output
    assert str(stored[0]) in again.output and f"{stored[1].metrics.S_delta:.3f}" in again.output
    assert "\n".join(summary_lines(stored[1], stored[0])) in again.output  # the stored run's own summary
    # said first, and the summary's times named as the stored run's, not this command's
    said = again.output.index("Stored, nothing trained")
    assert said < again.output.index(summary_lines(stored[1], stored[0])[0].strip())
    assert "wall time it took when it was made" in again.output[said:again.output.index("\n", said)]
    assert len([r for _, r in iter_results(results_with_joint) if not r.is_reference]) == 1
    # another setting is another run: it trains (and here meets the patched trainer)
    with pytest.raises(AssertionError, match="trained again"):
        run_cli(*args, "--set", "lr=0.002")
    with pytest.raises(AssertionError, match="trained again"):
        run_cli(*args, "--rerun")


def test_progress_off_a_terminal_is_plain_periodic_lines() -> None:
    clock = iter(float(t) for t in range(0, 1000))  # one second a call
    out = io.StringIO()  # not a terminal
    bar = progress_bar(True, desc="tiny vanilla", total=60, unit="upd", file=out, every=25,
                       clock=lambda: next(clock))
    assert isinstance(bar, PlainBar)
    for _ in range(60):
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 3  # at 25 s, at 51 s and at the end
    assert lines[0].startswith("tiny vanilla: ") and "/60 upd" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("tiny vanilla: 60/60 upd, 100%, ETA 0m00s")
    assert progress_bar(False, desc="x", total=3).disable  # --no-progress: nothing at all


def test_a_flop_budget_bar_counts_tflops_toward_its_total() -> None:
    spent = [0.0]
    out = io.StringIO()
    clock = iter(float(t) for t in range(0, 1000, 30))
    bar = MeasuredBar(progress_bar(True, desc="budget run", total=1.5, initial=0.0, unit="TFLOP", file=out, every=1,
                                   clock=lambda: next(clock)), lambda: spent[0])
    for _ in range(3):
        spent[0] += 0.25
        bar.update(1)  # one update: the bar moves by what it cost
    assert out.getvalue().splitlines()[-1].startswith("budget run: 0.75/1.5 TFLOP, 50%, ETA 3m00s")


def test_the_summary_names_precision_tuning_overrides_and_a_flop_budgets_spend() -> None:
    run = two_session_run("r1", "vanilla").model_copy(update={"options": {"precision": "bf16"}, "overrides": {"lr": 0.002}})
    assert "hand | vanilla [lr=0.002] | seed 0 | bf16, set by hand" in summary_lines(run, "r1.json")[0]
    tuned = TunedStamp(trials=8, objective="CK_delta", value=0.1, validation_per_class=5, study="s", tuning_hash="t")
    run = run.model_copy(update={"tuned": tuned, "overrides": {"lr": 0.002}})
    assert f"vanilla [{tuned.ruleset}] | seed 0" in summary_lines(run, "r1.json")[0] and "tuned" in tuned.ruleset
    budget = run.budget.model_copy(update={"train_tflops_budget": 0.5, "train_flops": 0.98e12,
                                           "updates_per_session": [7, 6], "optimizer_steps": 13, "eval_flops": 1e11})
    metrics = compute_metrics(run.curves, joint_run().reference, {2: 0.9, 3: 0.95})
    lines = summary_lines(run.model_copy(update={"budget": budget, "metrics": metrics}), "r1.json")
    assert "  FLOP budget 0.5 TFLOPs per session: spent 0.980 TFLOPs in 13 updates (7, 6 per session)" in lines


def test_tuned_never_suggests_tuning_a_protocol_without_a_validation_split(tmp_path: Path, bench_cache: Path) -> None:
    from bench_stability_gap.harness.results.tuned import load_entry
    from support import reduced_tiny

    spec = reduced_tiny()
    spec.pop("validation", None)
    path = tmp_path / "novalid.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(BenchError) as err:
        load_entry(tmp_path / "results", load_protocol(str(path)), "vanilla")
    assert "no validation split" in str(err.value) and "bench tune" not in str(err.value)
    out = run_cli("-p", str(path), "--tuned", "--results-dir", str(tmp_path / "results"), "--no-mlflow")
    assert out.exit_code == 2 and "bench tune" not in out.output and "validation" in out.output


@pytest.mark.slow
def test_mlflow_steps_of_a_method_run_and_its_joint_run_share_one_axis(tiny_protocol_file: Path, tmp_path: Path,
                                                                       seeded_store) -> None:
    results = seeded_store(tmp_path / "results")
    out = run_cli("-p", str(tiny_protocol_file), "-m", "vanilla", "--set", "lr=0.002", "--results-dir", str(results),
                  "--no-progress")  # trains the joint reference and the A_best run first, mirrors them too
    assert out.exit_code == 0, out.output
    stored = {r.label: r for _, r in iter_results(results)}
    run, joint = stored["vanilla [lr=0.002]"], stored["joint"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name("bench/tiny_cil_reduced")
    records = {r.data.tags["bench.run_id"]: r for r in client.search_runs([exp.experiment_id])}
    method, reference = records[run.run_id], records[joint.run_id]
    assert method.info.run_name == "vanilla [lr=0.002] seed0 fp32"  # the variant, not just the method
    assert {method.data.tags["bench.step_axis"], reference.data.tags["bench.step_axis"]} == {"updates"}

    def history(record, key: str) -> list[tuple[int, float]]:
        return sorted((m.step, m.value) for m in client.get_metric_history(record.info.run_id, key))

    ends, offset = {}, 0  # the method run's axis: updates from the start of the first learning session
    for c in run.curves:
        offset += c.total_updates
        ends[c.session] = offset
    for key in ("acc_old", "acc_new", "acc_all", "session", "session_start_acc_old", "train_tflops"):
        steps = [s for s, _ in history(method, key)]
        assert steps and len(steps) == len(set(steps)), key  # each eval point logged once per key
    assert [s for s, _ in history(method, "acc_old")] == [0, 1, 2, 6, 7, 8, 12, 13, 14, 18, 19, 20, 24]
    assert history(method, "session_start_acc_old") == [(ends[c.session - 1], c.old[0]) for c in run.curves[1:]]
    assert dict(history(method, "session"))[ends[3]] == 3.0  # a session's last point carries its session
    joint_old = history(reference, "joint_acc_old")
    assert len(joint_old) == len({s for s, _ in joint_old}) == len(joint.reference)
    # the joint model trained on S1..Sj sits at the end of learning session j on the method run's axis
    on_axis = {r.session: ends.get(r.session, 0) for r in joint.reference}
    assert joint_old == sorted((on_axis[r.session], r.old) for r in joint.reference)
    assert {s for s, _ in joint_old} - {0} <= {s for s, _ in history(method, "acc_old")}
