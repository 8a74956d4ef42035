"""The longest functions of the package: `python ci/function_lengths.py [--max N]` lists every function
longer than N lines (default 80) in harness/, methods/ and leaderboard/, longest first, and exits 1 when
there is one. A function that long does more than one thing; the test suite runs it with the default."""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("harness", "methods", "leaderboard")


def lengths(root: Path = ROOT) -> list[tuple[int, str, str]]:
    """(lines, file, qualified name) of every function and method, longest first."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            stack: list[tuple[ast.AST, str]] = [(tree, "")]
            while stack:
                node, prefix = stack.pop()
                for child in ast.iter_child_nodes(node):
                    name = f"{prefix}{getattr(child, 'name', '')}"
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        found.append((child.end_lineno - child.lineno + 1, str(path.relative_to(root)), name))
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                        stack.append((child, name + "."))
    return sorted(found, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max", type=int, default=80)
    parser.add_argument("--top", type=int, default=0, help="also list the N longest, whatever their length")
    args = parser.parse_args()
    rows = lengths()
    long = [r for r in rows if r[0] > args.max]
    for n, path, name in (rows[: args.top] if args.top else long):
        print(f"{n:5d}  {path}  {name}")
    return 1 if long else 0


if __name__ == "__main__":
    sys.exit(main())
