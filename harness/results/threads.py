"""How runs compute on the CPU (the intra-op thread count and the kernels), and the rule that keeps runs
made otherwise apart.

torch splits a CPU reduction (a convolution, a matmul, a sum) among its intra-op threads, and the
order in which the partial sums are added depends on how many there are: the same seed on the same
machine gives other weights under 1 thread than under 2, and every later stage inherits the
difference (the deployed model, the trunk features, the joint references, every score against them).
The default count is the machine's core count (or ``OMP_NUM_THREADS``), so left alone two people
running the same command would get two leaderboards.

So a run on the CPU trains and evaluates with ``CPU_THREADS`` intra-op threads whatever the machine
offers (``harness.run.threads`` sets it), the count is recorded on every result
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
import tokenize
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

CPU_THREADS = 1
KERNEL_SETS = ("fast", "stock")
# the modules whose code is the fast kernel set: what they compute is what the label stands for
KERNEL_MODULES = tuple(Path(__file__).resolve().parent.parent / "model" / name
                       for name in ("fastconv.py", "fastoptim.py"))
# the one hand-written label CPU runs recorded before labels were derived, and the code digest it named
LEGACY_KERNELS = {"gemm1x1+dw-small+adamw-fused": "e6ff9e545dd0"}


def _code_lines(source: str) -> list[str]:
    """The source's lines without docstrings, comments, trailing blanks and empty lines: what computes.
    Positions come from the syntax tree and the tokenizer, which agree across Python versions (a dump
    of the tree does not)."""
    lines = source.splitlines()
    dropped: set[int] = set()
    for node in ast.walk(ast.parse(source)):
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
