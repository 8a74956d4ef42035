"""The leaderboard's tables on hand-built results: rows never hidden, stable colours, intervals, exports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import RunResult, save_result
from bench_stability_gap.harness.results.uncertainty import t_interval
from bench_stability_gap.leaderboard.aggregate import (ALL_COLUMNS, COLUMNS, PALETTE, format_table, method_style,
                                                       summarize, table_columns)
from bench_stability_gap.leaderboard.sources import load_folder


def write(root: Path, runs: dict[str, list[int]], lifts: dict[str, float] | None = None) -> Path:
    """Results of the ``hand`` protocol: each method with the given seeds, and a joint run per seed."""
    results: list[RunResult] = []
    seeds = sorted({s for ss in runs.values() for s in ss})
    results += [joint_run(f"j{s}", s) for s in seeds]
    for method, ss in runs.items():
        lift = (lifts or {}).get(method, 0.0)
        results += [two_session_run(f"{method.replace('+', '_')}-{s}", method, s, lift=lift + 0.01 * s) for s in ss]
    for r in results:
        save_result(root, r)
    return root


def board_of(root: Path):  # noqa: ANN201
    (board,) = summarize(load_folder(root).entries)
    return board


def test_a_method_with_fewer_seeds_is_shown_with_its_n(tmp_path: Path) -> None:
    board = board_of(write(tmp_path, {"vanilla": [0, 1, 2], "vanilla+sgm": [0, 1]}, {"vanilla+sgm": 0.1}))
    rows = {r.method: r for r in board.rows}
    assert set(rows) == {"vanilla", "vanilla+sgm"} and not board.unranked
    assert len(rows["vanilla"].runs) == 3 and not rows["vanilla"].partial
    assert len(rows["vanilla+sgm"].runs) == 2 and rows["vanilla+sgm"].partial
    # compared with vanilla on the two seeds both have
    paired = rows["vanilla+sgm"].paired["S_delta"]
    assert paired is not None and paired.seeds == (0, 1)
    diffs = [rows["vanilla+sgm"].values["S_delta"][s] - rows["vanilla"].values["S_delta"][s] for s in (0, 1)]
    assert paired.mean == pytest.approx(sum(diffs) / 2)
    # a partial row is never crowned: no marks on it
    assert not any(rows["vanilla+sgm"].marks.values())
    text = format_table([board])
    line = next(x for x in text.splitlines() if x.startswith("| vanilla+sgm"))
    assert "| 2 of 3* |" in line and "(on 2 seeds)" not in line  # its 2 seeds are all shared
    assert "| 3 |" in next(x for x in text.splitlines() if x.startswith("| vanilla |"))
    assert "fewer seeds than the best-covered row" in text


def test_mean_std_and_t_interval_side_by_side(tmp_path: Path) -> None:
    board = board_of(write(tmp_path, {"vanilla": [0, 1, 2]}))
    (row,) = board.rows
    stat = row.stats["params"]  # 1.5 M trainable parameters in every run: no spread at all
    assert stat.mean == pytest.approx(1.5) and stat.ci is not None and stat.ci.low == stat.ci.high == pytest.approx(1.5)
    s = row.stats["S_delta"]
    assert s.ci is not None and s.ci.low <= s.mean <= s.ci.high and s.ci.low < s.ci.high
    assert s.ci == t_interval(list(row.values["S_delta"].values()))  # the Student-t rule, n - 1 df
    assert f"[{s.ci.low:.3f}, {s.ci.high:.3f}]" in format_table([board])


def test_colours_distinct_on_a_board_and_stable_across_builds(tmp_path: Path) -> None:
    methods = ["vanilla", "vanilla+sgm", "lwf", "der", "ewc", "gdumb", "finetune", "output_only"]
    runs = {m: [0] for m in methods}
    colours = lambda b: {r.method: (r.color, r.dash) for r in b.rows}  # noqa: E731
    first = colours(board_of(write(tmp_path / "a", runs)))
    assert colours(board_of(write(tmp_path / "b", runs))) == first  # the same board, the same colours
    assert len({c for c, _ in first.values()}) == len(methods) == len(PALETTE)  # 8 methods, 8 colours
    # a method whose preferred colour no other method of the board wants keeps it on every board
    alone = board_of(write(tmp_path / "c", {"vanilla": [0]}))
    assert colours(alone)["vanilla"] == method_style("vanilla") and method_style("vanilla")[0] in PALETTE
    # past the palette colours repeat, and the line style tells the rows apart where the hash allows
    many = colours(board_of(write(tmp_path / "d", {**runs, "remind": [0], "joint_free": [0]})))
    assert len({c for c, _ in many.values()}) == len(PALETTE)


def test_latex_and_json_exports(tmp_path: Path) -> None:
    board = board_of(write(tmp_path, {"vanilla": [0, 1], "vanilla+sgm": [0, 1]}, {"vanilla+sgm": 0.1}))
    latex = format_table([board], "latex", table_columns(["bwt"]))
    assert "\\begin{tabular}" in latex and "\\toprule" in latex and "\\midrule" in latex and "\\bottomrule" in latex
    assert "$S_{\\Delta}$ $\\downarrow$" in latex and "BWT (\\%) $\\uparrow$" in latex
    assert "\\textbf{" in latex and "vanilla+sgm" in latex
    # the intervals: each mean's t interval beside it, and the paired column with its test
    sgm = board.rows[[r.method for r in board.rows].index("vanilla+sgm")]
    ci = sgm.stats["S_delta"].ci
    assert f"[{ci.low:.3f}, {ci.high:.3f}]" in latex and "$\\Delta$$CK_{\\Delta}$ vs vanilla" in latex
    assert "n.s." in next(x for x in latex.splitlines() if x.startswith("vanilla+sgm"))
    data = json.loads(format_table([board], "json", ALL_COLUMNS))
    (proto,) = data["protocols"]
    rows = {r["method"]: r for r in proto["rows"]}
    assert rows["vanilla+sgm"]["vs_baseline"]["S_delta"]["seeds"] == [0, 1]
    assert {"p", "p_holm", "holm_family", "seeds_for_80pct_power"} <= set(rows["vanilla+sgm"]["vs_baseline"]["S_delta"])
    assert set(rows["vanilla"]["metrics"]) == {c.key for c in ALL_COLUMNS}
    assert rows["joint"]["reference"] is True


def test_cli_table_formats_columns_and_bad_input(tmp_path: Path) -> None:
    root = write(tmp_path, {"vanilla": [0, 1]})
    runner = CliRunner()
    ok = runner.invoke(main, ["leaderboard", "table", "--results", str(root), "--format", "latex", "--columns", "all"])
    assert ok.exit_code == 0, ok.output
    assert "\\bottomrule" in ok.output and "FWT" in ok.output
    bad = runner.invoke(main, ["leaderboard", "table", "--results", str(root), "--format", "docx"])
    assert bad.exit_code == 2 and "docx" in bad.output
    col = runner.invoke(main, ["leaderboard", "table", "--results", str(root), "--columns", "bogus"])
    assert col.exit_code == 2 and "bogus" in col.output
    assert len(table_columns()) == len(COLUMNS)


def test_a_corrupt_result_file_is_skipped_with_a_warning_naming_it(tmp_path: Path) -> None:
    root = write(tmp_path / "results", {"vanilla": [0, 1]})
    corrupt = root / "runs" / "hand" / "vanilla" / "seed5-broken.json"
    corrupt.write_text('{"run_id": "x", ')
    out = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(root), "--out", str(tmp_path / "site")])
    assert out.exit_code == 0, out.output
    assert "seed5-broken.json" in out.output and (tmp_path / "site" / "index.html").exists()


def test_boards_with_ranked_methods_come_first_default_protocol_first_precisions_grouped() -> None:
    from types import SimpleNamespace

    from bench_stability_gap.leaderboard.site import board_order

    def board(name: str, precision: str = "fp32", ranked: bool = True) -> SimpleNamespace:
        return SimpleNamespace(name=name, precision=precision, rows=[object()] if ranked else [])

    boards = [board("abc", ranked=False), board("tiny_cil", "bf16"), board("tiny_cil_quick"), board("tiny_cil@0.5x"),
              board("abc"), board("tiny_cil"), board("tiny_cil_quick", "bf16")]
    assert [(b.name, b.precision, bool(b.rows)) for b in sorted(boards, key=board_order)] == [
        ("tiny_cil", "fp32", True), ("tiny_cil@0.5x", "fp32", True), ("abc", "fp32", True),
        ("tiny_cil_quick", "fp32", True), ("tiny_cil", "bf16", True), ("tiny_cil_quick", "bf16", True),
        ("abc", "fp32", False)]


def test_columns_can_be_removed(tmp_path: Path) -> None:
    keys = [c.key for c in table_columns(["bwt", "-wall", "-tflops"])]
    assert "bwt" in keys and "wall" not in keys and "tflops" not in keys and "CK_delta" in keys
    assert "acc" not in [c.key for c in table_columns(["all", "-acc"])]
    root = write(tmp_path, {"vanilla": [0, 1]})
    out = CliRunner().invoke(main, ["leaderboard", "table", "--results", str(root), "--columns=-wall,-params"])
    assert out.exit_code == 0, out.output
    header = next(x for x in out.output.splitlines() if x.startswith("| method"))
    assert "wall time" not in header and "#P" not in header and "CK_Δ" in header
    bad = CliRunner().invoke(main, ["leaderboard", "table", "--results", str(root), "--columns=-bogus"])
    assert bad.exit_code == 2 and "-bogus" in bad.output
