"""Time to result in the leaderboard's tables, the budget curve (boards of ``BASE@<k>x`` protocols lined up by
their recorded FLOP budget) as a table, a figure file and a site section, and (marked ``browser``) the
budget-curve figure and the curves against TFLOPs in headless Chromium. Built from the hand-written family
of tests/budget_family.py: every number asserted here is computed by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from budget_family import BASE, family_results, write_family
from chromium import CHROMIUM_FLAGS, playwright_and_chromium, wait_until_loaded
from click.testing import CliRunner
from results_factory import hand_result, joint_run, two_session_run

from bench_stability_gap.harness.api import sweep_table
from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.results.schema import ProtocolStamp, save_result
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.leaderboard.aggregate import format_table, summarize
from bench_stability_gap.leaderboard.budget_curve import budget_families, format_family_table
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder
from bench_stability_gap.methods.configs import joint_settings

REPO = Path(__file__).resolve().parents[1]


def _cells(table: str, method: str) -> dict[str, str]:
    """Header -> cell of ``method``'s row in a markdown table."""
    lines = [line for line in table.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    row = next(line for line in lines if line.startswith(f"| {method} |"))
    return dict(zip(header, (c.strip() for c in row.strip("|").split("|"))))


# ----------------------------------------------------------------------------- time to result


def test_the_table_shows_time_to_result_in_updates_and_tflops_side_by_side(tmp_path: Path) -> None:
    boards = {b.name: b for b in summarize(load_folder(write_family(tmp_path / "r")).entries)}
    text = format_table([boards[f"{BASE}@2x"]])
    header = next(line for line in text.splitlines() if line.startswith("| method"))
    cols = [c.strip() for c in header.strip("|").split("|")]
    at = cols.index("T_old (updates)")
    assert cols[at:at + 4] == ["T_old (updates)", "T_old (TFLOPs)", "T_new (updates)", "T_new (TFLOPs)"]
    # vanilla @2x, threshold 0.99 * 0.8 = 0.792 on the old classes (points every 2 updates, 0.025 TFLOPs each):
    #   seed 0 is back at 0.8 at point 7 = update 14 = 0.35 TFLOPs; seed 1 at point 6 = update 12 = 0.30 TFLOPs
    #   -> 13 ± 1.41 updates, 0.325 ± 0.0354 TFLOPs, both sessions reached
    # new classes: A_best 0.6 (vanilla is the reference set), 0.594 first reached at point 3 = update 6 = 0.15
    vanilla = _cells(text, "vanilla")
    assert vanilla["T_old (updates)"].startswith("13 ± 1 ") and vanilla["T_old (updates)"].endswith("(2/2 sessions)")
    assert vanilla["T_old (TFLOPs)"].startswith("0.325 ± 0.035 ")
    assert vanilla["T_new (updates)"] == "6 (2/2 sessions)" and vanilla["T_new (TFLOPs)"] == "0.150 (2/2 sessions)"
    # @0.5x: old accuracy 0.6 and 0.7 at the last point, below 0.792 -> never back: not reached, never a number
    low = _cells(format_table([boards[f"{BASE}@0.5x"]]), "vanilla")
    assert low["T_old (updates)"] == "– (0/2 sessions)" and low["T_old (TFLOPs)"] == "– (0/2 sessions)"
    data = json.loads(format_table([boards[f"{BASE}@0.5x"]], "json"))
    cell = data["protocols"][0]["rows"][0]["metrics"]["ttr_old_updates"]
    assert cell["mean"] is None and cell["reached"] == {"sessions": 0, "of": 2}


def test_time_to_result_of_an_update_budgeted_run_without_flops_is_not_recorded(tmp_path: Path) -> None:
    # recorded no FLOPs at its eval points: the updates are there, the TFLOPs are "–" with no count (not 0/1)
    results = [r.model_copy(update={"curves": [c.model_copy(update={"train_flops": None}) for c in r.curves],
                                    "budget": r.budget.model_copy(update={"train_tflops_budget": None})})
               for r in family_results() if r.protocol.name == f"{BASE}@2x"]
    root = tmp_path / "r"
    for r in results:
        save_result(root, r)
    (board,) = summarize(load_folder(root).entries)
    vanilla = _cells(format_table([board]), "vanilla")
    assert vanilla["T_old (updates)"].endswith("(2/2 sessions)")
    assert vanilla["T_old (TFLOPs)"] == "–"


# ----------------------------------------------------------------------------- the budget curve


def test_a_family_lines_up_its_boards_by_recorded_budget(tmp_path: Path) -> None:
    # an update-budgeted board named like the family is set apart with the reason; other protocols are no family
    stray = [hand_result(f"x{s}", "vanilla", s) for s in (0, 1)]
    stray = [r.model_copy(update={"protocol": r.protocol.model_copy(update={"name": f"{BASE}@3x"})}) for r in stray]
    other = [hand_result("o", "vanilla", 0)]
    boards = summarize(load_folder(write_family(tmp_path / "r", stray + other)).entries)
    (family,) = budget_families(boards)
    assert family.base == BASE and family.precision == "fp32"
    assert [(p.factor, p.tflops) for p in family.points] == [(0.5, 0.1), (2.0, 0.4)]  # 0.2 TFLOPs x k, recorded
    assert family.methods == ["vanilla+sgm", "vanilla"]  # the largest budget's order (CK_Δ)
    assert [name for name, _ in family.apart] == [f"{BASE}@3x"]


def test_the_family_table_is_the_per_budget_boards_mean_and_std(tmp_path: Path) -> None:
    boards = summarize(load_folder(write_family(tmp_path / "r")).entries)
    (family,) = budget_families(boards)
    table = format_family_table(family)
    rows = [line for line in table.splitlines() if line.startswith("| 0.5x") or line.startswith("| 2x")]
    assert len(rows) == 4  # 2 budgets x 2 methods
    # vanilla @0.5x, S_Δ per seed (points 0, 2, 4; weights 1/2 each; joint old 0.8):
    #   seed 0: 1 - (0.4 + 0.6) / 2 / 0.8 = 0.375;  seed 1: 1 - (0.52 + 0.7) / 2 / 0.8 = 0.2375
    #   mean 0.30625, sample std 0.1375 / sqrt(2) = 0.09723
    row = next(r for r in rows if r.startswith("| 0.5x | 0.1 | vanilla |"))
    assert "| 0.306 ± 0.0972 |" in row and row.split("|")[4].strip() == "2"
    # each cell is its own board's number: the family view cannot disagree with the per-budget boards
    for point in family.points:
        for r in point.board.rows:
            assert r.stats["S_delta"] == next(x for x in point.board.rows if x.method == r.method).stats["S_delta"]


def test_bench_leaderboard_budget_curve_writes_the_figure(tmp_path: Path) -> None:
    root = write_family(tmp_path / "r")
    out = tmp_path / "fig" / "budget.png"
    res = CliRunner().invoke(main, ["leaderboard", "budget-curve", "--results-dir", str(root), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "| 2x | 0.4 | vanilla+sgm |" in res.output
    # bad input: exit 2 with one paragraph naming what is wrong, before anything is written
    bad = CliRunner().invoke(main, ["leaderboard", "budget-curve", "--results-dir", str(root), "--out",
                                    str(tmp_path / "fig.jpg")])
    assert bad.exit_code == 2 and ".jpg is none of them" in bad.output and not (tmp_path / "fig.jpg").exists()
    typo = CliRunner().invoke(main, ["leaderboard", "budget-curve", "--results-dir", str(root), "--family", "fake_flop"])
    assert typo.exit_code == 2 and "Did you mean: fake_flops?" in typo.output
    empty = tmp_path / "empty"
    save_result(empty, hand_result("h", "vanilla", 0))
    none = CliRunner().invoke(main, ["leaderboard", "budget-curve", "--results-dir", str(empty)])
    assert none.exit_code == 2 and "No budget family" in none.output


# ---------------------------------------------------------------------------------- the browser

@pytest.mark.browser
def test_the_budget_curve_and_the_tflops_curves_render_in_chromium(tmp_path: Path) -> None:
    sync_api, chromium = playwright_and_chromium()
    site = tmp_path / "site"
    build_site(load_folder(write_family(tmp_path / "r")), site)
    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((site / "index.html").as_uri())
            page.wait_for_load_state("load")
            family = page.locator(f'section.budget-family[data-base="{BASE}"]')
            figure = family.locator("img.budget-curve")
            wait_until_loaded(page, figure)
            assert family.locator("table.budget-table tbody tr").count() == 4  # 2 budgets x 2 methods
            family.screenshot(path=str(artifacts / "budget-curve.png"))

            # the curves against TFLOPs: hidden behind the toggle, shown by it, loaded
            board = page.locator("section.protocol", has=page.locator(f'table[data-protocol="{BASE}@2x"]'))
            compute = board.locator('.axis-group[data-axis="tflops"]')
            assert not compute.is_visible()
            board.locator('button[data-axis="tflops"]').click()
            assert compute.is_visible() and not board.locator('.axis-group[data-axis="updates"]').is_visible()
            images = compute.locator("img")
            assert images.count() == 3
            for i in range(3):
                wait_until_loaded(page, images.nth(i))
            compute.screenshot(path=str(artifacts / "curves-tflops.png"))
            assert errors == []
        finally:
            browser.close()
    assert (artifacts / "budget-curve.png").stat().st_size > 10_000


def test_a_sweeps_table_scores_each_budget_against_the_familys_shared_joint_reference(tmp_path: Path) -> None:
    """A budget-curve sweep trains no joint model of its own for NAME@Kx: its end-of-sweep table must
    bring NAME's along, as the leaderboard does, instead of calling every budget unranked."""
    scaled, base = load_protocol("tiny_cil_flops@2x"), load_protocol("tiny_cil_flops")
    stamp = {p.name: ProtocolStamp(name=p.name, version=p.version, hash=p.spec_hash) for p in (scaled, base)}
    save_result(tmp_path, two_session_run("v0").model_copy(update={"protocol": stamp[scaled.name]}))
    save_result(tmp_path, joint_run("j0").model_copy(update={"protocol": stamp[base.name],
                                                             "config": joint_settings(base)}))
    planned = [SimpleNamespace(protocol=scaled, row="vanilla", seed=0)]
    table = sweep_table(SimpleNamespace(name="bc", description=None), planned, tmp_path)
    assert "no joint reference" not in table and "(no ranked runs)" not in table
    assert "| vanilla |" in table and "joint (upper bound)" in table
