"""The package's import graph: modules per folder, floors, circles, and the wing rule.

    python ci/import_graph.py            # the report
    python ci/import_graph.py --check    # exit 1 on a circle or an import against the wings' direction

Only imports that run count (those under ``if TYPE_CHECKING:`` are listed apart). A *floor* is a
module's height in the graph: a module that imports no other package module is on floor 1, one that
imports only floor-1 modules on floor 2, and so on (modules in a circle share a floor). The wings of
``harness/`` import in one direction: a wing may import the wings listed after it in ``WINGS`` and the
shared leaves, never one listed before it.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "methods", "leaderboard")
# From the top of a run down to the leaves: each wing imports only wings below it.
WINGS = ("harness.cli", "harness.api", "harness.tools", "harness.sweep", "leaderboard", "harness.run", "methods",
         "harness.data", "harness.model", "harness.results", "harness.spec", "harness.leaves")
LEAVES = {"harness.errors", "harness.paths", "harness.atomic", "harness"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports(path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(runtime imports, type-checking-only imports) of one file, as package module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    runtime, typing_only = set(), set()

    def visit(node: ast.AST, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            flag = typing or _type_checking(child)
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join([*base, child.module] if child.module else base)
                elif (child.module or "").startswith("bench_stability_gap."):
                    target = child.module.removeprefix("bench_stability_gap.")
                else:
                    continue
                found = [f"{target}.{a.name}" for a in child.names if f"{target}.{a.name}" in modules]
                for t in found or [target]:
                    if t in modules and t != name:
                        (typing_only if flag else runtime).add(t)
            elif isinstance(child, ast.Import):
                for a in child.names:
                    t = a.name.removeprefix("bench_stability_gap.")
                    if t in modules and t != name:
                        (typing_only if flag else runtime).add(t)
            visit(child, flag)

    visit(tree, False)
    return runtime, typing_only


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    files = [p for f in FOLDERS for p in (ROOT / f).rglob("*.py")]
    modules = {module_name(p) for p in files}
    runtime, typing_only = {}, {}
    for p in files:
        runtime[module_name(p)], typing_only[module_name(p)] = imports(p, modules)
    return runtime, typing_only


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            strong(v)
    return out


def floors(edges: dict[str, set[str]]) -> dict[str, int]:
    comp_of = {m: m for m in edges}
    for comp in circles(edges):
        for m in comp:
            comp_of[m] = comp[0]
    memo: dict[str, int] = {}

    def floor(c: str, seen: frozenset) -> int:
        if c in memo:
            return memo[c]
        members = [m for m in edges if comp_of[m] == c]
        below = {comp_of[t] for m in members for t in edges[m]} - {c}
        memo[c] = 1 + max((floor(b, seen | {c}) for b in below if b not in seen), default=0)
        return memo[c]

    return {m: floor(comp_of[m], frozenset()) for m in edges}


def wing(module: str) -> str:
    if module in LEAVES:
        return "harness.leaves"
    for w in WINGS:
        if module == w or module.startswith(w + "."):
            return w
    return "harness.leaves" if module.count(".") == 1 and module.startswith("harness.") else module


def wing_violations(edges: dict[str, set[str]]) -> list[str]:
    rank = {w: i for i, w in enumerate(WINGS)}
    bad = []
    for src, targets in sorted(edges.items()):
        for t in sorted(targets):
            a, b = wing(src), wing(t)
            if a in rank and b in rank and a != b and rank[b] < rank[a]:
                bad.append(f"{src} ({a}) imports {t} ({b})")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 on a circle or a wing violation")
    args = ap.parse_args()
    runtime, typing_only = graph()
    cyc, bad = circles(runtime), wing_violations(runtime)
    both = {m: runtime[m] | typing_only[m] for m in runtime}
    if args.check:
        for c in cyc:
            print("circle:", " <-> ".join(c))
        for b in bad:
            print("against the wings:", b)
        return 1 if cyc or bad else 0
    per_folder = defaultdict(int)
    for m in runtime:
        per_folder[m.rpartition(".")[0] if "." in m else m] += 1
    fl = floors(runtime)
    print("modules per folder:")
    for folder, n in sorted(per_folder.items()):
        print(f"  {folder:<22} {n}")
    print(f"floors (longest import chain): {max(fl.values())}")
    top = max(fl.values())
    chain = [min(m for m, f in fl.items() if f == top)]
    while below := sorted(t for t in runtime[chain[-1]] if fl[t] == fl[chain[-1]] - 1):
        chain.append(below[0])
    print("  the longest chain:", " -> ".join(chain))
    print("circles (runtime imports):", cyc or "none")
    print("circles (with type-checking imports):", circles(both) or "none")
    print("imports against the wings' direction:", bad or "none")
    fan_in = defaultdict(int)
    for targets in runtime.values():
        for t in targets:
            fan_in[t] += 1
    print("most imported:", ", ".join(f"{m} ({n})" for m, n in sorted(fan_in.items(), key=lambda x: -x[1])[:6]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
