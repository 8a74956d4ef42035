"""What the terminal shows at a glance: a sweep's closing table fits 120 columns (the gap columns and the
paired difference with vanilla; the rest behind --format and --columns)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from results_factory import joint_run, spread_run

from bench_stability_gap.harness.api import sweep_table
from bench_stability_gap.harness.results.schema import save_result

METHODS = ("vanilla", "vanilla+sgm", "derpp+soft+init+oocf", "lwf")


def _sweep(tmp_path: Path) -> tuple[SimpleNamespace, list[SimpleNamespace]]:
    """4 methods x 3 seeds whose numbers spread as real runs do (every cell has a spread, the paired
    column a p), one method string as long as real compositions get."""
    planned = []
    protocol = SimpleNamespace(name="hand", best_new_reference=["vanilla"])
    protocol.reference = protocol
    for seed in (0, 1, 2):
        save_result(tmp_path, joint_run(f"j{seed}", seed))
        for i, method in enumerate(METHODS):
            save_result(tmp_path, spread_run(f"{method.replace('+', '_')}-{seed}", method, seed, skill=0.02 * i))
            planned.append(SimpleNamespace(protocol=protocol, row=method, seed=seed))
    return SimpleNamespace(name="glance", description=None), planned


def test_a_sweeps_closing_table_fits_120_columns(tmp_path: Path) -> None:
    spec, planned = _sweep(tmp_path)
    text = sweep_table(spec, planned, tmp_path, fmt="brief")
    wide = [line for line in text.splitlines() if len(line) > 120]
    assert not wide, "\n".join(wide)
    for needle in ("S_Δ", "P_Δ", "CK_Δ", "vs vanilla", "derpp+soft+init+oocf", "joint", "p="):
        assert needle in text, text
    assert "σ" not in text and "TFLOPs" not in text  # the rest is behind --format/--columns
    assert "| vanilla |" in sweep_table(spec, planned, tmp_path, fmt="markdown")


def test_bench_sweep_prints_the_brief_table_unless_asked_for_another_format() -> None:
    from bench_stability_gap.harness.cli import sweep

    fmt = next(p for p in sweep.params if p.name == "fmt")
    assert fmt.default == "brief" and {"markdown", "text", "latex", "json"} <= set(fmt.type.choices)
    assert any(p.name == "extra" for p in sweep.params)


def test_the_eta_after_the_first_stage_prices_each_stage_by_the_work_the_plan_knows() -> None:
    """The first stage of a sweep is its cheapest (a deployed model from a cache, a short pre-training):
    the mean duration of the finished stages, times the stages left, said 0m48s with 11 minutes to go."""
    from bench_stability_gap.harness.sweep.progress import ProgressBoard, eta_seconds

    now = [0.0]
    board = ProgressBoard({"deployed": "d", "joint": "j", "run": "r"}, clock=lambda: now[0],
                          work={"deployed": 1_000.0, "joint": 8_000.0, "run": 4_000.0})
    board.started("deployed", "local")
    now[0] = 10.0
    board.finished("deployed", "done")
    assert eta_seconds(board.snapshot(), board.work) == pytest.approx(120.0)  # 12,000 samples at 10 s per 1,000
    board.started("joint", "local")
    now[0] = 30.0
    assert eta_seconds(board.snapshot(), board.work) == pytest.approx(60.0 + 40.0)
    assert eta_seconds(board.snapshot()) == pytest.approx(10.0)  # without the plan's work: the mean duration


def test_each_stage_knows_the_samples_it_trains_on() -> None:
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.harness.sweep.stages import Stage

    p = load_protocol("tiny_cil_quick")  # pretrain 60 x 64; joint per session 60 x 64; 4 sessions of 30 x 32
    assert Stage("deployed", p, 0).work == 60 * 64
    assert Stage("joint", p, 0).work == 4 * 60 * 64 and Stage("joint-part", p, 0).work == 60 * 64
    assert Stage("run", p, 0, "vanilla").work == 4 * 30 * 32
    assert Stage("references", p, 0).work == len(p.best_new_reference) * 4 * 30 * 32


def test_bench_run_says_first_what_it_will_do_and_how_long_it_likely_takes(tmp_path: Path) -> None:
    """Before the checks that import torch (nothing showed for ~20 s, then "device: cpu"), and from the
    runs stored in the results folder when there are some."""
    from results_factory import two_session_run
    from support import invoke

    from bench_stability_gap.harness.spec.protocol import load_protocol

    p = load_protocol("tiny_cil_quick")
    stamp = {"name": p.name, "version": p.version, "hash": p.spec_hash}
    for i, wall in enumerate((60.0, 90.0, 200.0)):
        run = two_session_run(f"q{i}").model_copy(update={"wall_time_s": wall})
        save_result(tmp_path, run.model_copy(update={"protocol": run.protocol.model_copy(update=stamp)}))
    from bench_stability_gap.harness.run.announce import plan_line

    first = plan_line(p, "vanilla", 0, tmp_path)
    assert first.startswith("bench run: vanilla on tiny_cil_quick, seed 0: 4 sessions of 30 updates (batch 32)")
    assert "likely about 1m30s (the median of 3 run(s)" in first, first
    # a request the torch-free checks refuse gets its one paragraph and nothing announced before it
    out = invoke("run", "-p", "tiny_cil_quick", "--set", "lrr=1", "--results-dir", str(tmp_path), "--no-mlflow")
    assert out.exit_code == 2 and out.output.startswith("Error: Invalid configuration for method 'vanilla': lrr"), \
        out.output
    assert "bench run:" not in out.output
