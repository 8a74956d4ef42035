"""The README's sample of the first command's output, rendered from a stored real run so it cannot go stale.

    python ci/first_run_sample.py            # run the README's first command afresh (empty caches, a new
                                             # results folder), store its result in docs/ and rewrite the
                                             # README's sample from it
    python ci/first_run_sample.py --render   # rewrite the README's sample from the stored result only
    python ci/first_run_sample.py --check    # exit 1 naming what differs (tests/test_first_run_sample.py)

The sample is the lines ``bench run`` prints from the result (``harness.cli.summary_lines``), with the
result's path shown under the default ``bench-results/`` folder. The check fails when the README's block
differs from what the stored result renders (the table's format changed, or the block was edited by
hand), when the stored result was made under another spec than the protocol's current one or with
other CPU arithmetic than runs use now (thread count, kernels), or when the README's first command no
longer runs that protocol: regenerate with the first form above.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = "tiny_cil_quick"
COMMAND = f".venv/bin/bench run -p {PROTOCOL}"  # the README's first command, after the install
STORED = ROOT / "docs" / "first-run" / f"{PROTOCOL}-vanilla-seed0.json"
README = ROOT / "README.md"
BEGIN, END = "<!-- first-run sample: ci/first_run_sample.py writes this block -->", "<!-- end of first-run sample -->"


def render(stored: Path = STORED) -> str:
    """The README block: the summary the run printed, as ``bench run`` renders it from the stored result."""
    from bench_stability_gap.harness.cli import summary_lines
    from bench_stability_gap.harness.results.schema import RunResult, result_path

    result = RunResult.model_validate_json(stored.read_text())
    shown = result_path(Path("bench-results"), result)
    body = "\n".join(summary_lines(result, shown)).strip("\n")
    return f"{BEGIN}\n```\n$ {COMMAND}\n...\n{body}\n```\n{END}"


def current_block(readme: str) -> str | None:
    """The README's block between the markers, markers included; None when either is missing."""
    start, stop = readme.find(BEGIN), readme.find(END)
    if start < 0 or stop < start:
        return None
    return readme[start:stop + len(END)]


def problems(readme: str, stored: Path = STORED) -> list[str]:
    """What makes the README's sample untrue to the code and the protocol; empty when it is true."""
    from bench_stability_gap.harness.results.schema import RunResult
    from bench_stability_gap.harness.results.comparability import cpu_problem
    from bench_stability_gap.harness.spec.protocol import load_protocol

    found = []
    if f"bash ci/install.sh && {COMMAND}\n" not in readme:
        found.append(f"the README's first command is not `bash ci/install.sh && {COMMAND}`")
    if not stored.exists():
        return [*found, f"no stored first run at {stored}"]
    result = RunResult.model_validate_json(stored.read_text())
    spec_hash = load_protocol(PROTOCOL).spec_hash
    if result.protocol.name != PROTOCOL or result.protocol.hash != spec_hash:
        found.append(f"the stored run is {result.protocol.name} spec {result.protocol.hash}, the protocol now is "
                     f"{PROTOCOL} spec {spec_hash}")
    if (arithmetic := cpu_problem(result.options)) is not None:  # a run made now would give other numbers
        found.append(f"the stored run was {arithmetic}")
    if not str(result.options.get("numerics", "")).startswith("cpu-x86-avx2"):  # what another machine can repeat
        found.append(f"the stored run was made without the CPU pins (arithmetic {result.options.get('numerics')!r})")
    block = current_block(readme)
    if block is None:
        found.append(f"the README has no sample block between {BEGIN!r} and {END!r}")
    elif block != render(stored):
        found.append("the README's sample differs from what the stored run renders")
    return found


def rewrite_readme() -> None:
    text = README.read_text()
    block = current_block(text)
    if block is None:
        sys.exit(f"README.md has no sample block between {BEGIN!r} and {END!r}")
    README.write_text(text.replace(block, render()))


def run_fresh() -> None:
    """The README's first command in a new results folder with empty caches, as a fresh clone runs it; the
    stored result records the machine it was made on (``options.machine``), and the line printed says it."""
    from bench_stability_gap.harness.results.schema import RunResult

    bench = Path(sys.executable).parent / "bench"
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "BENCH_CACHE_DIR": f"{tmp}/cache", "BENCH_RESULTS_DIR": f"{tmp}/bench-results"}
        subprocess.run([str(bench), "run", "-p", PROTOCOL, "--no-progress"], env=env, check=True)
        made = sorted(Path(tmp, "bench-results", "runs", PROTOCOL, "vanilla").glob("seed0-*.json"))
        if len(made) != 1:
            sys.exit(f"expected one vanilla result of {PROTOCOL}, found {made}")
        STORED.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made[0], STORED)
        machine = RunResult.model_validate_json(STORED.read_text()).options.get("machine") or {}
        print(f"made on {machine.get('cpu_model')} ({machine.get('cpu_vendor')}, widest ISA {machine.get('cpu_isa')}, "
              f"ATen {machine.get('cpu_capability')}, pins {machine.get('pin_set')})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--render", action="store_true", help="rewrite the README block from the stored result")
    mode.add_argument("--check", action="store_true", help="exit 1 when the README block is not what the code renders")
    args = ap.parse_args()
    if args.check:
        found = problems(README.read_text())
        for p in found:
            print(f"README sample: {p}", file=sys.stderr)
        sys.exit(1 if found else 0)
    if not args.render:
        run_fresh()
    rewrite_readme()
    print(f"README.md's sample rewritten from {STORED.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
