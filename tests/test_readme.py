"""The README is a front page a newcomer reads in minutes, and its map of docs/ leads somewhere: it stays
under 15 KB, every file it links exists, and every section it names (``[Heading](docs/FILE.md#anchor)``) is
a heading of that file, under the name the link shows. The user guide's own contents list is held to the
same rule, so a heading renamed or a section moved away breaks a test, not a reader's click."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GUIDE = REPO / "docs" / "user-guide.md"
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens and underscores dropped, spaces
    made hyphens (so "Useful `bench run` options" is ``useful-bench-run-options``)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path: Path) -> dict[str, str]:
    """Anchor -> heading text of every markdown heading outside code blocks."""
    found, fenced = {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+?)\s*$", line)):
            found[slug(m.group(1))] = m.group(1)
    return found


def section_links(path: Path) -> list[tuple[str, Path, str]]:
    """(shown text, target file, anchor) of every link from PATH to a heading of a markdown file."""
    out = []
    for text, target in LINK.findall(path.read_text()):
        if target.startswith("http") or "#" not in target:
            continue
        file, anchor = target.split("#", 1)
        out.append((text, (path.parent / file).resolve() if file else path, anchor))
    return out


def test_readme_is_a_front_page_under_15_kb():
    size = len(README.read_bytes())
    assert size < 15_000, f"README.md is {size:,} bytes; move reference material into docs/user-guide.md"


def test_every_file_the_readme_links_exists():
    targets = [t.split("#", 1)[0] for _, t in LINK.findall(README.read_text()) if not t.startswith(("http", "#"))]
    assert "docs/user-guide.md" in targets
    missing = [t for t in targets if not (REPO / t).exists()]
    assert missing == []


@pytest.mark.parametrize("source", [README, GUIDE], ids=["README map", "guide contents"])
def test_every_section_named_is_a_heading_of_the_file_it_points_to(source: Path):
    links = section_links(source)
    assert len(links) >= 20  # the map and the contents list name sections, not just files
    wrong = []
    for text, target, anchor in links:
        found = headings(target)
        if anchor not in found:
            wrong.append(f"{text!r}: no heading #{anchor} in {target.relative_to(REPO)}")
        elif slug(text) != anchor:
            wrong.append(f"{text!r} points to #{anchor}, the heading {found[anchor]!r}")
    assert wrong == []


def test_the_readme_explains_the_leaderboard_and_keeps_ci_commands():
    """The front page says how to read a row (interval, n.s., the test's power) and keeps the two commands the
    quick start promises (CI runs the second)."""
    text = README.read_text()
    assert "bash ci/install.sh && .venv/bin/bench run -p tiny_cil_quick" in text
    assert "\nbash ci/test.sh\n" in text
    reading = text.split("## Reading the leaderboard", 1)[1].split("\n## ", 1)[0]
    for term in ("**A row**", "Student-t interval", "**n.s.**", "**power 0.47 at 3 seeds**", "Holm-adjusted", "2 of 3*"):
        assert term in reading, term
