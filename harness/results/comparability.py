"""Which stored runs count: the rule the runner (its references), the sweep (what is done) and the
leaderboard (what is ranked) share. A run is set apart when its file is broken, its values impossible,
its protocol hash stale, its weights, precision or joint settings other than the selection's, or when it
was computed on the CPU with other arithmetic; of the rest, the newest run per row and seed counts.

The CPU part of the rule: how runs compute on the CPU (the intra-op thread count and the kernels), and
why runs made otherwise are kept apart.

torch splits a CPU reduction (a convolution, a matmul, a sum) among its intra-op threads, and the
order in which the partial sums are added depends on how many there are: the same seed on the same
machine gives other weights under 1 thread than under 2, and every later stage inherits the
difference (the deployed model, the trunk features, the joint references, every score against them).
The default count is the machine's core count (or ``OMP_NUM_THREADS``), so left alone two people
running the same command would get two leaderboards.

So a run on the CPU trains and evaluates with ``CPU_THREADS`` intra-op threads whatever the machine
offers (``harness.model.cpu`` sets it), the count is recorded on every result
(``options.torch_threads``), the caches a run reuses carry it in their keys, and stored CPU runs made
with another count are set apart here (never a reference, never ranked). One thread because, on the
small models the CPU protocols use, a second thread bought little and cost much on a shared machine:
a reduced tiny_cil pre-training took 11-15 s on one thread and 108 s on two, the machine's two cores
shared with other jobs. On the CPU, parallelism comes from running several runs at once (``bench sweep``).

On CUDA the numbers come from the GPU, so the CPU's thread count is left as it is (recorded all the same).

The kernels follow the same rule. A CPU run computes with one of two kernel sets, chosen by
``--cpu-kernels`` (``RunOptions.cpu_kernels``): ``fast`` (the default: the 1x1 convolutions as one matrix
product, depthwise convolutions on the smallest maps as a tap table, timm's 'same' convolutions cropped to
the taps that touch real input, in ``harness.model.fastconv``, and AdamW fused, in
``harness.model.fastoptim``) or ``stock`` (PyTorch's own kernels). Each adds in its own order, and so
do other torch and timm releases, so the set's label is derived, never written by hand: ``fast-`` plus a
digest of the kernel modules' code (their syntax tree without docstrings: a comment or docstring edit
changes no label, a code edit always does), then the torch and timm versions. The label is recorded on
every CPU result (``options.cpu_kernels``) and in the cache keys of the deployed model and the trunk
features, and a stored CPU run whose label differs is set apart as a run made with another thread count
is. Labels written by hand before the label was derived (``LEGACY_KERNELS``) are read as the digest of
the code they named, at the torch and timm versions the run recorded.
"""

from __future__ import annotations

import ast
import hashlib
import io
import math
import tokenize
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

from ..errors import BenchError
from ..identity import Execution, RunIdentity
from .metrics import Metrics, best_new_accuracy
from .schema import JOINT, RunResult, iter_results, warn_skipped

# ------------------------------------------------------------------ on the CPU: threads and kernels

CPU_THREADS = 1
KERNEL_SETS = ("fast", "stock")
# the modules whose code is the fast kernel set: what they compute is what the label stands for
KERNEL_MODULES = tuple(Path(__file__).resolve().parent.parent / "model" / name
                       for name in ("fastconv.py", "fastoptim.py"))
# the one hand-written label CPU runs recorded before labels were derived, and the code digest it named
LEGACY_KERNELS = {"gemm1x1+dw-small+adamw-fused": "e6ff9e545dd0"}


def _code_lines(source: str) -> list[str]:
    """The source's lines without docstrings, comments, bare annotations (``name: type``, which declare a
    type for the checker and run nothing), trailing blanks and empty lines: what computes. Positions come
    from the syntax tree and the tokenizer, which agree across Python versions (a dump of the tree does
    not)."""
    lines = source.splitlines()
    dropped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.AnnAssign) and node.value is None:
            dropped.update(range(node.lineno - 1, node.end_lineno or node.lineno))
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            dropped.update(range(body[0].lineno - 1, (body[0].end_lineno or body[0].lineno)))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start[0] - 1, tok.start[1]
            lines[row] = lines[row][:col]
    return [line.rstrip() for k, line in enumerate(lines) if k not in dropped and line.strip()]


def code_digest(paths: tuple[Path, ...] = KERNEL_MODULES) -> str:
    """12 hex digits of the modules' code without docstrings and comments: only an edit to what they
    compute changes it."""
    h = hashlib.sha256()
    for path in paths:
        h.update("\n".join(_code_lines(path.read_text())).encode() + b"\0")
    return h.hexdigest()[:12]


def _version(dist: str, versions: dict[str, str] | None) -> str:
    if versions is not None:
        return versions.get(dist, "?")
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # a torch-free site host: the version is unknown here, not different
        return "?"


def kernel_label(kernels: str = "fast", digest: str | None = None, versions: dict[str, str] | None = None) -> str:
    """The label of a kernel set (``fast`` or ``stock``), from the kernel code's digest (``fast`` only) and
    the torch and timm versions (``versions``: a run's recorded ones; else those installed here)."""
    if kernels not in KERNEL_SETS:
        raise ValueError(f"cpu_kernels {kernels!r}: choose one of {', '.join(KERNEL_SETS)}")
    stack = f"torch{_version('torch', versions)}-timm{_version('timm', versions)}"
    return f"stock-{stack}" if kernels == "stock" else f"fast-{digest or _code_digest()}-{stack}"


@lru_cache(maxsize=1)
def _code_digest() -> str:
    return code_digest()


@lru_cache(maxsize=len(KERNEL_SETS))
def _label_now(kernels: str) -> str:
    """This installation's label of a set: read once, not for every stored run a selection looks at."""
    return kernel_label(kernels)


CPU_KERNELS = kernel_label("fast")  # the default set's label in this installation


def execution(device: str, numerics: str, kernels: str = "fast", *, asked_device: str = "",
              asked_precision: str | None = None, trunk_cache: bool = True, gpu_decode: bool = True) -> Execution:
    """How a run on ``device`` (its type: cpu, cuda, mps) with the machine arithmetic ``numerics`` computes: on
    the CPU with ``CPU_THREADS`` intra-op threads and the ``kernels`` set's label; elsewhere with neither (the
    GPU's numbers do not depend on them). The one place an ``Execution`` is made for a run about to compute."""
    cpu = device == "cpu"
    return Execution(device=device, threads=CPU_THREADS if cpu else 0, cpu_kernels=_label_now(kernels) if cpu else "",
                     numerics=numerics, trunk_cache=trunk_cache, gpu_decode=gpu_decode, asked_device=asked_device,
                     asked_precision=asked_precision, kernel_set=kernels)


def _same(stored: str, now: str) -> bool:
    """Labels agree part by part; a part unknown on either side ('?', a torch-free host) is not a difference."""
    a, b = stored.split("-"), now.split("-")
    return len(a) == len(b) and all(x == y or x.endswith("?") or y.endswith("?") for x, y in zip(a, b))


def cpu_problem(options: dict[str, Any], versions: dict[str, str] | None = None, kernels: str = "fast") -> str | None:
    """Why a stored run is not comparable with a run made now with the ``kernels`` set, as far as the CPU's
    arithmetic goes: it ran on the CPU with another intra-op thread count, or with another kernel set (the
    other choice, other kernel code, or another torch or timm). Runs that did not record the thread count
    are kept (bench recorded it before it fixed it, so such a run's count is unknown, not known to differ);
    a CPU run without a kernel set was made with the kernels bench used before. ``versions``: the run's
    recorded library versions."""
    device, threads = str(options.get("device", "")), options.get("torch_threads")
    if not device.startswith("cpu"):
        return None
    if threads is not None and threads != CPU_THREADS:
        return (f"made on the CPU with {threads} intra-op threads (runs now compute with {CPU_THREADS}, "
                f"and the thread count changes float results)")
    stored = options.get("cpu_kernels")
    if stored in LEGACY_KERNELS:  # read as the code it named, at the versions the run recorded
        stored = kernel_label("fast", LEGACY_KERNELS[stored], versions or {})
    now = _label_now(kernels)
    if stored is None or not _same(str(stored), now):
        made = f"with CPU kernels {stored!r}" if stored else "with oneDNN's convolution for the body's 1x1 layers"
        return (f"made on the CPU {made} (this selection computes with {now!r}; other kernels, or other torch "
                f"or timm releases, differ in the last bits)")
    return None


# ------------------------------------------------------------------ the selection

T = TypeVar("T")


def value_problem(r: RunResult) -> str | None:
    """Why a result's recorded numbers cannot be true (NaN, inf, an accuracy outside [0, 1]); None when
    they can. Such a file is refused everywhere: ``bench validate`` fails on it, the leaderboard never
    ranks it, ``bench sync`` never mirrors it."""
    values = [v for c in r.curves for v in (*c.old, *c.new, *c.all, *(x for t in c.tasks for x in t))]
    # the point before each session (what ACC, forgetting, BWT and FWT read): a NaN there is as impossible
    values += [v for c in r.curves if c.before is not None
               for v in (c.before.old, c.before.new, c.before.all, *c.before.tasks)]
    values += [v for s in r.reference for v in (s.old, s.new, s.all, *s.tasks)]
    bad = next((v for v in values if not (math.isfinite(v) and 0.0 <= v <= 1.0)), None)
    if bad is not None:
        return f"an accuracy of {bad!r} is recorded (accuracies are fractions in [0, 1])"
    return metrics_problem(r.metrics)


def metrics_problem(m: Metrics | None) -> str | None:
    """Why stored metrics cannot be what the curves give: a NaN or infinite number, or an accuracy-valued
    metric outside [0, 1] (the leaderboard recomputes them, but ``bench sync`` mirrors them as stored)."""
    if m is None:
        return None
    for key in ("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha", "min_acc", "wc_acc"):
        value = getattr(m, key)
        if value is not None and not math.isfinite(value):
            return f"metrics.{key} is {value!r} (a metric computed from finite accuracies is finite)"
    for key in ("sigma", "mu", "alpha", "min_acc", "wc_acc"):
        if not 0.0 <= getattr(m, key) <= 1.0:
            return f"metrics.{key} is {getattr(m, key)!r} (an accuracy, a fraction in [0, 1])"
    for key in ("S_delta", "P_delta", "CK_delta"):  # 1 minus a mean of non-negative ratios
        if (getattr(m, key) or 0.0) > 1.0:
            return f"metrics.{key} is {getattr(m, key)!r} (a gap is at most 1)"
    return None


def result_problem(r: RunResult) -> str | None:
    """Why a stored result can never be ranked or serve as a reference; None when it can. A run that
    did not complete is a true record (kept, mirrored, listed apart); one with impossible values is not."""
    if (bad := value_problem(r)) is not None:
        return bad
    if r.status != "complete":
        return f"status {r.status!r}, not complete"
    if not r.is_reference and not r.curves:
        return "no accuracy curves recorded (incomplete run)"
    return None


def _same_settings(stored: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Every setting a joint run recorded equals the protocol's (a setting added to bench later, absent
    from an older run's record, does not make it another reference), and the optimizer's are there."""
    return {"lr", "weight_decay"} <= stored.keys() and all(expected[k] == v for k, v in stored.items() if k in expected)


@dataclass
class Selection(Generic[T]):
    """The answer to "which stored runs count" for one protocol spec, used alike by the runner (its
    references), the sweep (what is done) and the leaderboard (what is ranked).

    - ``joints``: per seed, the newest valid joint reference made with the protocol's joint settings;
    - ``runs``: per (row label, seed), the newest valid CL run;
    - ``apart``: everything else, with the reason (stale hash, failed, out-of-range values, superseded,
      a joint with other settings, made on the CPU with another thread count), never ranked and never a
      reference;
    - A_best(E_j) per seed comes from the protocol's reference methods (default settings, same seed)
      and the scored run itself, so a submitted run never moves another method's P_Δ.
    """

    protocol_hash: str
    best_new_methods: tuple[str, ...]
    joints: dict[int, T] = field(default_factory=dict)
    runs: dict[tuple[str, int], T] = field(default_factory=dict)
    apart: list[tuple[T, str]] = field(default_factory=list)
    result_of: Callable[[T], RunResult] = lambda item: item  # type: ignore[assignment,return-value]

    def reference_runs(self, seed: int) -> list[T]:
        """The runs of the protocol's A_best reference set for ``seed`` (those that exist)."""
        return [self.runs[(m, seed)] for m in self.best_new_methods if (m, seed) in self.runs]

    def best_new(self, run: RunResult) -> tuple[dict[int, float], dict[int, str]]:
        """A_best(E_j) for scoring ``run``: the best new-class accuracy of the reference set (same
        seed) or of the run itself, per session, and the id of the run that reached it."""
        refs = [self.result_of(x) for x in self.reference_runs(run.seed)]
        # a stored run of the same row and seed is the one ``run`` supersedes: never its reference
        candidates = [r for r in refs if r.label != run.label] + [run]
        best = best_new_accuracy([r.curves for r in candidates])
        source = {s: next(r.run_id for r in candidates for c in r.curves if c.session == s and max(c.new) == v)
                  for s, v in best.items()}
        return best, source


def select_runs(items: Iterable[T], protocol_hash: str, best_new_methods: Iterable[str],
                joint_config: dict[str, Any] | None = None,
                result_of: Callable[[T], RunResult | BenchError] = lambda item: item,  # type: ignore[assignment,return-value]
                weights: str | None = None, precision: str | None = None,
                reference_hash: str | None = None, kernels: str = "fast",
                numerics: str | None = None) -> Selection[T]:
    """Sort stored runs of one protocol into what counts and what is set apart (see ``Selection``).
    ``joint_config``: the settings the protocol's joint reference trains with, when known; ``weights``: the
    content digest of the backbone weights in use, when known (a weights file replaced at the same path
    leaves the spec hash as it was, so runs made with the old content are set apart by this); ``precision``:
    the run's precision, when known (runs made in another precision are neither references nor rows);
    ``reference_hash``: the hash joint references carry, when the protocol shares another's (NAME@Kx);
    ``kernels``: the CPU kernel set (``fast`` or ``stock``) whose runs count; ``numerics``: the label of the
    machine arithmetic whose runs count (``harness.numerics``), when known (a run stored before bench recorded
    it was made on an unknown CPU without the pins: it counts only beside runs equally unrecorded, as it
    shares a board only with them)."""
    sel: Selection[T] = Selection(protocol_hash, tuple(best_new_methods), result_of=result_of)  # type: ignore[arg-type]
    live: list[tuple[T, RunResult, RunIdentity]] = []
    for item in items:
        r = result_of(item)
        if isinstance(r, BenchError):
            sel.apart.append((item, str(r)))
            continue
        made = RunIdentity.from_result(r)  # precision and arithmetic as recorded, or read for an older result
        if r.protocol.hash != (current := (reference_hash or protocol_hash) if r.is_reference else protocol_hash):
            sel.apart.append((item, f"stale protocol hash {r.protocol.hash} (current: {current})"))
        elif (problem := result_problem(r)) is not None:
            sel.apart.append((item, problem))
        elif (problem := cpu_problem(r.options, r.versions, kernels)) is not None:
            sel.apart.append((item, problem))
        elif numerics is not None and made.numerics != numerics:
            sel.apart.append((item, f"made with other machine arithmetic ({made.numerics}; this selection: "
                                    f"{numerics}): other CPU or GPU code paths differ in the last bits, and training "
                                    "amplifies them"))
        elif weights is not None and r.options.get("weights") not in (None, "", weights):
            sel.apart.append((item, f"made with other backbone weights ({r.options['weights']}, now {weights})"))
        elif precision is not None and made.precision != precision:
            sel.apart.append((item, f"made in precision {made.precision} (this selection: {precision})"))
        elif r.is_reference and (r.method.spec != JOINT or r.overrides
                                 or (joint_config is not None and not _same_settings(r.config, joint_config))):
            sel.apart.append((item, f"a joint run with other settings than the protocol's joint section "
                                    f"({r.label}, {r.config}); never used as A_joint"))
        else:
            live.append((item, r, made))
    for item, r, made in sorted(live, key=lambda irm: irm[1].started_at, reverse=True):
        if r.is_reference:
            if r.seed in sel.joints:
                used = result_of(sel.joints[r.seed]).run_id  # type: ignore[union-attr]
                sel.apart.append((item, f"older joint reference for seed {r.seed} (run {used} is used)"))
            else:
                sel.joints[r.seed] = item
            continue
        key = made.row_key
        if key in sel.runs:
            newer = result_of(sel.runs[key]).run_id  # type: ignore[union-attr]
            sel.apart.append((item, f"superseded: a newer run of {r.label} with seed {r.seed} ({newer}) is used"))
        else:
            sel.runs[key] = item
    return sel


def stored_selection(root: Path, protocol_name: str, protocol_hash: str, best_new_methods: Iterable[str],
                     joint_config: dict[str, Any] | None = None,
                     weights: str | None = None,
                     precision: str | None = None,
                     kernels: str = "fast",
                     numerics: str | None = None) -> Selection[tuple[Path, RunResult | BenchError]]:
    """``select_runs`` over the result files of one protocol in a results folder. A file that is no result
    (corrupt, cut short) or records impossible numbers (``value_problem``) is said once on stderr, as junk
    is: a run or sweep that would otherwise find its result missing trains it again without telling why."""
    sel = select_runs(iter_results(root, protocol_name), protocol_hash, best_new_methods, joint_config,
                      result_of=lambda pr: pr[1], weights=weights, precision=precision, kernels=kernels,
                      numerics=numerics)
    for (path, read), why in sel.apart:  # what the run then makes again: said, never passed over in silence
        if isinstance(read, BenchError):
            warn_skipped(path, why)
        elif (bad := value_problem(read)) is not None:
            warn_skipped(path, f"refused: {bad}")
    return sel
