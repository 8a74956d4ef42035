"""Each built-in method's family and paper (methods/metadata.py), and the leaderboard rows they label."""

from __future__ import annotations

import tomllib
from pathlib import Path

from bench_stability_gap.methods.metadata import FAMILIES, METADATA, method_family, method_papers

REPO = Path(__file__).resolve().parents[1]


def test_every_built_in_entry_point_has_metadata():
    groups = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    names = set(groups["bench.methods"]) | set(groups["bench.modifiers"])
    assert names <= set(METADATA), sorted(names - set(METADATA))
    assert all(i.family in FAMILIES or i.family is None for i in METADATA.values())
    assert all(i.url.startswith("https://") for i in METADATA.values())


def test_a_method_strings_family_is_its_last_familied_modifiers_else_its_bases():
    assert method_family("vanilla+sgm") == "rehearsal"        # SGM's parts keep the base's family
    assert method_family("derpp+lora+nmc") == "head"
    assert method_family("ewc+sgm") == "regularisation"
    assert method_family("someones_plugin+soft") == "other"
    assert [n for n, _, _ in method_papers("er_ace+sgm")] == ["er_ace", "sgm"]
    assert [n for n, _, _ in method_papers("vanilla+soft+oocf")] == ["vanilla"]  # one paper, listed once


def test_leaderboard_rows_carry_their_family_and_paper_link(tmp_path):
    from bench_stability_gap.leaderboard.site import build_site
    from bench_stability_gap.leaderboard.sources import load_folder
    from tests.test_leaderboard import by_method, clone, real_results, write_results

    results = real_results()
    runs = by_method(results)
    extra = [clone(runs[("vanilla", s)], method="vanilla+nmc") for m, s in runs if m == "vanilla"]
    build_site(load_folder(write_results(tmp_path / "r", results + extra)), tmp_path / "site")
    html = (tmp_path / "site" / "index.html").read_text()
    assert 'data-group="head" data-method="vanilla+nmc"' in html
    assert 'data-group="rehearsal" data-method="vanilla"' in html
    assert 'href="https://arxiv.org/abs/2411.04723"' in html and 'data-group-filter="regularisation"' in html
