"""The index read at a glance, in headless Chromium at a desktop (1280 px) and a phone (390 px) width: the
Method column stays in view when the table scrolls, the gap columns with their paired difference fit the
desktop window, the phone gets one card per method and figures that fit its column, no two methods of a board share a colour, and the
glossary renders its HTML. Screenshots go to test-artifacts/ (or $BENCH_SHOTS) for a human to look at."""

from __future__ import annotations

from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS, playwright_and_chromium, wait_until_loaded, shots_dir
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.results.schema import save_result
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder

METHODS = ("vanilla", "vanilla+sgm", "finetune", "output_only", "gdumb", "lwf", "derpp", "remind+sgm")
GAP_COLUMNS = ("seeds", "S_delta", "P_delta", "P_delta_paper", "CK_delta", "paired")

# every box's right and left edge against the viewport, for the columns named
EDGES_JS = """([method, cols]) => {
  const row = document.querySelector('tr[data-method="' + method + '"]');
  const box = el => { const r = el.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width}; };
  const out = {method: box(row.querySelector('th.method-col'))};
  for (const c of cols) out[c] = box(row.querySelector('[data-col="' + c + '"]'));
  return out;
}"""


def _site(tmp_path: Path) -> Path:
    root = tmp_path / "results"
    for seed in (0, 1, 2):
        save_result(root, joint_run(f"j{seed}", seed))
        for i, method in enumerate(METHODS):
            run = two_session_run(f"{method.replace('+', '_')}-{seed}", method, seed, lift=0.03 * i + 0.01 * seed)
            save_result(root, run)
    site = tmp_path / "site"
    build_site(load_folder(root), site)
    return site


@pytest.mark.browser
def test_index_at_a_glance_desktop_and_phone(tmp_path: Path) -> None:
    sync_api, chromium = playwright_and_chromium()
    site, shots = _site(tmp_path), shots_dir()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((site / "index.html").as_uri())
            # every method of the 8-method board has a colour of its own, in the table and in the plots
            colours = page.eval_on_selector_all("table.measured-table tbody.ranked th.method-col svg.swatch line",
                                                "els => els.map(e => e.getAttribute('stroke'))")
            assert len(colours) == len(METHODS) and len(set(colours)) == len(METHODS), colours
            # the gap columns, the paired difference and n are in the window without scrolling
            edges = page.evaluate(EDGES_JS, ["vanilla+sgm", [*GAP_COLUMNS, "sigma", "mu", "alpha"]])
            for col in ("method", *GAP_COLUMNS, "sigma", "mu", "alpha"):
                assert edges[col]["width"] > 0 and 0 <= edges[col]["left"] and edges[col]["right"] <= 1280, (col, edges)
            assert not page.locator('tr[data-method="vanilla"] td[data-col="wall"]').is_visible()
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
            page.screenshot(path=str(shots / "index-1280px.png"))
            # a laptop's 800 px: at least five of the eight ranked rows are above the fold
            page.set_viewport_size({"width": 1280, "height": 800})
            bottoms = page.eval_on_selector_all("tbody.ranked tr[data-method]",
                                                "rs => rs.map(r => r.getBoundingClientRect().bottom)")
            assert len([b for b in bottoms if b <= 800]) >= 5, bottoms
            page.set_viewport_size({"width": 1280, "height": 900})
            wait_until_loaded(page, page.locator("figure.plot-old img").first)
            page.locator("figure.plot-old").first.screenshot(path=str(shots / "stability-gap-figure-1280px.png"))
            # every column shown: the table scrolls, and the Method column stays where it was
            page.locator("button.toggle-extra").click()  # #P, budget and time
            page.locator("button.toggle-optional").click()
            wrap = page.locator("figure.measured .table-wrap").first
            assert wrap.evaluate("w => w.scrollWidth > w.clientWidth + 100")
            before = page.evaluate(EDGES_JS, ["vanilla+sgm", ["S_delta"]])
            wrap.evaluate("w => { w.scrollLeft = w.scrollWidth; }")
            after = page.evaluate(EDGES_JS, ["vanilla+sgm", ["S_delta", "wall"]])
            assert after["S_delta"]["left"] < before["S_delta"]["left"] - 100  # the table did scroll
            assert after["method"]["left"] == pytest.approx(before["method"]["left"], abs=1)
            assert 0 <= after["wall"]["left"] and after["wall"]["right"] <= 1280
            wrap.scroll_into_view_if_needed()
            page.screenshot(path=str(shots / "index-1280px-scrolled.png"))

            # a phone: one card per method, labelled values, nothing wider than the window
            page.set_viewport_size({"width": 390, "height": 844})
            page.goto((site / "index.html").as_uri())
            assert page.evaluate("document.documentElement.scrollWidth") <= 390
            for method in METHODS:
                edges = page.evaluate(EDGES_JS, [method, list(GAP_COLUMNS)])
                for col in ("method", *GAP_COLUMNS):
                    assert edges[col]["width"] > 0 and 0 <= edges[col]["left"] and edges[col]["right"] <= 390, (method, col)
            label = page.locator('tr[data-method="vanilla+sgm"] td[data-col="S_delta"]').evaluate(
                "td => getComputedStyle(td, '::before').content")
            assert "S_Δ" in label
            page.locator("figure.measured").first.screenshot(path=str(shots / "index-390px-cards.png"))
            # the wide figure scales to the column: nothing of it is cut off at the window's edge
            figure = page.locator("figure.plot-old img").first
            wait_until_loaded(page, figure)
            assert 300 <= figure.evaluate("img => img.getBoundingClientRect().right - img.getBoundingClientRect().left")
            assert figure.evaluate("img => img.getBoundingClientRect().right") <= 390
            page.locator("figure.plot-old").first.screenshot(path=str(shots / "stability-gap-figure-390px.png"))

            # the glossary renders the catalog's HTML: a subscript, never the tag as text
            for width in (1280, 390):
                page.set_viewport_size({"width": width, "height": 900})
                page.goto((site / "glossary.html").as_uri())
                texts = page.eval_on_selector_all("table.glossary td, table.glossary th", "els => els.map(e => e.innerText)")
                assert texts and not [t for t in texts if "<sub>" in t or "<sup>" in t or "</" in t]
                assert page.locator("table.glossary td sub").count() > 10
                page.screenshot(path=str(shots / f"glossary-{width}px.png"))
        finally:
            browser.close()
