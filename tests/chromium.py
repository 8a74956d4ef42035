"""Headless Chromium for the leaderboard's browser tests: one set of launch flags (no network, no GPU,
no first-run chores), the skip when Playwright or Chromium is missing, and the wait for an image to load."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import ModuleType

import pytest

# Playwright adds --headless (headless=True) and its own --user-data-dir
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def playwright_and_chromium() -> tuple[ModuleType, str]:
    """Playwright's sync API and the system Chromium's path; skips the test when either is missing."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (apt-get install chromium; CI installs ci/browser-deps.txt)")
    return sync_api, chromium


def wait_until_loaded(page, image) -> None:
    """Scroll ``image`` (a locator) into view and wait until the browser has decoded it: lazy images load
    only when near the viewport, and a screenshot taken before shows a blank box."""
    image.scroll_into_view_if_needed()
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=image.element_handle())


def shots_dir() -> Path:
    """Where the browser tests leave their screenshots for a person to look at: $BENCH_SHOTS, else
    test-artifacts/ in the repository (ignored by git)."""
    shots = Path(os.environ.get("BENCH_SHOTS", Path(__file__).resolve().parents[1] / "test-artifacts"))
    shots.mkdir(parents=True, exist_ok=True)
    return shots
