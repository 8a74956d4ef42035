"""The run page in headless Chromium at a desktop (1280 px) and a phone (390 px) width: no box runs into
another, P_Δ (paper) reads the same as on the index, the optional columns toggle. Screenshots are written
to test-artifacts/ (ignored by git) for a human to look at."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS, playwright_and_chromium
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.results.schema import save_result
from bench_stability_gap.harness.results.comparability import CPU_KERNELS, CPU_THREADS
from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder

REPO = Path(__file__).resolve().parents[1]
LONG_PATH = "/mnt/shared/datasets/" + "/".join(f"very-long-folder-name-{i}" for i in range(8))

# Pairs of boxes on the run page that must not intersect: each block of the two-column grid against the
# blocks of the other column, and every key-value cell against its neighbours.
OVERLAPS_JS = """() => {
  const boxes = [];
  for (const sel of ['.grid2 > section', 'table.kv td', 'table.kv th', 'table.plain', 'pre.code', 'h2', 'h3']) {
    document.querySelectorAll(sel).forEach(el => { const r = el.getBoundingClientRect();
      if (r.width > 0 && r.height > 0) boxes.push({sel, el, r}); });
  }
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.el.contains(b.el) || b.el.contains(a.el)) continue;
    const w = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
    const h = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
    if (w > 1 && h > 1) hits.push(a.sel + ' x ' + b.sel + ': ' + (a.el.textContent || '').slice(0, 40) + ' | ' + (b.el.textContent || '').slice(0, 40));
  }
  // a box wider than its section runs under the neighbouring column even when no other box is hit
  document.querySelectorAll('.grid2 > section').forEach(s => { const sr = s.getBoundingClientRect();
    s.querySelectorAll('table, pre').forEach(t => { const r = t.getBoundingClientRect();
      if (r.right > sr.right + 1) hits.push('overflows its section: ' + t.className); }); });
  if (document.documentElement.scrollWidth > window.innerWidth + 1) hits.push('page wider than the window: ' + document.documentElement.scrollWidth);
  return hits;
}"""


@pytest.mark.browser
def test_run_page_layout_and_p_delta_paper(tmp_path: Path) -> None:
    sync_api, chromium = playwright_and_chromium()
    root = tmp_path / "a-results-folder-with-a-rather-long-name-as-on-a-shared-cluster"
    options = {"device": "cpu", "torch_threads": CPU_THREADS, "cpu_kernels": CPU_KERNELS, "data_path": {"tiny_cil": LONG_PATH, "imagenet": LONG_PATH + "/imagenet-1k"}}
    for seed in (0, 1):
        save_result(root, joint_run(f"j{seed}", seed))
        for method, lift in (("vanilla", 0.0), ("vanilla+sgm", 0.1)):
            r = two_session_run(f"{method.replace('+', '_')}{seed}", method, seed, lift=lift + 0.02 * seed)
            save_result(root, r.model_copy(update={"options": options}))
    site = tmp_path / "site"
    report = build_site(load_folder(root), site)
    (board,) = report.boards
    sgm = next(r for r in board.rows if r.method == "vanilla+sgm")

    artifacts = REPO / "test-artifacts"
    artifacts.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto((site / "index.html").as_uri())
            index_cell = page.locator('tr[data-method="vanilla+sgm"] td[data-col="P_delta_paper"] .v').inner_text()
            # optional columns: hidden, then shown by the toggle
            bwt = page.locator('tr[data-method="vanilla+sgm"] td[data-col="bwt"]')
            assert not bwt.is_visible()
            page.locator("button.toggle-optional").click()
            assert bwt.is_visible()
            run_values = []
            for e in sgm.runs:
                run_page = site / "runs" / f"{e.slug}.html"
                for width in (1280, 390):
                    page.set_viewport_size({"width": width, "height": 900})
                    page.goto(run_page.as_uri())
                    page.wait_for_load_state("load")
                    assert page.evaluate(OVERLAPS_JS) == [], (width, run_page.name)
                    page.screenshot(path=str(artifacts / f"run-page-{width}px.png"), full_page=True)
                cell = page.locator("table.kv tr", has=page.locator("th", has_text="P_Δ (paper)")).locator("td")
                run_values.append(float(cell.inner_text()))
            # the index shows the mean of the values the run pages show (as displayed: 3 decimals)
            assert run_values == pytest.approx([e.p_delta_paper for e in sgm.runs], abs=5e-4)
            assert float(index_cell) == pytest.approx(statistics.mean(run_values), abs=1e-3)
        finally:
            browser.close()
    for width in (1280, 390):
        assert (artifacts / f"run-page-{width}px.png").stat().st_size > 5_000
