"""The site fits its window, in headless Chromium, on a site built from 4 methods × 3 seeds whose numbers
spread as real runs do (so every cell carries its interval and the paired column its p and seed count):

- at 1280 × 800 the index table needs no sideways scroll and every method row, the joint row too, is above
  the fold (the Method cell is two short lines, the paired difference and its test two more);
- at 390 × 844 the figures scale to the column, the glossary reflows to the window, and the "no method of
  this family" note the filters keep hidden stays hidden on the phone's cards;
- a run page shows its options as tables of rounded numbers and sizes, never a Python repr or raw bytes.

Screenshots go to test-artifacts/ (or $BENCH_SHOTS) for a human to look at."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS, playwright_and_chromium, wait_until_loaded, shots_dir
from results_factory import joint_run, spread_run

from bench_stability_gap.harness.results.schema import save_result
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder

REPO = Path(__file__).resolve().parents[1]
METHODS = ("vanilla", "vanilla+sgm", "derpp", "lwf")
# a real run's options (the first-run sample's): the data-path plan with its byte counts and shares
REAL_OPTIONS = json.loads((REPO / "docs" / "first-run" / "tiny_cil_quick-vanilla-seed0.json").read_text())["options"]

TABLE_JS = """() => {
  const t = document.querySelector('table.measured-table'), w = t.closest('.table-wrap');
  const rows = [...t.querySelectorAll('tbody tr[data-method], tbody.reference tr')];
  return {table: t.getBoundingClientRect().width, scroll: w.scrollWidth, box: w.clientWidth,
          bottoms: rows.map(r => r.getBoundingClientRect().bottom), page: document.documentElement.scrollWidth};
}"""


def _site(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for seed in (0, 1, 2):
        save_result(root, joint_run(f"j{seed}", seed).model_copy(update={"options": REAL_OPTIONS}))
        for i, method in enumerate(METHODS):
            run = spread_run(f"{method.replace('+', '_')}-{seed}", method, seed, skill=0.02 * i)
            save_result(root, run.model_copy(update={"options": REAL_OPTIONS}))
    site = tmp_path / "site"
    build_site(load_folder(root), site)
    return site


def _desktop(page, site: Path, shots: Path) -> None:
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto((site / "index.html").as_uri())
    # the cells are as wide as real ones: an interval under each mean, a p and a seed count in the paired column
    assert "power" in page.locator('tr[data-method="derpp"] td[data-col="paired"]').inner_text()
    assert page.locator('tr[data-method="derpp"] td[data-col="CK_delta"] .ci').inner_text().startswith("[")
    fit = page.evaluate(TABLE_JS)
    assert fit["scroll"] <= fit["box"], fit  # the table needs no sideways scroll
    assert fit["page"] <= 1280
    assert len(fit["bottoms"]) == len(METHODS) + 1  # the four methods and the joint model
    assert max(fit["bottoms"]) <= 800, fit  # every row above the fold
    # the Method cell is compact: two short lines, the rest in its title
    heights = page.eval_on_selector_all("tbody.ranked th.method-col", "ths => ths.map(t => t.getBoundingClientRect().height)")
    assert max(heights) <= 60, heights
    title = page.locator('tr[data-method="derpp"] th.method-col').get_attribute("title")
    assert "settings: defaults" in title and "bench-stability-gap" in title and "seeds 0, 1, 2" in title
    # the paired difference on one line, its test on the next
    paired = page.locator('tr[data-method="derpp"] td[data-col="paired"]')
    assert paired.locator(".v").inner_text().count("[") == 1 and paired.locator(".sd").inner_text().startswith("p")
    page.screenshot(path=str(shots / "fit-index-1280x800.png"))


def _phone(page, site: Path, shots: Path) -> None:
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto((site / "index.html").as_uri())
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    # the note the family filters show when nothing matches stays hidden while rows show
    assert not page.locator("tr.filtered-out").first.is_visible()
    assert page.locator("tr.filtered-out:visible").count() == 0
    page.locator('button[data-group-filter="head"]').click()  # no method of that family on this board
    assert page.locator("tr.filtered-out").first.is_visible()
    assert page.locator("tbody.ranked tr[data-method]:visible").count() == 0
    page.locator('button[data-group-filter="all"]').click()
    # every figure within its column
    for figure in page.locator("figure.plot").all():
        image = figure.locator("img")
        wait_until_loaded(page, image)
        img, box = image.bounding_box(), figure.bounding_box()
        assert img is not None and box is not None
        assert img["width"] > 200 and img["x"] >= box["x"] - 1 and img["x"] + img["width"] <= box["x"] + box["width"] + 1
        assert box["x"] + box["width"] <= 390
    page.locator("figure.plot-old").first.screenshot(path=str(shots / "fit-old-class-plot-390.png"))
    page.screenshot(path=str(shots / "fit-index-390x844.png"))
    # the glossary reflows: no wider than the window, every term's definition inside it
    page.goto((site / "glossary.html").as_uri())
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    rights = page.eval_on_selector_all("table.glossary td", "tds => tds.map(t => t.getBoundingClientRect().right)")
    assert rights and max(rights) <= 390
    page.screenshot(path=str(shots / "fit-glossary-390x844.png"))


def _run_page(page, site: Path, shots: Path) -> None:
    run = next(p for p in sorted((site / "runs").glob("derpp*.html")))
    for width in (1280, 390):
        page.set_viewport_size({"width": width, "height": 844})
        page.goto(run.as_uri())
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        options = page.locator("section.run-options").inner_text()
        path = REAL_OPTIONS["data_path"]  # the stored sample's own sizes, as raw bytes and as the page shows them
        ram, disk = path["ram_budget"], path["disk_budget"]
        assert "{'" not in options and "13.714285714285714" not in options and str(ram) not in options
        assert f"{ram / 1e9:.2f} GB" in options and f"{disk / 1e9:.2f} GB" in options
        assert "13.71" in options and "80 × 2 × 2" in options
        assert "trunk-ram" in options
        page.locator("section.run-options").screenshot(path=str(shots / f"fit-run-options-{width}.png"))


@pytest.mark.browser
def test_site_fits_desktop_and_phone(tmp_path: Path) -> None:
    sync_api, chromium = playwright_and_chromium()
    site, shots = _site(tmp_path), shots_dir()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            _desktop(page, site, shots)
            _phone(page, site, shots)
            _run_page(page, site, shots)
        finally:
            browser.close()
