"""Build the leaderboard site from a results folder and screenshot one budget family's section (figure and
table) in headless Chromium, as a reader sees it: the picture a closing note or a report shows.

    python ci/screenshot_budget_curve.py RESULTS FAMILY OUT.png     (e.g. budget-curve tiny_cil_flops bc.png)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from bench_stability_gap.leaderboard.site import build_site
from bench_stability_gap.leaderboard.sources import load_folder


def main(results: str, family: str, out: str) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("chromium is not installed (bash ci/install.sh installs ci/browser-deps.txt)")
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        build_site(load_folder(Path(results)), site)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1300, "height": 900})
                page.goto((site / "index.html").as_uri())
                section = page.locator(f'section.budget-family[data-base="{family}"]')
                figure = section.locator("img.budget-curve")
                figure.scroll_into_view_if_needed()
                page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=figure.element_handle())
                section.screenshot(path=out)
            finally:
                browser.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
