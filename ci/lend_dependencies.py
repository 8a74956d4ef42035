"""Lends a fresh venv the installed dependencies a wheel declares, and nothing else, without copying them.

`python ci/lend_dependencies.py WHEEL EXTRAS FOLDER [NAME ...]` walks the wheel's requirement closure
(its `Requires-Dist`, with the given comma-separated extras and every marker evaluated for this
interpreter) over the distributions installed beside this interpreter, and links each one's top-level
files into FOLDER. A `.pth` line naming FOLDER then gives a fresh venv exactly what `pip install
WHEEL[EXTRAS]` would (the same pinned versions, since ci/constraints.txt made this environment) in
seconds instead of the minutes it takes to unpack several GB of torch and CUDA libraries again. A package
the code imports but the wheel does not declare is absent from FOLDER, so the wheel's smoke run still
fails on it. NAME adds a distribution outside the closure without its own requirements (animal-mnist,
installed with --no-deps for the same reason).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        meta = next(n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        headers = Parser().parsestr(archive.read(meta).decode())
    return [Requirement(r) for r in headers.get_all("Requires-Dist") or []]


def closure(roots: list[tuple[Requirement, str]]) -> dict[str, md.Distribution]:
    """The installed distributions the requirements reach, by canonical name. A requirement whose marker
    holds but which nothing installed satisfies is an error: the fresh venv would lack it."""
    installed = {canonicalize_name(d.metadata["Name"]): d for d in md.distributions()}
    found: dict[tuple[str, str], md.Distribution] = {}  # by (name, extra): each extra pulls its own requirements
    todo = list(roots)
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = installed.get(name)
        if dist is None or not req.specifier.contains(dist.version, prereleases=True):
            sys.exit(f"lend_dependencies: {req} is required but {'not installed' if dist is None else dist.version}"
                     " here; run ci/install.sh first")
        for e in [""] + sorted(req.extras):
            if (name, e) not in found:
                found[name, e] = dist
                todo += [(Requirement(r), e) for r in dist.requires or []]
    return {name: d for (name, _), d in found.items()}


def lend(dists: dict[str, md.Distribution], folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    for dist in dists.values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            source, target = Path(dist.locate_file(top)), folder / top
            if source.exists() and not target.exists():
                target.symlink_to(source)
    return len(dists)


def main(argv: list[str]) -> None:
    wheel, extras, folder, *names = argv
    requires = wheel_requirements(Path(wheel))
    dists = closure([(r, e) for e in ["", *filter(None, extras.split(","))] for r in requires])
    dists.update({canonicalize_name(n): md.distribution(n) for n in names})
    count = lend(dists, Path(folder))
    print(f"==> lent {count} installed distributions (the wheel's declared closure) to the fresh venv")


if __name__ == "__main__":
    main(sys.argv[1:])
