"""The package's shape: wings import in one direction without circles, and the results side and the
leaderboard work where torch cannot be imported at all (a web host building the site from stored JSON)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "browser" / "fixtures"

# A meta-path finder that refuses torch and everything built on it, installed before anything is imported:
# "absent", not merely "not imported yet".
BLOCK_TORCH = textwrap.dedent("""
    import sys
    from importlib.abc import MetaPathFinder

    class NoTorch(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"torch", "torchvision", "timm", "fvcore", "peft", "faiss"}:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def _python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_wings_import_downwards_without_circles() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "ci" / "import_graph.py"), "--check"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_wing_check_can_fail(tmp_path) -> None:
    """The check is not vacuous: a results module importing the run wing is reported."""
    sys.path.insert(0, str(ROOT / "ci"))
    try:
        import import_graph
    finally:
        sys.path.pop(0)
    edges = {"harness.results.schema": {"harness.run.loop"}, "harness.run.loop": {"harness.results.schema"}}
    assert import_graph.wing_violations(edges) == [
        "harness.results.schema (harness.results) imports harness.run.loop (harness.run)"]
    assert import_graph.circles(edges) == [["harness.results.schema", "harness.run.loop"]]


def test_the_blocker_blocks() -> None:
    out = _python("import torch")
    assert out.returncode != 0 and "blocked by the test" in out.stderr


def test_results_and_leaderboard_import_without_torch() -> None:
    out = _python("""
        import pkgutil, importlib
        import bench_stability_gap.harness.results as results, bench_stability_gap.leaderboard as board
        names = []
        for pkg in (results, board):
            for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
                importlib.import_module(info.name)
                names.append(info.name)
        print(len(names))
    """)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.split()[-1]) >= 12  # every module of both packages was imported


def test_leaderboard_build_from_stored_results_without_torch(tmp_path) -> None:
    results = tmp_path / "results"
    for i, src in enumerate(sorted(FIXTURES.glob("*.json"))):
        dest = results / "runs" / f"r{i}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
    site = tmp_path / "site"
    out = _python("""
        import sys
        from bench_stability_gap.harness.cli import main
        sys.argv = ["bench", *sys.argv[1:]]
        main()
    """, "leaderboard", "build", "--results-dir", str(results), "--out", str(site))
    assert out.returncode == 0, out.stdout + out.stderr
    index = (site / "index.html").read_text()
    methods = {json.loads(p.read_text())["method"]["spec"] for p in FIXTURES.glob("*.json")}
    assert any(m in index for m in methods - {"joint"})
    assert list(site.rglob("*.png")) or list(site.rglob("*.svg"))  # the plots were drawn too


def test_no_function_of_the_package_is_over_80_lines() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "ci" / "function_lengths.py")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, "functions over 80 lines (split them):\n" + out.stdout


def test_methods_import_without_peft_until_lora_is_injected() -> None:
    """peft (and the transformers it imports) costs a process seconds; a run without LoRA never loads it."""
    block_peft = BLOCK_TORCH.replace('{"torch", "torchvision", "timm", "fvcore", "peft", "faiss"}',
                                     '{"peft", "transformers"}')
    assert block_peft != BLOCK_TORCH
    out = subprocess.run([sys.executable, "-c", block_peft + textwrap.dedent("""
        import torch
        from bench_stability_gap.harness import cli
        from bench_stability_gap.methods.registry import METHOD_GROUP, MODIFIER_GROUP, entries
        from bench_stability_gap.methods.sgm.lora import lora_modules
        loaded = [e.load() for group in (METHOD_GROUP, MODIFIER_GROUP) for e in entries(group).values()]
        print(len(loaded), lora_modules(torch.nn.Sequential(torch.nn.Linear(2, 2))))
    """)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    count, found = out.stdout.split(maxsplit=1)
    assert int(count) >= 10 and found.strip() == "[]"


def test_every_package_folder_is_in_the_wheel() -> None:
    """pyproject.toml lists the packages a wheel holds by hand: a new subpackage left out of the list works
    from the checkout (the editable install maps folders) and is missing from every pip install."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"bench_stability_gap." + ".".join(init.parent.relative_to(ROOT).parts)
             for top in ("harness", "methods", "protocols", "leaderboard") for init in (ROOT / top).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found - listed == set(), "folders with an __init__.py missing from [tool.setuptools] packages"
    assert listed - found == set(), "packages listed in pyproject.toml with no folder"
