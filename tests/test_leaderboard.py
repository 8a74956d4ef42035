"""The leaderboard: aggregation over seeds, references recomputed at build time, runs listed apart with
their reason, escaping, corrupt files, the text table, the MLflow source, build time, and (marked
``browser``) the built site in headless Chromium.

Built from real tiny_cil results (tests/browser/fixtures/, ~100 KB: ``bench run -p tiny_cil`` for
vanilla, output_only and finetune with seeds 0 and 1 on CPU, plus the two joint references those runs
used; the seed-0 joint came from an earlier run of the same spec, reused as the runner's find_joint
does). Cloned and edited copies of them make the cases no real run gives (hostile names, stale
hashes, failed runs, 100 results). The fixtures are re-stamped with the current tiny_cil spec hash and
CPU kernel set, so a change to the protocol spec or to the kernels does not turn them stale: what is
tested here is the leaderboard.
"""

from __future__ import annotations

import io
import json
import os
import re
import time
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest
from chromium import CHROMIUM_FLAGS, playwright_and_chromium
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.metrics import best_new_accuracy, compute_metrics, plasticity_gap
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.harness.results.schema import RunResult, load_result, save_result
from bench_stability_gap.harness.results.comparability import CPU_KERNELS

from bench_stability_gap.leaderboard.aggregate import COLUMN_BY_KEY, COLUMNS, Stat, format_table, marks, rank_value, summarize
from bench_stability_gap.leaderboard.reported import load_reported
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder

FIXTURES = Path(__file__).parent / "browser" / "fixtures"
REPO = Path(__file__).resolve().parents[1]
EVIL = "<script>alert(1)</script>"


# ----------------------------------------------------------------------------------- helpers


def real_results(protocol: str = "tiny_cil") -> list[RunResult]:
    """The stored real results, stamped with ``protocol``'s current name and spec hash and the current CPU
    kernel set (and the joint runs with its current joint settings: a setting added to MethodConfig since
    they were made is not a reason to set the fixtures' joint apart)."""
    from bench_stability_gap.methods.configs import joint_settings

    spec = load_protocol(protocol)
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        r = load_result(path)
        stamp = r.protocol.model_copy(update={"name": spec.name, "version": spec.version, "hash": spec.spec_hash})
        update = {"protocol": stamp, **({"config": joint_settings(spec)} if r.is_reference else {}),
                  "options": {**r.options, "cpu_kernels": CPU_KERNELS}}
        out.append(r.model_copy(update=update))
    assert out, f"no fixtures in {FIXTURES}"
    return out


def write_results(root: Path, results: list[RunResult]) -> Path:
    for r in results:
        save_result(root, r)
    return root


def clone(r: RunResult, *, method: str | None = None, seed: int | None = None, shift: float = 0.0,
          new_boost: float = 0.0, **update) -> RunResult:
    """A copy with a fresh run id; ``shift`` moves every accuracy, ``new_boost`` only new-class ones."""
    spec = method or r.method.spec
    parts = spec.split("+")
    stamp = r.method.model_copy(update={"spec": spec, "base": parts[0], "modifiers": parts[1:]})

    def move(xs: list[float], d: float) -> list[float]:
        return [min(1.0, max(0.0, x + d)) for x in xs]

    curves = [c.model_copy(update={"old": move(c.old, shift), "new": move(c.new, shift + new_boost),
                                   "all": move(c.all, shift), "tasks": [move(t, shift) for t in c.tasks]})
              for c in r.curves]
    data = r.model_dump(mode="json")
    data.update(run_id=uuid.uuid4().hex[:12], method=stamp.model_dump(mode="json"),
                seed=r.seed if seed is None else seed, curves=[c.model_dump(mode="json") for c in curves])
    data.update({k: (v.model_dump(mode="json") if hasattr(v, "model_dump") else v) for k, v in update.items()})
    return RunResult.model_validate(data)


def by_method(results: list[RunResult]) -> dict[tuple[str, int], RunResult]:
    return {(r.method.spec, r.seed): r for r in results}


def html_files(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html")) + sorted(site.rglob("*.svg"))


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return write_results(tmp_path / "results", real_results())


# ------------------------------------------------------------------------------ aggregation


def test_fixtures_are_real_tiny_cil_runs() -> None:
    results = real_results()
    methods = {(r.method.spec, r.seed) for r in results}
    assert {("vanilla", 0), ("vanilla", 1), ("output_only", 0), ("finetune", 0), ("joint", 0), ("joint", 1)} <= methods
    assert all(r.status == "complete" for r in results)
    assert all(r.curves for r in results if not r.is_reference)


def test_summary_recomputes_references_from_the_stored_curves(results_dir: Path) -> None:
    loaded = load_folder(results_dir)
    (board,) = summarize(loaded.entries)
    results = real_results()
    joints = {r.seed: r for r in results if r.is_reference}
    vanilla = {r.seed: r for r in results if r.method.spec == "vanilla"}  # tiny_cil's A_best reference set
    assert board.best_new == {seed: best_new_accuracy([r.curves]) for seed, r in vanilla.items()}
    ranked = {(e.method, e.result.seed): e for e in board.ranked_runs}
    assert ranked, board.unranked and [e.reason for e in board.unranked]
    for (method, seed), entry in ranked.items():
        # A_best: the reference set of the same seed, or the run itself where it learned the new classes better
        best = best_new_accuracy([vanilla[seed].curves, entry.result.curves])
        assert entry.metrics == compute_metrics(entry.result.curves, joints[seed].reference, best)
        paper = best_new_accuracy([e.result.curves for (_, s), e in ranked.items() if s == seed])
        assert entry.p_delta_paper == plasticity_gap(entry.result.curves, paper)
        assert entry.joint is not None and entry.joint.result.run_id == joints[seed].run_id
    row = next(r for r in board.rows if r.method == "vanilla")
    s = [ranked[("vanilla", seed)].metrics.S_delta for seed in row.seeds]
    assert row.stats["S_delta"] == Stat.of(s)
    assert row.stats["S_delta"].n == len(s) >= 2
    assert board.reference_row is not None and board.reference_row.method == "joint"


def test_adding_a_better_learner_moves_no_other_methods_P_delta(tmp_path: Path) -> None:
    results = real_results()
    root = write_results(tmp_path / "r", results)
    (before,) = summarize(load_folder(root).entries)
    # a submitted method that learns the new classes better than anything before
    for seed in sorted({r.seed for r in results if r.method.spec == "vanilla"}):
        save_result(root, clone(by_method(results)[("vanilla", seed)], method="vanilla+init", new_boost=0.2))
    (after,) = summarize(load_folder(root).entries)
    assert "vanilla+init" in {r.method for r in after.rows}
    for r in results:
        if r.is_reference:
            continue
        old = next(e for e in before.ranked_runs if e.run_id == r.run_id)
        new = next(e for e in after.ranked_runs if e.run_id == r.run_id)
        assert new.metrics == old.metrics  # P_Δ under the protocol's reference set: unchanged
        assert new.p_delta_paper > old.p_delta_paper  # the paper's form (best of the ranked runs) moves
    assert after.best_new == before.best_new


@pytest.mark.parametrize("bad", [5.0, float("nan")])
def test_a_run_with_impossible_accuracies_is_apart_and_moves_no_one(tmp_path: Path, bad: float) -> None:
    results = real_results()
    root = write_results(tmp_path / "r", results)
    (before,) = summarize(load_folder(root).entries)
    vanilla0 = by_method(results)[("vanilla", 0)]
    broken = clone(vanilla0)  # a newer vanilla seed-0 run: it would supersede the reference if it counted
    broken.curves[0].new[3] = bad
    save_result(root, broken)
    (after,) = summarize(load_folder(root).entries)
    reasons = {e.run_id: e.reason for e in after.unranked}
    assert "accuracies are fractions in [0, 1]" in reasons[broken.run_id]
    assert {e.run_id: e.metrics for e in after.ranked_runs} == {e.run_id: e.metrics for e in before.ranked_runs}
    assert {e.run_id: e.p_delta_paper for e in after.ranked_runs} == {e.run_id: e.p_delta_paper for e in before.ranked_runs}


@pytest.mark.parametrize("seed, said", [(-3, "greater than or equal to 0"), (2**31, "less than or equal to 2147483647"),
                                        (True, "a valid integer")])
def test_a_result_with_a_seed_no_run_can_have_is_skipped_and_refused_by_validate(tmp_path: Path, seed, said) -> None:
    """A seed outside what ``bench run`` accepts was not made by a run; counted, it would add a seed to a row."""
    results = real_results()
    root = write_results(tmp_path / "r", results)
    vanilla0 = by_method(results)[("vanilla", 0)]
    path = root / "runs" / "edited.json"
    path.write_text(json.dumps({**json.loads(vanilla0.model_dump_json()), "run_id": "edited", "seed": seed}))
    loaded = load_folder(root)
    assert "edited" not in {e.run_id for e in loaded.entries}
    assert any(str(path) in where and said in why for where, why in loaded.skipped), loaded.skipped
    out = CliRunner().invoke(main, ["validate", str(path)])
    assert out.exit_code == 2 and f"seed: Input should be {said}" in out.output, out.output


def test_a_joint_run_with_other_settings_is_never_A_joint(tmp_path: Path) -> None:
    results = real_results()
    joint0 = by_method(results)[("joint", 0)]
    tweaked = clone(joint0, config={**joint0.config, "lr": 0.5}, shift=-0.3)  # newer, as `-m joint --set` made them
    with_mods = clone(joint0, method="joint+sgm", shift=-0.3)
    root = write_results(tmp_path / "r", results + [tweaked, with_mods])
    (board,) = summarize(load_folder(root).entries)
    assert board.joints[0].run_id == joint0.run_id
    reasons = {e.run_id: e.reason for e in board.unranked}
    assert "other settings than the protocol's joint section" in reasons[tweaked.run_id]
    assert "other settings than the protocol's joint section" in reasons[with_mods.run_id]


def test_a_set_variant_gets_its_own_row_never_averaged_with_the_defaults(tmp_path: Path) -> None:
    results = real_results()
    vanillas = [r for r in results if r.method.spec == "vanilla"]
    tuned = [clone(r, shift=-0.1, config={**r.config, "lr": 2e-3}, overrides={"lr": 2e-3}) for r in vanillas]
    root = write_results(tmp_path / "r", results + tuned)
    (board,) = summarize(load_folder(root).entries)
    rows = {r.method: r for r in board.rows}
    assert set(rows) >= {"vanilla", "vanilla [lr=0.002]"}
    assert {e.run_id for e in rows["vanilla"].runs} == {r.run_id for r in vanillas}
    assert {e.run_id for e in rows["vanilla [lr=0.002]"].runs} == {r.run_id for r in tuned}
    assert not any(e.reason and e.reason.startswith("superseded") for e in board.unranked)
    # the label comes from the overrides stored with the run: the leaderboard never rebuilds a method
    assert all(e.result.overrides == {"lr": 2e-3} for e in rows["vanilla [lr=0.002]"].runs)


def test_rows_are_ordered_by_CK_delta_and_wall_time_is_never_marked(results_dir: Path) -> None:
    (board,) = summarize(load_folder(results_dir).entries)
    ck = [r.stats["CK_delta"].mean for r in board.rows]
    assert ck == sorted(ck) and len(board.rows) >= 3
    assert all(r.marks["wall"] == "" for r in board.rows)
    assert {r.marks["S_delta"] for r in board.rows} >= {"best"}
    site = results_dir.parent / "site-order"
    build_site(load_folder(results_dir), site)
    index = (site / "index.html").read_text()
    wall = index[index.index('data-col="wall"'):].split("</th>")[0]
    assert "data-dir" not in wall and "button" not in wall and "never ranked" in wall


def test_values_that_read_the_same_are_tied() -> None:
    tflops = COLUMN_BY_KEY["tflops"]
    # 0.1234 and 0.1236 both read 0.12: neither is better; 0.004 reads 4.00e-03 and is best
    values = [rank_value(Stat(v, None, 1), tflops) for v in (0.1234, 0.1236, 0.004, 0.31)]
    assert marks(values, "min") == ["second", "second", "best", ""]


def test_marks_follow_the_paper() -> None:
    assert marks([0.1, 0.3, 0.2, 0.1], "min") == ["best", "", "second", "best"]
    assert marks([70.0, 72.0, None], "max") == ["second", "best", ""]
    assert marks([400.0, 400.0], "min") == ["", ""]  # all tied: nothing to mark


def test_unranked_runs_are_listed_with_their_reason(tmp_path: Path) -> None:
    results = real_results()
    runs = by_method(results)
    vanilla0 = runs[("vanilla", 0)]
    stale = clone(vanilla0, method="vanilla+lora", protocol=vanilla0.protocol.model_copy(update={"hash": "0123456789abcdef"}))
    failed = clone(vanilla0, method="vanilla+oocf", status="failed")
    no_joint = clone(vanilla0, method="vanilla+soft", seed=7)
    lonely = clone(vanilla0, method="vanilla+init")  # one seed where the other methods have more: shown, marked
    root = write_results(tmp_path / "r", results + [stale, failed, no_joint, lonely])
    (board,) = summarize(load_folder(root).entries)
    reasons = {e.run_id: e.reason for e in board.unranked}
    assert reasons[stale.run_id].startswith("stale protocol hash 0123456789abcdef")
    assert reasons[failed.run_id].startswith("status 'failed'")
    assert reasons[no_joint.run_id].startswith("no joint reference for seed 7")
    assert lonely.run_id not in reasons
    ranked_ids = {e.run_id for e in board.ranked_runs}
    assert not ranked_ids & {stale.run_id, failed.run_id, no_joint.run_id}
    assert {r.method for r in board.rows} == {r.method.spec for r in results if not r.is_reference} | {"vanilla+init"}
    assert [r.partial for r in board.rows if r.method == "vanilla+init"] == [True]
    # A_best per seed comes from the protocol's reference set (vanilla) alone
    assert board.best_new == {r.seed: best_new_accuracy([r.curves]) for r in results if r.method.spec == "vanilla"}

    site = tmp_path / "site"
    build_site(load_folder(root), site)
    index = (site / "index.html").read_text()
    section = index.split("Not ranked (")[1]
    for run_id in (stale.run_id, failed.run_id, no_joint.run_id):
        assert run_id in section
    assert "no joint reference for seed 7" in section
    # the method with fewer seeds is a row of the table, marked with its n
    assert lonely.run_id not in section
    ranked = index.split("Not ranked (")[0]
    row = ranked.split('data-method="vanilla+init"')[1].split("</tr>")[0]
    assert lonely.run_id in row and " of " in row.split('data-col="seeds"')[1].split("</td>")[0]


def test_unknown_protocol_uses_the_majority_hash(tmp_path: Path) -> None:
    results = real_results()
    renamed = [r.model_copy(update={"protocol": r.protocol.model_copy(update={"name": "my_protocol", "hash": "a" * 16})})
               for r in results]
    odd = clone(by_method(renamed)[("vanilla", 0)], method="vanilla+sgm",
                protocol=renamed[0].protocol.model_copy(update={"hash": "b" * 16}))
    root = write_results(tmp_path / "r", renamed + [odd])
    (board,) = summarize(load_folder(root).entries)
    assert board.current_hash == "a" * 16 and "majority" in board.hash_origin
    assert board.rows
    assert {e.run_id: e.reason for e in board.unranked}[odd.run_id].startswith("stale protocol hash")


# ----------------------------------------------------------------------------------- the site


def test_build_writes_a_self_contained_site(results_dir: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    result = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--out", str(site)])
    assert result.exit_code == 0, result.output
    index = (site / "index.html").read_text()
    results = real_results()
    for r in results:
        assert (site / "runs" / f"{r.run_id}.html").is_file()
        copied = site / "runs" / f"{r.run_id}.json"
        assert load_result(copied) == load_result(next(results_dir.rglob(f"*{r.run_id}.json")))
    for method in {r.method.spec for r in results}:
        assert method in index
    plots = sorted((site / "plots").glob("*.svg"))
    assert {p.stem for p in plots} == {"tiny_cil-old", "tiny_cil-new", "tiny_cil-all", "tiny_cil-pretrain", "tiny_cil-old-avg",
                                       "tiny_cil-old-tflops", "tiny_cil-new-tflops", "tiny_cil-all-tflops"}
    for p in plots + sorted((site / "runs").glob("*.svg")):
        ET.parse(p)  # well-formed SVG
        assert 'src="plots/' + p.name + '"' in index or p.parent.name == "runs"
    # no CDN, no absolute links: it works from file:// and any static host
    for page in html_files(site):
        text = page.read_text()
        # nothing is loaded from elsewhere; the one kind of outbound link is a row's paper (a.paper), never a resource
        local = re.sub(r'<a class="paper" href="https://[^"]*"', "", text.replace('href="http://127.0.0.1:5000', ""))
        assert not re.search(r'(src|href)="(https?:)?//', local), page
    assert (site / "static" / "style.css").is_file() and (site / "static" / "leaderboard.js").is_file()
    glossary = (site / "glossary.html").read_text()
    for word in ("stability gap", "plasticity gap", "continual knowledge gap", "A<sub>joint</sub>", "A<sub>best</sub>",
                 "↓ lower is better", "↑ higher is better"):
        assert word in glossary
    # per run: config, hash, seed, distribution and version, library versions, commit, links
    vanilla = by_method(results)[("vanilla", 0)]
    page = (site / "runs" / f"{vanilla.run_id}.html").read_text()
    for text in (vanilla.protocol.hash, vanilla.method.distribution, vanilla.method.version, f"{vanilla.run_id}.json",
                 vanilla.versions["torch"], "Method config", "Library versions"):
        assert text in page
    if vanilla.git_commit:
        assert vanilla.git_commit in page
    # the references the page used are named
    assert "References used" in index and vanilla.references is not None


def test_rebuilds_over_itself_but_never_over_other_files(results_dir: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    runner = CliRunner()
    assert runner.invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--out", str(site)]).exit_code == 0
    assert runner.invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--out", str(site)]).exit_code == 0
    other = tmp_path / "precious"
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    bad = runner.invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--out", str(other)])
    assert bad.exit_code == 2 and "not empty" in bad.output
    assert (other / "thesis.tex").read_text() == "x"
    missing = runner.invoke(main, ["leaderboard", "build", "--results-dir", str(tmp_path / "nope"), "--out", str(site)])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    both = runner.invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--tracking-uri", "sqlite:///x.db",
                                "--out", str(site)])
    assert both.exit_code == 2 and "not both" in both.output


def test_an_empty_results_folder_builds_an_empty_site(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    runner = CliRunner()
    result = runner.invoke(main, ["leaderboard", "build", "--results-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    assert "No results yet" in (tmp_path / "s" / "index.html").read_text()
    table = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(tmp_path / "empty")])
    assert table.exit_code == 0 and "No results" in table.stdout


def test_names_a_plugin_chooses_are_escaped(tmp_path: Path) -> None:
    results = real_results()
    runs = by_method(results)
    evil = [clone(runs[("vanilla", s)], method=EVIL, config={"lr": '"><img src=x onerror=alert(2)>'})
            for s in sorted({s for m, s in runs if m == "vanilla"})]
    root = write_results(tmp_path / "r", results)
    for i, r in enumerate(evil):  # save_result would turn the "/" of the name into folders
        (root / "runs" / "tiny_cil" / f"evil{i}.json").write_text(r.model_dump_json())
    site = tmp_path / "site"
    build_site(load_folder(root), site)
    index = (site / "index.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in index
    for page in html_files(site):
        text = page.read_text()
        assert EVIL not in text, page
        assert "<img src=x" not in text, page
    assert any("&lt;script&gt;" in p.read_text() for p in (site / "plots").glob("*.svg"))
    text_table = format_table(summarize(load_folder(root).entries))
    assert EVIL in text_table  # the Markdown table is plain text: the name as it is


def test_corrupt_and_foreign_json_are_skipped_with_a_warning(results_dir: Path, tmp_path: Path) -> None:
    folder = results_dir / "runs" / "tiny_cil"
    corrupt = folder / "vanilla" / "seed9-truncated.json"
    corrupt.write_text(next(folder.rglob("*.json")).read_text()[:200])
    foreign = folder / "package.json"
    foreign.write_text(json.dumps({"name": "left-pad", "version": "1.3.0"}))
    binary = folder / "weird.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    site = tmp_path / "site"
    result = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(results_dir), "--out", str(site)])
    assert result.exit_code == 0, result.output
    stderr = result.stderr
    for bad in (corrupt, foreign, binary):
        assert f"warning: skipped {bad}" in stderr
    assert "3 file(s) skipped" in result.stdout
    index = (site / "index.html").read_text()
    assert "Skipped files (3)" in index and str(foreign) in index
    assert "vanilla" in index and "<td" in index


def test_reported_numbers_sit_beside_measured_ones_never_mixed(tmp_path: Path) -> None:
    reported = load_reported()
    paper = {"cil_places_lt", "iid_places_lt", "cil_places_std_192k", "cil_places_std_24k", "online_cub_80k",
             "online_cub_20k", "cil_places_lt_balanced", "cil_places_lt_norehearsal",
             "cil_convnextv1_places_lt", "cil_mobilevit_places_lt", "cil_places_std_unlimited"}
    assert set(reported) == paper
    for name in paper:
        load_protocol(name)  # every key is a built-in protocol
    table1 = reported["cil_places_lt"][0]
    sgm = next(r for r in table1.rows if r.method == "vanilla+sgm")
    assert (sgm.S_delta, sgm.P_delta, sgm.CK_delta, sgm.sigma, sgm.mu, sgm.alpha) == (0.006, 0.082, 0.002, 77.64, 73.70, 70.30)
    assert reported["cil_places_lt"][1].rows[1].S_delta == [0.020, 0.0017]  # Table 3: mean, std over 6 orderings
    # our real results restamped as cil_places_lt: the paper's Tables 1 and 3 appear beside them
    root = write_results(tmp_path / "r", real_results("cil_places_lt"))
    site = tmp_path / "site"
    build_site(load_folder(root), site)
    index = (site / "index.html").read_text()
    section = index.split('id="p-cil_places_lt"')[1].split("</section>")[0]
    measured = section.split('class="board measured-table')[1].split("</table>")[0]
    assert "Naive Finetune" not in measured and "reported" not in measured
    assert section.count('class="board reported-table"') == 2
    assert "Table 1" in section and "Table 3" in section and "77.64" in section
    # protocols with reported numbers but no results are still listed, apart
    assert "Reported in the paper, not measured here yet" in index and "online_cub_20k" in index


def test_table_command_prints_the_same_aggregates(results_dir: Path) -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(results_dir), "--protocol", "tiny_cil"])
    assert out.exit_code == 0, out.output
    (board,) = summarize(load_folder(results_dir).entries)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("## tiny_cil")
    header = next(line for line in lines if line.startswith("| method"))
    assert all(c.symbol in header for c in COLUMNS)
    for row in board.rows:
        line = next(line for line in lines if line.startswith(f"| {row.method} |"))
        mean = f"{row.stats['S_delta'].mean:.3f}"
        assert mean in line and f"| {len(row.runs)} |" in line
    assert any(line.startswith("| joint (upper bound)") for line in lines)
    text = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(results_dir), "--format", "text"])
    assert text.exit_code == 0 and "S_Δ" in text.stdout and "|" not in text.stdout
    # the tidy per-run frame behind the table: one row per ranked run and joint in use, same means
    csv = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(results_dir), "--format", "csv"])
    assert csv.exit_code == 0, csv.output
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert sorted(frame["run_id"]) == sorted([e.run_id for e in board.ranked_runs] + [e.run_id for e in board.joints.values()])
    for row in board.rows:
        assert frame[frame["method"] == row.method]["S_delta"].mean() == pytest.approx(row.stats["S_delta"].mean)
    assert frame[frame["is_reference"]]["S_delta"].isna().all()
    unknown = runner.invoke(main, ["leaderboard", "table", "--results-dir", str(results_dir), "--protocol", "tiny_cl"])
    assert unknown.exit_code == 2 and "tiny_cil" in unknown.output


@pytest.mark.parametrize("ui", ["javascript:alert(1)", "JavaScript://%0Aalert(1)", "data:text/html,x", "mlflow:5000",
                                "http://", "ftp://mlflow.example"])
def test_an_mlflow_ui_that_is_not_an_http_address_is_refused_before_anything_is_read(ui, tmp_path: Path) -> None:
    from support import refused

    site = tmp_path / "site"
    out = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(tmp_path / "none"), "--out", str(site),
                                    "--mlflow-ui", ui])
    refused(out, f"--mlflow-ui {ui!r}: the MLflow UI's address is an http:// or https:// URL with a host", lines=1)
    assert not site.exists()
    with pytest.raises(BenchError, match="--mlflow-ui"):  # the library entry point too
        build_site(load_folder(tmp_path), site, mlflow_ui=ui)


def test_tracking_uri_reads_the_json_artifacts_from_mlflow(results_dir: Path, tmp_path: Path, seeded_store) -> None:
    from bench_stability_gap.harness.results.tracking import default_tracking_uri, log_run

    seeded_store(results_dir)

    from bench_stability_gap.leaderboard.sources import load_mlflow

    logged = {}
    for path in sorted((results_dir / "runs").rglob("*.json")):
        r = load_result(path)
        if not r.is_reference:  # as `bench run` does: the CL run goes to MLflow, its joint stays a file
            logged[r.run_id] = log_run(r, path, results_dir)
    uri = default_tracking_uri(results_dir)
    site = tmp_path / "site"
    result = CliRunner().invoke(main, ["leaderboard", "build", "--tracking-uri", uri, "--out", str(site),
                                       "--mlflow-ui", "http://mlflow.example:5000"])
    assert result.exit_code == 0, result.output
    from_folder = {e.run_id for b in summarize(load_folder(results_dir).entries) for e in b.ranked_runs}
    from_mlflow = summarize(load_mlflow(uri).entries)
    assert {e.run_id for b in from_mlflow for e in b.ranked_runs} == from_folder
    assert all(e.mlflow is not None for b in from_mlflow for e in b.ranked_runs)
    for run_id, mlflow_id in logged.items():
        page = (site / "runs" / f"{run_id}.html").read_text()
        assert "http://mlflow.example:5000/#/experiments/" in page and f"/runs/{mlflow_id}" in page
    # a folder build finds the same MLflow runs through the store beside the results
    site2 = tmp_path / "site2"
    build_site(load_folder(results_dir), site2)
    run_id, mlflow_id = next(iter(logged.items()))
    page = (site2 / "runs" / f"{run_id}.html").read_text()
    assert f"/runs/{mlflow_id}" in page and "mlflow ui --backend-store-uri" in page


def test_a_run_page_names_its_row_and_how_its_settings_were_chosen(results_dir: Path, tmp_path: Path) -> None:
    """A run made with --set (or tuned) had the same title and heading as a default run of the method."""
    base = next(r for r in real_results() if r.method.spec == "vanilla" and r.seed == 0)
    varied = base.model_copy(update={"run_id": "handset00001", "overrides": {"lr": 0.002}})
    save_result(results_dir, varied)
    site = tmp_path / "site"
    build_site(load_folder(results_dir), site)
    page = (site / "runs" / "handset00001.html").read_text()
    assert "<title>vanilla [lr=0.002] · seed 0" in page and "set by hand" in page, page[:600]
    default = (site / "runs" / f"{base.run_id}.html").read_text()
    assert "<title>vanilla · seed 0" in default and "· defaults" in default
    # every run page says how to check it, and what arithmetic it was made with
    stored = next((results_dir / "runs").rglob(f"*{base.run_id}.json"))
    assert f"bench reproduce {stored}" in default
    assert f"<code class=\"wrap\">{base.options.get('numerics') or 'unrecorded'}</code>" in default


def test_a_site_of_100_results_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Scale smoke test: 10 seeds x 9 methods + joints build one board with every method ranked. The time
    is printed, not asserted (speed targets live in benchmarks: machines are shared)."""
    results = real_results()
    runs = by_method(results)
    template_cl = runs[("vanilla", 0)]
    joint = runs[("joint", 0)]
    methods = ["vanilla", "output_only", "finetune", "vanilla+soft", "vanilla+init", "vanilla+oocf",
               "vanilla+lora", "vanilla+sgm", "output_only+sgm"]
    clones = []
    for seed in range(10):
        clones.append(clone(joint, seed=seed))
        for i, m in enumerate(methods):
            clones.append(clone(template_cl, method=m, seed=seed, shift=0.01 * ((i + seed) % 5 - 2)))
    assert len(clones) == 100
    root = write_results(tmp_path / "r", clones)
    t0 = time.perf_counter()
    report = build_site(load_folder(root), tmp_path / "site")
    seconds = time.perf_counter() - t0
    with capsys.disabled():
        print(f"\n[leaderboard] built 100 results ({report.pages} pages) in {seconds:.2f} s")
    assert len(report.boards[0].rows) == len(methods)
    assert report.pages >= 100  # a page per run, plus the index and glossary


# ---------------------------------------------------------------------------------- the browser

@pytest.mark.browser
def test_the_site_in_headless_chromium(tmp_path: Path) -> None:
    sync_api, chromium = playwright_and_chromium()

    results = real_results()
    real_site = tmp_path / "real"
    build_site(load_folder(write_results(tmp_path / "r1", results)), real_site)
    # a second site with a hostile method name and an SGM-family clone, for escaping and the filter
    runs = by_method(results)
    seeds = sorted({s for m, s in runs if m == "vanilla"})
    extra = [clone(runs[("vanilla", s)], method="vanilla+sgm", shift=0.02) for s in seeds]
    extra += [clone(runs[("vanilla", s)], method="vanilla+nmc", shift=0.01) for s in seeds]  # the head family
    evil = [clone(runs[("vanilla", s)], method=EVIL, shift=-0.01) for s in seeds]
    root2 = write_results(tmp_path / "r2", results + extra)
    for i, r in enumerate(evil):
        (root2 / "runs" / "tiny_cil" / f"evil{i}.json").write_text(r.model_dump_json())
    other_site = tmp_path / "other"
    build_site(load_folder(root2), other_site)

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=chromium, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000})
        try:
            page = context.new_page()
            errors: list[str] = []
            dialogs: list[str] = []
            requests: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("request", lambda r: requests.append(r.url))

            page.goto((real_site / "index.html").as_uri())
            page.wait_for_load_state("load")
            table = page.locator("table.measured-table").first
            rows = table.locator("tbody.ranked tr[data-family]")
            assert rows.count() >= 2

            def order() -> list[str]:
                return rows.evaluate_all("rs => rs.map(r => r.dataset.method)")

            def values(col: str) -> dict[str, float]:
                return dict(rows.evaluate_all(
                    f"rs => rs.map(r => [r.dataset.method, parseFloat(r.querySelector('[data-col=\"{col}\"]').dataset.value)])"))

            # sorting: S_Δ ascending, then descending reverses it
            before = order()
            s_delta = values("S_delta")
            header = table.locator('th[data-col="S_delta"]')
            header.locator("button").click()
            assert header.get_attribute("aria-sort") == "ascending"
            assert order() == sorted(before, key=lambda m: s_delta[m])
            header.locator("button").click()
            assert header.get_attribute("aria-sort") == "descending"
            assert order() == sorted(before, key=lambda m: -s_delta[m])
            assert order() != before
            # higher-is-better columns sort best first on the first click
            alpha = values("alpha")
            table.locator('th[data-col="alpha"] button').click()
            assert order() == sorted(before, key=lambda m: -alpha[m])
            assert table.locator("td.best").count() >= 1

            # the plots are there and loaded
            plots = page.locator(".plots img")
            assert plots.count() == 5
            widths = plots.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            assert all(w > 0 for w in widths), widths

            page.locator('th[data-col="CK_delta"] button').first.click()  # back to the default order
            page.screenshot(path=str(artifacts / "leaderboard-index.png"), full_page=True)

            for sub in sorted((real_site / "runs").glob("*.html"))[:2] + [real_site / "glossary.html"]:
                page.goto(sub.as_uri())
                page.wait_for_load_state("load")

            # hostile names stay text; the family filter shows SGM methods only
            page.goto((other_site / "index.html").as_uri())
            page.wait_for_load_state("load")
            assert page.get_by_text(EVIL, exact=True).count() >= 1
            page.locator('button[data-filter="sgm"]').click()
            visible = page.locator("table.measured-table tbody.ranked tr[data-family]:visible")
            assert visible.evaluate_all("rs => rs.map(r => r.dataset.family)") == ["sgm"]
            page.locator('button[data-filter="base"]').click()
            families = visible.evaluate_all("rs => rs.map(r => r.dataset.family)")
            assert families and set(families) == {"base"}
            page.locator('button[data-filter="all"]').click()

            # the method-family filter (methods/metadata.py), combined with the SGM one, and the paper links
            page.locator('button[data-group-filter="head"]').click()
            assert visible.evaluate_all("rs => rs.map(r => r.dataset.method)") == ["vanilla+nmc"]
            assert visible.locator("a.paper", has_text="nmc paper").get_attribute("href") == \
                "https://arxiv.org/abs/2411.04723"
            page.locator('button[data-group-filter="rehearsal"]').click()
            groups = visible.evaluate_all("rs => rs.map(r => r.dataset.group)")
            assert groups and set(groups) == {"rehearsal"}
            page.locator('button[data-filter="sgm"]').click()
            assert visible.evaluate_all("rs => rs.map(r => r.dataset.method)") == ["vanilla+sgm"]
            page.locator('button[data-filter="all"]').click()
            page.locator('button[data-group-filter="all"]').click()
            # grouping: rows of a family together, in the families' order
            page.locator("button.group-rows").click()
            ranked = page.locator("table.measured-table").first.locator("tbody.ranked tr[data-group]")
            shown = ranked.evaluate_all("rs => rs.map(r => r.dataset.group)")
            rank = ["baseline", "rehearsal", "regularisation", "head", "other"]
            assert len(set(shown)) >= 3 and [rank.index(g) for g in shown] == sorted(rank.index(g) for g in shown)

            assert errors == [], errors
            assert dialogs == [], dialogs
            assert all(u.startswith(("file:", "data:")) for u in requests), [u for u in requests if not u.startswith("file:")]
        finally:
            context.close()
    assert (artifacts / "leaderboard-index.png").stat().st_size > 10_000
