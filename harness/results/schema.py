"""RunResult: the JSON file that is the source of truth for a run (MLflow is a mirror of it)."""

from __future__ import annotations

import errno
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from ..atomic import write_or_rescue
from ..errors import BenchError

# the row label, the joint's method string and the settings' text are the run identity's; this module has
# always offered them, so its importers keep finding them here
from ..identity import JOINT as JOINT
from ..identity import RunIdentity, effort, row_label
from ..identity import format_setting as format_setting
from ..spec.protocol import MAX_SEED
from .curves import ReferenceSession, SessionCurve
from .metrics import EvalWeighting, Metrics
from .read_once import forget, parsed

SCHEMA_VERSION = 3  # 2: overrides and the references a run was scored with are stored; 3: curves hold their
# "before" point (SessionCurve.before); older results load as ever, with forgetting, BWT and FWT not recorded


class Strict(BaseModel):
    # NaN and infinities are written as such (not as null), so a run that recorded one reads back and is
    # set apart with the reason, instead of turning into an unreadable file
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class ProtocolStamp(Strict):
    name: str
    version: int
    hash: str
    scored_on: Literal["test", "validation"] = Field(
        "test", description="the split the run was scored on: validation for a tuning trial (bench tune), which "
                            "picks settings and is never ranked; a result written before runs recorded it lacks it "
                            "(``scored_on`` reads such a trial by where it lies)")


class MethodStamp(Strict):
    spec: str = Field(description="the method string as given, e.g. vanilla+sgm")
    base: str
    modifiers: list[str]
    distribution: str
    version: str
    modifier_distributions: dict[str, str] = Field(default_factory=dict, description="modifier -> dist==version")
    code_hash: str | None = Field(None, description="content hash of the code packages behind the method string "
                                                     "(registry.code_hash); the leaderboard never averages across two")


class Budget(Strict):
    """Every budget figure the run used, as the harness counted them (FLOP conventions: harness.model.flops).

    FLOPs are 2 x fvcore MACs. ``train_flops`` / ``eval_flops`` and their per-session lists count a
    cached trunk as if it ran for every sample (uncached equivalent, the same for both cache
    settings); ``*_executed`` is what ran (a cached trunk once per distinct image). The two
    ``*_vs_joint`` ratios are the paper's efficiency figures (appendix; 16.7x and 31.9x for SGM):
    the joint reference's total (over every joint model the protocol trains) divided by this run's,
    so > 1 means cheaper.
    """

    updates_per_session: list[int]  # under a FLOP budget, the updates each session's TFLOPs paid for
    train_tflops_budget: float | None = Field(None, description="the protocol's training TFLOPs per session "
                                                                "(training.budget); None: a fixed update count")
    batch_new: int
    batch_old: int
    samples_trained: int
    optimizer_steps: int
    memory_policy: str
    memory_capacity: int | None
    memory_peak_samples: int
    memory_peak_bytes: int
    train_flops: float | None = None
    eval_flops: float | None = None
    train_flops_per_session: list[float] | None = None
    eval_flops_per_session: list[float] | None = None
    train_flops_executed: float | None = None
    eval_flops_executed: float | None = None
    macs_per_sample: dict[str, float] | None = Field(None,
                                                     description="forward MACs per sample: trunk, body, head (final)")
    forward_samples: dict[str, int] | None = Field(None, description="phase/part/forward|backward -> samples")
    declared: dict[str, float] = Field(default_factory=dict, description="the method's Context.counters at run end")
    batch_limit: int | None = Field(None, description="most samples one update may train on (backward)")
    max_trained_per_update: int | None = Field(None, description="most samples any update trained on")
    trunk_cached: bool | None = None
    flops_convention: str | None = None
    updates_vs_joint: float | None = Field(None, description="joint's optimizer steps / this run's")
    train_flops_vs_joint: float | None = Field(None, description="joint's training FLOPs / this run's")


class References(Strict):
    """The references a run was scored with (``select_runs`` finds them; the leaderboard re-finds them)."""

    joint_run: str | None
    best_new: dict[int, float] = Field(description="A_best(E_j) per session, for P_Δ")
    best_new_runs: dict[int, str] = Field(
        default_factory=dict, description="session -> run id that reached A_best(E_j) (this run's own id if it did)")
    best_new_methods: list[str] = Field(
        default_factory=list, description="the protocol's reference set for A_best (same seed), besides the run itself")


class TunedStamp(Strict):
    """What a run's settings were tuned under (``bench tune``): its row is named by the ruleset, never
    averaged with the default settings' row, and set beside rows tuned under the same ruleset only."""

    trials: int
    objective: str
    value: float = Field(description="the best trial's objective on the validation split")
    validation_per_class: int
    study: str
    tuning_hash: str = Field(description="spec hash of the tuning view the trials ran")

    @property
    def ruleset(self) -> str:
        return f"tuned ({self.trials} trials, {self.objective})"


GPU_STAGE = "gpu_"  # prefix of a stage_seconds key that holds GPU time by CUDA events, not wall time


class RunResult(Strict):
    schema_version: int = Field(SCHEMA_VERSION, ge=1, le=SCHEMA_VERSION)  # a later one: a newer bench wrote it
    run_id: str
    status: Literal["complete", "failed", "diverged"]  # diverged: non-finite loss or logits (curves so far)
    protocol: ProtocolStamp
    method: MethodStamp
    config: dict[str, Any]
    overrides: dict[str, Any] = Field(default_factory=dict, description="the --set overrides the run was given")
    seed: StrictInt = Field(ge=0, le=MAX_SEED)  # what bench run accepts: any other seed was not made by a run
    trainable_params: int
    curves: list[SessionCurve] = Field(default_factory=list)
    reference: list[ReferenceSession] = Field(default_factory=list, description="joint runs only")
    references: References | None = None
    metrics: Metrics | None = None
    budget: Budget
    versions: dict[str, str]
    git_commit: str | None
    started_at: str
    wall_time_s: float  # summed over a resumed run's processes (each up to its last checkpoint)
    stage_seconds: dict[str, float] = Field(
        default_factory=dict, description="wall seconds spent training and evaluating (train, eval), summed "
                                          "over resumes; on CUDA also the GPU seconds those blocks spanned, by "
                                          "CUDA events (gpu_train, gpu_eval)")
    options: dict[str, Any] = Field(default_factory=dict, description="run options (device, caching)")
    tuned: TunedStamp | None = Field(None, description="the settings came from bench tune (overrides hold them)")

    def stage_times(self) -> list[tuple[str, float, bool]]:
        """(stage, seconds, on the GPU) for each timed stage, in key order: wall and GPU seconds of a
        stage are different clocks, so every reader labels them apart."""
        return [(k.removeprefix(GPU_STAGE), v, k.startswith(GPU_STAGE)) for k, v in sorted(self.stage_seconds.items())]

    @property
    def is_reference(self) -> bool:
        return bool(self.reference)

    @property
    def label(self) -> str:
        return row_label(self.method.spec, self.overrides, self.tuned)

    @property
    def eval_weighting(self) -> EvalWeighting:
        """How its gaps weight the eval points: by compute under a FLOP budget, where the points are placed
        by compute and methods make different numbers of updates; by updates otherwise."""
        return "compute" if self.budget.train_tflops_budget is not None else "interval"

    @property
    def effort(self) -> str:
        """How its settings were chosen: ``defaults``, ``tuned (N trials, objective)``, or ``set by hand``."""
        return effort(self.overrides, self.tuned)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("bench-stability-gap", "torch", "torchvision", "timm", "peft", "fvcore",
                 "mlflow", "numpy", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


@cache
def git_commit() -> str | None:
    """The commit of the harness checkout, when it is one (a pip install from PyPI has none). Read once per
    process, before its first run computes (``prepare`` asks first): the code a process runs is what it
    imported at its start, so a checkout moved to another commit during a long sweep must not relabel the
    results of the code loaded before."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def result_path(root: Path, result: RunResult) -> Path:
    safe_method = result.method.spec.replace("+", "__")
    return root / "runs" / result.protocol.name / safe_method / f"seed{result.seed}-{result.run_id}.json"


def save_result(root: Path, result: RunResult) -> Path:
    """Write the JSON atomically: a reader never sees half a file, an interrupt leaves none, a full disk
    keeps it elsewhere and says where."""
    path = result_path(root, result)
    written = write_or_rescue(path, result.model_dump_json(indent=1), f"the result of run {result.run_id}")
    forget(written)
    return written


def parse_result(data: bytes, path: Path) -> RunResult:
    """A result from the bytes of its file; anything else is a BenchError naming ``path``."""
    from ..spec.specfile import validation_problems

    try:
        return RunResult.model_validate_json(data)
    except ValidationError as exc:  # each field named, with what is wrong with it
        raise BenchError(f"Result file {path} is corrupt or not a bench result: {validation_problems(exc)}.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchError(f"Result file {path} is corrupt or not a bench result: {str(exc).splitlines()[0]}") from None


def load_result(path: Path) -> RunResult:
    try:
        found = parsed(path, _read_result)
    except OSError as exc:
        raise BenchError(f"Result file {path} cannot be read: {exc.strerror or exc}.") from None
    if isinstance(found, BenchError):
        raise found
    return found


Skip = Callable[[Path, str], None]
_warned: set[tuple[Path, str]] = set()


def warn_skipped(path: Path, reason: str) -> None:
    """Default report of a skipped results entry: a warning on stderr, once per entry per process (the
    runner scans the folder several times per run)."""
    if (path, reason) not in _warned:
        _warned.add((path, reason))
        print(f"Warning: skipped {path}: {reason}", file=sys.stderr)


def _skip_reason(path: Path) -> str | None:
    """Why ``path`` (a ``*.json`` entry or a symlink) is not a result file to read, or None when it is."""
    if path.is_symlink():
        target = os.readlink(path)
        try:
            path.resolve(strict=True)
        except RuntimeError:  # Python < 3.13 reports a symlink loop this way
            return f"symbolic link loop (-> {target})"
        except OSError as exc:
            kind = {errno.ENOENT: "dangling symbolic link", errno.ELOOP: "symbolic link loop"}.get(
                exc.errno or 0, "unusable symbolic link")
            return f"{kind} (-> {target}: {exc.strerror})"
        return f"symbolic link (-> {target}); results are read from real files only, so none is counted twice"
    if path.is_dir():
        return "a folder named like a result file"
    if not path.is_file():
        return "not a regular file"
    return None


def scan_results(base: Path, skip: Skip) -> list[tuple[Path, RunResult | BenchError]]:
    """Every ``*.json`` under ``base``, without following symbolic links. A corrupt file comes back as its
    error (never silently dropped); junk that cannot be a result (symlinks, folders named ``*.json``,
    unreadable folders or files) is passed to ``skip`` with the reason, so one stray entry never breaks a
    run or the leaderboard."""
    out: list[tuple[Path, RunResult | BenchError]] = []
    if not base.is_dir():
        return out

    def unreadable(exc: OSError) -> None:
        skip(Path(exc.filename), f"cannot be read ({exc.strerror})")

    for folder, dirs, files in os.walk(base, onerror=unreadable):
        here = Path(folder)
        for name in sorted(dirs):
            path = here / name
            if path.is_symlink() or name.endswith(".json"):
                skip(path, _skip_reason(path) or "")
        dirs[:] = sorted(d for d in dirs if not (here / d).is_symlink() and not d.endswith(".json"))
        for name in sorted(files):
            path = here / name
            if not name.endswith(".json") and not path.is_symlink():
                continue
            reason = _skip_reason(path)
            if reason is not None:
                skip(path, reason)
                continue
            try:
                out.append((path, parsed(path, _read_result)))
            except OSError as exc:  # unreadable is junk to skip; unparsable comes back as its error
                skip(path, f"cannot be read ({exc.strerror})")
    return out


def _read_result(path: Path) -> RunResult | BenchError:
    """The result in ``path``, or the error that names why it is none (OSError: unreadable, propagated)."""
    data = path.read_bytes()
    try:
        return parse_result(data, path)
    except BenchError as err:
        return err


def iter_results(root: Path, protocol: str | None = None,
                 skip: Skip = warn_skipped) -> list[tuple[Path, RunResult | BenchError]]:
    """Every result file under ``root/runs`` (or ``root/runs/<protocol>``): see ``scan_results``."""
    return scan_results(root / "runs" / protocol if protocol else root / "runs", skip)


# ------------------------------------------------------------------ what a run is (which runs count: comparability.py)

TRIALS_FOLDER = "tuning"  # <results>/tuning: where bench tune stores its trials, apart from the results' runs/


def scored_on(r: RunResult, path: Path | None = None) -> str:
    """The split a run was scored on: "validation" for a tuning trial, else "test". Its stamp says so; a
    result written before runs were stamped is a trial when its file lies in a trials folder's ``runs/``
    (``<results>/tuning/runs/...``, where bench tune stored every trial and its references)."""
    if "scored_on" in r.protocol.model_fields_set or path is None:
        return r.protocol.scored_on
    return "validation" if any(p.name == "runs" and p.parent.name == TRIALS_FOLDER for p in path.parents) else "test"


def result_precision(r: RunResult) -> str:
    """The precision a run computed in (``RunIdentity.from_result``: a result from before the setting was
    recorded ran as bench's only mode then, bf16 autocast on CUDA, float32 elsewhere)."""
    return RunIdentity.from_result(r).precision


def result_numerics(r: RunResult) -> str:
    """The label of the machine arithmetic a run computed with (``harness.numerics``); ``unrecorded`` for a
    run made before bench recorded it (``RunIdentity.from_result``)."""
    return RunIdentity.from_result(r).numerics


def run_identity(r: RunResult) -> dict[str, str | int]:
    """What, beyond protocol, method and seed, changes a run's numbers and so names its board and row
    (``RunIdentity.columns``): precision, settings, CPU threads and kernels, machine arithmetic. Every
    machine-readable output and the run's own summary carry these, so no grouping of stored runs mixes what
    the leaderboard keeps apart."""
    return RunIdentity.from_result(r).columns


def identity_text(r: RunResult) -> str:
    """``fp32, defaults, 1 thread, kernels fast-..., arithmetic <label>``: ``run_identity`` as the run's summary
    line shows it."""
    return RunIdentity.from_result(r).text
