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
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .atomic import write_or_rescue
from .curves import ReferenceSession, SessionCurve
from .errors import BenchError
from .metrics import Metrics

SCHEMA_VERSION = 1


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProtocolStamp(Strict):
    name: str
    version: int
    hash: str


class MethodStamp(Strict):
    spec: str = Field(description="the method string as given, e.g. vanilla+sgm")
    base: str
    modifiers: list[str]
    distribution: str
    version: str
    modifier_distributions: dict[str, str] = Field(default_factory=dict, description="modifier -> dist==version")


class Budget(Strict):
    """Every budget figure the run used, as the harness counted them (FLOP conventions: harness.flops).

    FLOPs are 2 x fvcore MACs. ``train_flops`` / ``eval_flops`` and their per-session lists count a
    cached trunk as if it ran for every sample (uncached equivalent, the same for both cache
    settings); ``*_executed`` is what ran (a cached trunk once per distinct image). The two
    ``*_vs_joint`` ratios are the paper's efficiency figures (appendix; 16.7x and 31.9x for SGM):
    the joint reference's total (over every joint model the protocol trains) divided by this run's,
    so > 1 means cheaper.
    """

    updates_per_session: list[int]
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
    macs_per_sample: dict[str, float] | None = Field(None, description="forward MACs per sample: trunk, body, head (final)")
    forward_samples: dict[str, int] | None = Field(None, description="phase/part/forward|backward -> samples")
    declared: dict[str, float] = Field(default_factory=dict, description="the method's Context.counters at run end")
    batch_limit: int | None = Field(None, description="most samples one update may train on (backward)")
    max_trained_per_update: int | None = Field(None, description="most samples any update trained on")
    trunk_cached: bool | None = None
    flops_convention: str | None = None
    updates_vs_joint: float | None = Field(None, description="joint's optimizer steps / this run's")
    train_flops_vs_joint: float | None = Field(None, description="joint's training FLOPs / this run's")


class References(Strict):
    """Which runs the normalising references came from (recomputed by the leaderboard)."""

    joint_run: str | None
    best_new: dict[int, float]


class RunResult(Strict):
    schema_version: int = SCHEMA_VERSION
    run_id: str
    status: Literal["complete", "failed"]
    protocol: ProtocolStamp
    method: MethodStamp
    config: dict[str, Any]
    seed: int
    trainable_params: int
    curves: list[SessionCurve] = Field(default_factory=list)
    reference: list[ReferenceSession] = Field(default_factory=list, description="joint runs only")
    references: References | None = None
    metrics: Metrics | None = None
    budget: Budget
    versions: dict[str, str]
    git_commit: str | None
    started_at: str
    wall_time_s: float
    options: dict[str, Any] = Field(default_factory=dict, description="run options (device, caching)")

    @property
    def is_reference(self) -> bool:
        return bool(self.reference)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("bench-stability-gap", "torch", "torchvision", "timm", "peft", "fvcore", "mlflow", "numpy", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    """The commit of the harness checkout, when it is one (a pip install from PyPI has none)."""
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
    return write_or_rescue(path, result.model_dump_json(indent=1), f"the result of run {result.run_id}")


def parse_result(data: bytes, path: Path) -> RunResult:
    """A result from the bytes of its file; anything else is a BenchError naming ``path``."""
    try:
        return RunResult.model_validate_json(data)
    except (ValidationError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BenchError(f"Result file {path} is corrupt or not a bench result: {str(exc).splitlines()[0]}") from None


def load_result(path: Path) -> RunResult:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BenchError(f"Result file {path} cannot be read: {exc.strerror or exc}.") from None
    return parse_result(data, path)


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
                exc.errno, "unusable symbolic link")
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
                data = path.read_bytes()
            except OSError as exc:  # unreadable is junk to skip; unparsable comes back as its error
                skip(path, f"cannot be read ({exc.strerror})")
                continue
            try:
                out.append((path, parse_result(data, path)))
            except BenchError as err:
                out.append((path, err))
    return out


def iter_results(root: Path, protocol: str | None = None,
                 skip: Skip = warn_skipped) -> list[tuple[Path, RunResult | BenchError]]:
    """Every result file under ``root/runs`` (or ``root/runs/<protocol>``): see ``scan_results``."""
    return scan_results(root / "runs" / protocol if protocol else root / "runs", skip)


def find_joint(root: Path, protocol_name: str, protocol_hash: str, seed: int) -> tuple[Path, RunResult] | None:
    """The newest complete joint reference run for this protocol spec and seed."""
    found = [
        (p, r) for p, r in iter_results(root, protocol_name)
        if isinstance(r, RunResult) and r.is_reference and r.status == "complete"
        and r.protocol.hash == protocol_hash and r.seed == seed
    ]
    return max(found, key=lambda pr: pr[1].started_at) if found else None
