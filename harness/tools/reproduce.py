"""``bench reproduce RESULT.json``: make a stored run again from what its file records, in a scratch folder,
and say whether every number came out the same.

A stored number is worth what it takes to check it. The file records the protocol spec (by hash), the method
and its code hash, the settings, the seed, the precision, the CPU threads and kernels and the machine
arithmetic (``harness.numerics``); from those the run is made again with fresh caches (the deployed model
and the joint reference are trained again too, so they are checked as well). The answer is "identical" or
the first eval point and measure that differ, by how much, and which identity fields differ from the stored
run's: on another machine's arithmetic or another torch the numbers are not expected to agree, and the
answer says why before it says how far. What the run needs and this installation lacks (the spec at that
hash, the method's code at that hash) is refused before anything computes.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BenchError
from ..numerics import cpu_model
from ..results.curves import SessionCurve
from ..results.schema import RunResult, load_result, result_numerics, result_precision

if TYPE_CHECKING:
    from ..run.options import RunOptions
    from ..spec.protocol import Protocol

GAP_KEYS = ("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha", "min_acc", "wc_acc")
VERSION_KEYS = ("python", "torch", "torchvision", "timm", "numpy")


@dataclass(frozen=True)
class Difference:
    """One thing that is not the same: an identity field, a measure at an eval point, or a metric."""

    what: str
    stored: object
    here: object

    def text(self) -> str:
        delta = ""
        if isinstance(self.stored, float) and isinstance(self.here, float):
            delta = f" ({self.here - self.stored:+.6g})"
        return f"{self.what}: stored {self.stored!r}, here {self.here!r}{delta}"


@dataclass
class Report:
    """What ``reproduce`` found. ``identity``: fields of the run's identity that differ here; ``point``: the
    first eval point and measure whose value differs; ``metrics``: the metrics that differ; ``compared``:
    how many values were compared."""

    stored: Path
    reproduced: Path | None
    identity: list[Difference] = field(default_factory=list)
    point: Difference | None = None
    metrics: list[Difference] = field(default_factory=list)
    compared: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def same_numbers(self) -> bool:
        return self.point is None and not self.metrics

    @property
    def identical(self) -> bool:
        return self.same_numbers and not self.identity

    def lines(self) -> list[str]:
        out = []
        if self.identical:
            out.append(f"identical: {self.compared} recorded values of {self.stored} made again bit for bit")
        elif self.identity:
            out.append("not the same identity: " + "; ".join(d.text() for d in self.identity))
        if not self.same_numbers:
            out.append("differs" + (f" first at {self.point.text()}" if self.point else "") +
                       (" (of " + str(self.compared) + " values compared)"))
            out += [f"  metric {d.text()}" for d in self.metrics]
        elif not self.identical:
            out.append(f"the numbers are the same ({self.compared} values compared)")
        return out + [f"  note: {n}" for n in self.notes]


# ------------------------------------------------------------------ what the stored run needs

def stored_protocol(result: RunResult, path: Path) -> Protocol:
    """The protocol spec the run was made with: its own file when it recorded one, else the built-in of
    its name; refused when the spec here has another hash."""
    from ..spec.protocol import load_protocol

    source = result.options.get("protocol_file") or result.protocol.name
    spec = load_protocol(str(source))
    if spec.spec_hash != result.protocol.hash:
        raise BenchError(f"{path} was made with protocol {result.protocol.name!r} at spec hash {result.protocol.hash}, "
                         f"and {source} here has hash {spec.spec_hash}: the spec it needs is not available in this "
                         f"installation. Reproduce it with the bench it was made with (commit "
                         f"{result.git_commit or 'unrecorded'}, "
                         f"version {result.versions.get('bench-stability-gap', '?')}).")
    return spec


def check_method_code(result: RunResult, path: Path) -> None:
    """The method's code here must be the code the run was made with (its content hash)."""
    from ...methods.registry import code_hash, parse_method

    spec = parse_method(result.method.spec)
    here = code_hash([spec.base, *spec.modifiers])
    if result.method.code_hash is not None and here != result.method.code_hash:
        raise BenchError(f"{path} was made with method {result.method.spec!r} at code hash {result.method.code_hash}; "
                         f"its code here hashes to {here} (distribution {spec.base.distribution} {spec.base.version}): "
                         f"install the method's code the run was made with, then reproduce it.")


def identity_differences(result: RunResult, spec: Protocol, options: RunOptions) -> list[Difference]:
    """The fields of the stored run's identity that this process would compute otherwise (``spec``: its
    protocol, as ``stored_protocol`` found it)."""
    from ..model.device import resolve_device
    from ..results.comparability import CPU_THREADS, kernel_label
    from ..run.options import run_precision

    stored = result.options
    out = []
    if str(resolve_device(options.device)).split(":")[0] != str(stored.get("device", "cpu")).split(":")[0]:
        out.append(Difference("device", stored.get("device"), options.device))
    here_precision = run_precision(spec, options)
    if result_precision(result) != here_precision:
        out.append(Difference("precision", result_precision(result), here_precision))
    if (numerics := result_numerics(result)) != options.numerics:
        out.append(Difference("numerics", numerics, options.numerics))
    if str(stored.get("device", "cpu")).startswith("cpu"):
        if (threads := stored.get("torch_threads")) != CPU_THREADS:
            out.append(Difference("threads", threads, CPU_THREADS))
        if (kernels := stored.get("cpu_kernels")) != kernel_label(options.cpu_kernels):
            out.append(Difference("cpu_kernels", kernels, kernel_label(options.cpu_kernels)))
    from ..results.schema import library_versions

    here = library_versions()
    out += [Difference(f"versions.{k}", result.versions.get(k), here.get(k)) for k in VERSION_KEYS
            if result.versions.get(k) != here.get(k)]
    return out


# ------------------------------------------------------------------ comparing the numbers

def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _curve_values(c: SessionCurve) -> Iterator[tuple[str, list[float]]]:
    yield "old", c.old
    yield "new", c.new
    yield "all", c.all
    for k, task in enumerate(c.tasks):
        yield f"task {k + 1}", task


def compare_curves(stored: list[SessionCurve], made: list[SessionCurve]) -> tuple[Difference | None, int]:
    """The first eval point (session, update, measure) whose value differs, and how many values were
    compared; sessions, eval points and losses in order."""
    if [c.session for c in stored] != [c.session for c in made]:
        return Difference("sessions", [c.session for c in stored], [c.session for c in made]), 0
    compared = 0
    for s, m in zip(stored, made):
        if s.updates != m.updates:
            return Difference(f"session {s.session} eval points", s.updates, m.updates), compared
        if s.before is not None and m.before is not None:
            for name in ("old", "new", "all"):
                a, b = getattr(s.before, name), getattr(m.before, name)
                compared += 1
                if a is not None and b is not None and not _same(a, b):
                    return Difference(f"session {s.session}, before the session, {name}", a, b), compared
        theirs = dict(_curve_values(m))
        for p, update in enumerate(s.updates):
            for name, values in _curve_values(s):
                other = theirs.get(name)
                compared += 1
                if other is None or p >= len(other) or not _same(values[p], other[p]):
                    here = None if other is None or p >= len(other) else other[p]
                    return Difference(f"session {s.session}, update {update}, {name}", values[p], here), compared
        for k, (a, b) in enumerate(zip(s.loss, m.loss)):
            compared += 1
            if not _same(a, b):
                return Difference(f"session {s.session}, update {k + 1}, training loss", a, b), compared
    return None, compared


def compare_metrics(stored: RunResult, made: RunResult) -> tuple[list[Difference], list[str]]:
    """The metrics that differ. P_Δ reads A_best from the protocol's reference runs: compared only when the
    stored run was its own reference (a scratch folder holds no other run)."""
    notes = []
    keys = list(GAP_KEYS)
    refs = stored.references
    if refs is not None and any(run != stored.run_id for run in refs.best_new_runs.values()):
        keys.remove("P_delta")
        notes.append("P_delta read A_best from other stored runs (the protocol's reference set), which the "
                     "scratch folder does not hold: not compared")
    if stored.metrics is None or made.metrics is None:
        return [], notes
    out = [Difference(f"{k}", getattr(stored.metrics, k), getattr(made.metrics, k)) for k in keys
           if not _same(getattr(stored.metrics, k) or 0.0, getattr(made.metrics, k) or 0.0)]
    return out, notes


# ------------------------------------------------------------------ the command

@contextmanager
def _scratch_caches(folder: Path, reuse: bool) -> Iterator[None]:
    """Fresh caches under the scratch folder, so the deployed model and trunk features are made again."""
    if reuse:
        yield
        return
    before = os.environ.get("BENCH_CACHE_DIR")
    os.environ["BENCH_CACHE_DIR"] = str(folder / "cache")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("BENCH_CACHE_DIR", None)
        else:
            os.environ["BENCH_CACHE_DIR"] = before


def check_request(path: Path) -> tuple[RunResult, Protocol]:
    """The stored result and its protocol, refused (BenchError, exit 2) when it cannot be made here."""
    if not path.is_file():
        raise BenchError(f"{path} is not a file: give the JSON of a stored run (e.g. "
                         f"bench-results/runs/tiny_cil/vanilla/seed0-<id>.json).")
    result = load_result(path)
    if result.is_reference:
        raise BenchError(f"{path} is a joint reference: reproduce a method's run, which trains its joint reference "
                         f"again and compares the scores that read it.")
    if result.status != "complete":
        raise BenchError(f"{path} records a {result.status} run: only a complete run's numbers can be compared.")
    spec = stored_protocol(result, path)
    check_method_code(result, path)
    return result, spec


def reproduce(path: Path, scratch: Path | None = None, *, reuse_caches: bool = False, progress: bool = True,
              echo: Callable[[str], None] = print) -> Report:
    """Make the stored run at ``path`` again in ``scratch`` (a new temporary folder by default) and compare."""
    from ..run.options import RunOptions
    from ..run.pipeline import execute

    result, spec = check_request(path)
    folder = scratch or Path(tempfile.mkdtemp(prefix="bench-reproduce-"))
    kernels = "stock" if str(result.options.get("cpu_kernels") or "").startswith("stock") else "fast"
    device = str(result.options.get("device", "cpu")).split(":")[0]
    options = RunOptions(results_dir=folder / "results", device=device, overrides=dict(result.overrides),
                         precision=result.options.get("precision"), cpu_kernels=kernels, progress=progress,
                         trunk_cache=bool(result.options.get("trunk_cache", True)))
    report = Report(stored=path, reproduced=None, identity=identity_differences(result, spec, options))
    machine = result.options.get("machine") or {}
    if machine.get("cpu_model") not in (None, cpu_model()):
        report.notes.append(f"made on a {machine['cpu_model']} CPU; this one is a {cpu_model()}")
    if report.identity:
        echo("not the same identity, so the numbers may differ: " + "; ".join(d.text() for d in report.identity))
    echo(f"making {result.method.spec} on {result.protocol.name} (seed {result.seed}) again in {folder}")
    with _scratch_caches(folder, reuse_caches):
        made, made_path = execute(spec, result.method.spec, result.seed, options, tuned=result.tuned)
    report.reproduced = made_path
    report.point, report.compared = compare_curves(result.curves, made.curves)
    report.metrics, report.notes = compare_metrics(result, made)
    return report
