"""A budget family of one's own (``my.yaml@Kx``) ranks like a built-in one: every budget is scored against
the base protocol's joint reference, shared across the budgets; the command a missing reference's message
suggests loads; and a budget curve with nothing to draw exits 2 saying why, writing nothing."""

from __future__ import annotations

from pathlib import Path

import yaml
from budget_family import session_curve
from click.testing import CliRunner
from results_factory import hand_result

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.curves import ReferenceSession
from bench_stability_gap.harness.results.schema import Budget, ProtocolStamp, References, RunResult, save_result
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.leaderboard.aggregate import summarize
from bench_stability_gap.leaderboard.budget_curve import budget_families
from bench_stability_gap.leaderboard.sources import load_folder

BASE_HASH = "basehash".ljust(16, "0")


def _file(tmp_path: Path) -> Path:
    spec = load_protocol("tiny_cil_flops").model_dump(mode="json", exclude_none=True)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({**spec, "name": "mine"}))
    return path


def _stamp(r: RunResult, name: str, digest: str, file: Path, tflops: float | None = None) -> RunResult:
    updates = r.budget.optimizer_steps
    return r.model_copy(update={
        "protocol": ProtocolStamp(name=name, version=1, hash=digest), "options": {"protocol_file": str(file)},
        "budget": Budget(updates_per_session=[updates], train_tflops_budget=tflops, batch_new=1, batch_old=0,
                         samples_trained=updates, optimizer_steps=updates, memory_policy="none",
                         memory_capacity=None, memory_peak_samples=0, memory_peak_bytes=0)})


def _write(root: Path, file: Path, seeds: tuple[int, ...] = (0, 1), joints: tuple[int, ...] = (0, 1)) -> None:
    for seed in joints:  # NAME's joint reference, one per seed, shared by every budget
        joint = hand_result(f"joint-{seed}", "joint", seed, reference=[
            ReferenceSession(session=2, old=0.8, new=0.75, all=0.78, tasks=[0.8, 0.75])])
        save_result(root, _stamp(joint, "mine", BASE_HASH, file))
    for factor, old in (("0.5", [0.8, 0.5, 0.6]), ("2", [0.8, 0.6, 0.7, 0.75, 0.78])):
        for method in ("vanilla", "vanilla+sgm"):
            for seed in seeds:
                c = session_curve(old, 0.1 if "sgm" in method else 0.0)
                r = hand_result(f"{method.replace('+', '_')}-{factor}-{seed}", method, seed, curves=[c],
                                steps=c.total_updates)
                r = r.model_copy(update={"references": References(joint_run=f"joint-{seed}", best_new={2: 0.7})})
                save_result(root, _stamp(r, f"mine@{factor}x", f"hash-{factor}".ljust(16, "0"), file,
                                         0.2 * float(factor)))


def test_a_file_family_ranks_with_one_shared_joint_reference(tmp_path: Path) -> None:
    file = _file(tmp_path)
    _write(tmp_path / "results", file)
    boards = {b.name: b for b in summarize(load_folder(tmp_path / "results").entries)}
    half, double = boards["mine@0.5x"], boards["mine@2x"]
    for board in (half, double):
        assert {r.method for r in board.rows} == {"vanilla", "vanilla+sgm"}, [e.reason for e in board.unranked]
        assert not board.unranked
    assert {s: e.run_id for s, e in half.joints.items()} == {s: e.run_id for s, e in double.joints.items()} \
        == {0: "joint-0", 1: "joint-1"}
    (family,) = budget_families(list(boards.values()))
    assert family.base == "mine" and [p.factor for p in family.points] == [0.5, 2.0] and not family.apart


def test_a_missing_reference_names_a_command_that_loads(tmp_path: Path) -> None:
    file = _file(tmp_path)
    _write(tmp_path / "results", file, joints=(0,))
    boards = {b.name: b for b in summarize(load_folder(tmp_path / "results").entries)}
    (reason,) = {e.reason for e in boards["mine@2x"].unranked}
    assert reason.endswith(f"(bench run -p {file.resolve()}@2x -m joint -s 1)")
    arg = reason.split("bench run -p ")[1].split(" ")[0]
    scaled = load_protocol(arg)  # the suggested -p loads: the file's protocol at that budget
    assert scaled.name == "mine@2x" and scaled.reference.name == "mine" and scaled.source_file == str(file.resolve())


def test_budget_curve_with_nothing_to_draw_exits_2(tmp_path: Path) -> None:
    file = _file(tmp_path)
    _write(tmp_path / "results", file, joints=())  # no joint reference at all: no budget is ranked
    out = tmp_path / "curve.png"
    res = CliRunner().invoke(main, ["leaderboard", "budget-curve", "--results-dir", str(tmp_path / "results"),
                                    "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert "no ranked budget to draw" in res.output and "mine@0.5x: no ranked runs" in res.output
    assert not out.exists()
