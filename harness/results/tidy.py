"""Stored results as tidy pandas frames: the one table aggregation, plots and exports read.

``curves_frame`` holds one row per run × session × eval point (long format), ``references_frame`` one
row per joint run × session, ``runs_frame`` one row per run with its summary numbers. The
leaderboard's mean ± std tables (``seed_stats``), its plots and the MLflow curves CSV are all built
from these frames, so a number cannot be computed two ways. Accuracies are kept as stored
(fractions or percentages, the run's choice); ``scale`` says what turns a run's accuracies into %.

The row label of a run (``method``) is passed in: which settings make a variant row is the caller's
rule, not this module's; by default it is the method string the run was started with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from .catalog import ACCURACY_KEYS, TABLE_KEYS, TIME_TO_RESULT_KEYS
from .metrics import Metrics
from .schema import RunResult, run_identity

if TYPE_CHECKING:  # the frames load pandas where they are made: a run's summary line needs none of it
    import pandas as pd

# what, beside protocol and method, keeps runs apart (``schema.run_identity``): group by these too
IDENTITY_KEYS: tuple[str, ...] = ("precision", "settings", "threads", "cpu_kernels")
RUN_KEYS: tuple[str, ...] = ("run_id", "protocol", "protocol_hash", "method", "method_spec", "seed", *IDENTITY_KEYS)
CURVE_KEYS: tuple[str, ...] = ("old", "new", "all")
VALUE_KEYS: tuple[str, ...] = TABLE_KEYS + tuple(k for k in ACCURACY_KEYS if k not in TABLE_KEYS)
# Beside each time-to-result value: how many of the run's sessions reached the level (``sessions``: how many
# learning sessions it had), so a mean over the sessions reached never reads as a mean over all of them.
REACHED_KEYS: tuple[str, ...] = tuple(f"{k}_reached" for k in TIME_TO_RESULT_KEYS) + ("sessions",)


def accuracy_scale(result: RunResult) -> float:
    """100 when the run stores accuracies as fractions (shown as %), 1 when it stores percentages."""
    values = [v for c in result.curves for v in (*c.old, *c.new, *c.all)]
    values += [v for r in result.reference for v in (r.old, r.new, r.all)]
    return 100.0 if not values or max(values) <= 1.0 + 1e-9 else 1.0


def _constants(result: RunResult, labels: Mapping[str, str] | None) -> dict[str, object]:
    """The per-run columns every row of that run repeats (tidy: no lookups needed to group or filter)."""
    return {"run_id": result.run_id, "protocol": result.protocol.name, "protocol_hash": result.protocol.hash,
            "method": (labels or {}).get(result.run_id, result.method.spec), "method_spec": result.method.spec,
            "seed": result.seed, **run_identity(result)}


def curves_frame(results: Iterable[RunResult], labels: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per run × learning session × eval point.

    Columns: the run constants (``RUN_KEYS``, ``scale``), ``session``, ``point`` (index within the
    session), ``update`` (within the session), ``total_updates`` (U_j), ``fraction`` (update / U_j),
    ``global_update`` (updates since the first learning session began), ``old``/``new``/``all``,
    ``task_1``.. (accuracy on the classes first seen in session k; NaN where session < k),
    ``train_flops`` (cumulative over the run; NaN when not recorded) and ``session_tflops`` (training TFLOPs
    spent since the session's update-0 point: the compute axis of the curves). Runs without curves (joint
    references) add no rows.
    """
    import pandas as pd

    rows: list[dict[str, object]] = []
    n_tasks = 0
    for r in results:
        const = {**_constants(r, labels), "scale": accuracy_scale(r)}
        offset = 0
        for c in sorted(r.curves, key=lambda c: c.session):
            n_tasks = max(n_tasks, len(c.tasks))
            flops = c.train_flops or [math.nan] * len(c.updates)
            for p, u in enumerate(c.updates):
                row = {**const, "session": c.session, "point": p, "update": u, "total_updates": c.total_updates,
                       "fraction": u / c.total_updates, "global_update": offset + u,
                       "old": c.old[p], "new": c.new[p], "all": c.all[p], "train_flops": flops[p],
                       "session_tflops": (flops[p] - flops[0]) / 1e12}
                row.update({f"task_{k + 1}": t[p] for k, t in enumerate(c.tasks)})
                rows.append(row)
            offset += c.total_updates
    columns = [*RUN_KEYS, "scale", "session", "point", "update", "total_updates", "fraction", "global_update",
               *CURVE_KEYS, *(f"task_{k + 1}" for k in range(n_tasks)), "train_flops", "session_tflops"]
    return pd.DataFrame(rows, columns=columns)


def references_frame(results: Iterable[RunResult], labels: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per joint run × session: A_joint on the old, new and all classes (and per task)."""
    import pandas as pd

    rows: list[dict[str, object]] = []
    n_tasks = 0
    for r in results:
        const = {**_constants(r, labels), "scale": accuracy_scale(r)}
        for ref in sorted(r.reference, key=lambda ref: ref.session):
            n_tasks = max(n_tasks, len(ref.tasks))
            rows.append({**const, "session": ref.session, "old": ref.old, "new": ref.new, "all": ref.all,
                         **{f"task_{k + 1}": t for k, t in enumerate(ref.tasks)}})
    columns = [*RUN_KEYS, "scale", "session", *CURVE_KEYS, *(f"task_{k + 1}" for k in range(n_tasks))]
    return pd.DataFrame(rows, columns=columns)


def run_values(result: RunResult, metrics: Metrics | None) -> dict[str, float | None]:
    """One run's summary numbers (``VALUE_KEYS``), accuracies in %; None where not available.

    A joint reference has no gaps: its σ and α are its last session's accuracies. A CL run's metrics
    are passed in (recomputed against the current references), never read from the stored result.
    """
    budget = result.budget
    out: dict[str, float | None] = {k: None for k in VALUE_KEYS}
    out.update(params=result.trainable_params / 1e6, updates=float(budget.optimizer_steps),
               tflops=None if budget.train_flops is None else budget.train_flops / 1e12, wall=result.wall_time_s)
    scale = accuracy_scale(result)
    if result.is_reference and result.reference:
        last = max(result.reference, key=lambda r: r.session)
        out["sigma"] = last.tasks[0] * scale if last.tasks else None
        out["alpha"] = last.all * scale
    elif metrics is not None:
        out.update(S_delta=metrics.S_delta, P_delta=metrics.P_delta, CK_delta=metrics.CK_delta)
        out.update({k: None if (v := metrics.value(k)) is None else v * scale for k in ACCURACY_KEYS})
        out.update({k: metrics.value(k) for k in TIME_TO_RESULT_KEYS})
    return out


def reached_counts(metrics: Metrics | None) -> dict[str, float | None]:
    """``REACHED_KEYS`` of one run: sessions that reached each time-to-result level, and its session count
    (None where not recorded: no metrics, no time to result, no FLOPs)."""
    out: dict[str, float | None] = {k: None for k in REACHED_KEYS}
    if metrics is None or metrics.time_to_result is None:
        return out
    for key in TIME_TO_RESULT_KEYS:
        reached = metrics.reached(key)
        out[f"{key}_reached"] = None if reached is None else float(len(reached))
    out["sessions"] = float(metrics.sessions)
    return out


def runs_frame(results: Iterable[RunResult], metrics: Mapping[str, Metrics | None] | None = None,
               labels: Mapping[str, str] | None = None,
               extra: Mapping[str, Mapping[str, float | None]] | None = None) -> pd.DataFrame:
    """One row per run: the run constants, status, start time, its ``run_values`` and ``reached_counts`` (NaN: missing);
    ``extra`` adds values that depend on other runs (P_Δ against the paper's A_best), by run id."""
    import pandas as pd

    rows = [{**_constants(r, labels), "status": r.status, "is_reference": r.is_reference,
             "started_at": r.started_at, **run_values(r, (metrics or {}).get(r.run_id)),
             **reached_counts((metrics or {}).get(r.run_id)), **(extra or {}).get(r.run_id, {})} for r in results]
    numbers = [*VALUE_KEYS, *REACHED_KEYS]
    frame = pd.DataFrame(rows, columns=[*RUN_KEYS, "status", "is_reference", "started_at", *numbers])
    frame[numbers] = frame[numbers].astype(float)
    return frame


def seed_stats(frame: pd.DataFrame, keys: Sequence[str], by: str | Sequence[str] = "method") -> pd.DataFrame:
    """Mean, sample std and count of each key per group (a method's seeds): columns ``(key, stat)``.

    Non-finite values count as missing. The std is NaN for a single value, and exactly 0 when the
    values differ only by rounding error (so "± 0.000" never shows noise).
    """
    import numpy as np

    values = frame[list(keys)].astype(float).replace([np.inf, -np.inf], np.nan)
    by = [by] if isinstance(by, str) else list(by)
    stats = values.groupby([frame[b] for b in by], sort=False).agg(["mean", "std", "count"])
    for key in keys:
        mean, std = stats[(key, "mean")], stats[(key, "std")]
        stats.loc[std <= 1e-12 * mean.abs().clip(lower=1.0), (key, "std")] = 0.0
    return stats
