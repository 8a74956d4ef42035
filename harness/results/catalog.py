"""Every number bench reports, described once: key, symbol, direction, digits, unit, meaning.

The CLI summary (``harness.cli.print_summary``), the leaderboard's columns (``leaderboard.aggregate.COLUMNS``)
and the glossary page (``leaderboard.glossary``) all read this table, so a symbol, a direction, a
precision or a sentence cannot disagree between them. ``format_value`` is the one display rule.

A metric that is a function of one run's curves alone is declared here with its ``compute`` function:
that entry is all it takes for ``compute_metrics`` to store it, MLflow to log it, the tidy frame to hold
it as a column (its ``key``) and the leaderboard to offer it as an optional column (``optional``).

``equation`` is constant HTML written here (never data from a result); the glossary marks it safe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from . import cl_metrics
from .curves import SessionCurve

Direction = Literal["min", "max", "ref"]  # ref: a reference the others are scored against, not a score


@dataclass(frozen=True)
class MetricInfo:
    key: str  # the name in RunResult.metrics, MLflow and the tidy frame
    symbol: str  # as the paper writes it (Unicode), for text and table headers
    name: str  # a few words
    direction: Direction
    digits: int  # display precision (see ``format_value``)
    unit: str  # "%", "M", "s", "updates", "TFLOPs" or ""
    description: str  # one line: header tooltips, the CLI summary
    meaning: str  # the glossary's paragraph
    equation: str  # constant HTML for the glossary
    symbol_html: str = ""  # the symbol with sub/superscripts, when it differs from ``symbol``
    ranked: bool = True  # False: shown, never sorted by or marked best (wall time: hardware, not method)
    # one run's curves alone (None: not recorded)
    compute: Callable[[Sequence[SessionCurve]], float | None] | None = None
    optional: bool = False  # a leaderboard column shown on request (``--columns``, the site's toggle)
    # time to result: (``TimeToResult`` field, divisor to the unit); the metric is the mean of that per-session
    # list over the sessions that reached the level, shown with how many did (``Metrics.value``, ``reached``)
    per_session: tuple[str, float] | None = None

    @property
    def arrow(self) -> str:
        return {"min": "↓", "max": "↑"}.get(self.direction, "")

    @property
    def html_symbol(self) -> str:
        return self.symbol_html or self.symbol


def _omega(kind: str, acc: str, ref: str) -> str:
    """The paper's gap equation (eq. 1-3) for one kind of accuracy, as HTML."""
    return (f"1 − <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> Ω<sub>j</sub><sup>{kind}</sup>, &nbsp; "
            f"Ω<sub>j</sub><sup>{kind}</sup> = Σ<sub>i</sub> w<sub>i</sub> · A<sub>i</sub>({acc}) / {ref}({acc})")


_TTR_COMMON = (
    " Read at eval points and counted from the session's update-0 point (TFLOPs: the training compute spent "
    "since that point, as the run's FLOP meter counts it). A session that never gets there is not reached: it is "
    "left out of the mean and counted apart, so the cell reads “mean (r/t sessions)”, r reached out of t over the "
    "row's runs; “–” when no session of the run reached it (or, for TFLOPs, the run recorded no FLOPs). Shown for "
    "update- and FLOP-budgeted protocols alike, never ranked: a mean over the sessions reached is not comparable "
    "between rows that reached different sessions.")
_TTR_OLD = ("Time to result on the old classes: how long after each session starts the old-class accuracy is "
            "back at 99 % of the joint model's on the same classes, A<sub>joint</sub>(E<sub>1:j−1</sub>) (the "
            "paper's Table 4 reading on all old classes). 0: it never fell below that level in the session."
            + _TTR_COMMON)
_TTR_OLD_EQ = ("first eval point, after the first one below it, where A<sub>i</sub>(E<sub>1:j−1</sub>) ≥ 0.99 · "
               "A<sub>joint</sub>(E<sub>1:j−1</sub>) (0 if never below); mean over the sessions j that reach it")
_TTR_NEW = ("Time to result on the new classes: how long after each session starts the new-class accuracy first "
            "reaches 99 % of A<sub>best</sub>(E<sub>j</sub>), the level P<sub>Δ</sub> is measured against (the "
            "paper's Fig. 5 against the protocol's best instead of the run's own)." + _TTR_COMMON)
_TTR_NEW_EQ = ("first eval point where A<sub>i</sub>(E<sub>j</sub>) ≥ 0.99 · A<sub>best</sub>(E<sub>j</sub>); "
               "mean over the sessions j that reach it")


def _time_to_result(which: str, unit: str) -> MetricInfo:
    """One of the four time-to-result entries: old classes back at 99 % of the joint model, or new classes
    at 99 % of A_best, counted in updates or in training TFLOPs from the session's start."""
    old, updates = which == "old", unit == "updates"
    goal = "recover old classes" if old else "learn new classes"
    until = ("old-class accuracy is back at 99 % of the joint model's" if old
             else "new-class accuracy first reaches 99 % of A_best")
    amount = "updates" if updates else "training TFLOPs"
    return MetricInfo(
        f"ttr_{which}_{unit}", f"T_{which}", f"{amount} to {goal} (time to result)", "min", 0 if updates else 3,
        "updates" if updates else "TFLOPs",
        f"{amount} from a session's start until {until}; mean over the sessions that "
        f"{'got back' if old else 'reached it'}, with how many did",
        _TTR_OLD if old else _TTR_NEW, _TTR_OLD_EQ if old else _TTR_NEW_EQ, f"T<sub>{which}</sub>", ranked=False,
        per_session=(f"{which}_{'updates' if updates else 'flops'}", 1.0 if updates else 1e12))


CATALOG: tuple[MetricInfo, ...] = (
    MetricInfo("params", "#P", "trainable parameters", "min", 2, "M", "trainable parameters, in millions",
               "What the method may change: the whole body and head for vanilla rehearsal, the head for "
               "output-layer-only, LoRA adapters and the head for SGM.",
               "#P = number of parameters that receive gradient updates (millions)"),
    MetricInfo("S_delta", "S_Δ", "stability gap", "min", 3, "",
               "stability gap: old-class accuracy missing vs. the joint model",
               "How much accuracy on the previously learned classes is missing while a session is learned, "
               "relative to a joint model trained on everything seen so far. Negative values mean transfer.",
               "S<sub>Δ</sub> = " + _omega("old", "E<sub>1:j−1</sub>", "A<sub>joint</sub>"), "S<sub>Δ</sub>"),
    MetricInfo("P_delta", "P_Δ", "plasticity gap", "min", 3, "",
               "plasticity gap: new-class accuracy missing vs. A_best (the protocol's reference runs, same seed)",
               "How slowly the new classes of each session are learned, relative to A<sub>best</sub>: the best "
               "accuracy on them reached by the protocol's reference methods (its best_new_reference, default "
               "settings, same seed: each seed has its own class order) or by the run itself. A submitted run "
               "never moves another run's P<sub>Δ</sub>.",
               "P<sub>Δ</sub> = " + _omega("new", "E<sub>j</sub>", "A<sub>best</sub>"), "P<sub>Δ</sub>"),
    MetricInfo("P_delta_paper", "P_Δ (paper)", "plasticity gap, paper's form", "min", 3, "",
               "plasticity gap vs. the best new-class accuracy of any ranked run of the same seed",
               "P<sub>Δ</sub> as the paper computes it: A<sub>best</sub> is the best accuracy on the new classes "
               "reached by any ranked run of the protocol with the same seed. It moves when a better learner is "
               "added, so it is shown beside P<sub>Δ</sub>, not instead of it.",
               "P<sub>Δ</sub> with A<sub>best</sub> = max over ranked runs", "P<sub>Δ</sub> (paper)"),
    MetricInfo("CK_delta", "CK_Δ", "continual knowledge gap", "min", 3, "",
               "continual knowledge gap: all-class accuracy missing vs. the joint model",
               "The balance of old and new knowledge: accuracy on all classes seen so far, relative to the "
               "joint model.",
               "CK<sub>Δ</sub> = " + _omega("all", "E<sub>1:j</sub>", "A<sub>joint</sub>"), "CK<sub>Δ</sub>"),
    MetricInfo("sigma", "σ", "pre-training accuracy", "max", 2, "%", "final accuracy on the pre-training classes",
               "Final accuracy on the classes of the deployed model (session 1): what must not be lost.",
               "σ = A<sub>U<sub>N</sub></sub>(E<sub>1</sub>) &nbsp;(%)"),
    MetricInfo("mu", "μ", "average accuracy", "max", 2, "%",
               "mean end-of-session accuracy on all seen classes, sessions 2..N",
               "Mean over learning sessions of the end-of-session accuracy on all classes seen so far.",
               "μ = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>j=2..N</sub> "
               "A<sub>U<sub>j</sub></sub>(E<sub>1:j</sub>) &nbsp;(%)"),
    MetricInfo("alpha", "α", "final accuracy", "max", 2, "%", "final accuracy on all classes",
               "Accuracy on all classes at the end of the stream, the classic continual-learning number.",
               "α = A<sub>U<sub>N</sub></sub>(E<sub>1:N</sub>) &nbsp;(%)"),
    MetricInfo("updates", "updates", "optimizer updates", "min", 0, "",
               "optimizer updates over all learning sessions",
               "Optimizer steps over all learning sessions; the protocol fixes U, so equal for every method.",
               "Σ<sub>j=2..N</sub> U<sub>j</sub>"),
    MetricInfo("tflops", "train TFLOPs", "training compute", "min", 2, "",
               "training compute, 10¹² floating-point operations",
               "Counted by the harness (forward only through frozen parts, forward + backward where gradients "
               "flow). Shown as “–” until the run recorded FLOPs.",
               "2 × MACs × samples, summed over the parts each sample passes through, / 10<sup>12</sup>"),
    MetricInfo("wall", "wall time", "wall-clock time", "min", 1, "s", "wall-clock time of the run, in seconds",
               "Time the run took on its machine (continual learning only, without the joint reference). "
               "Only comparable between runs on the same hardware, so it is shown but never ranked or marked.",
               "seconds", ranked=False),
    MetricInfo("min_acc", "min-ACC", "worst-case old-task accuracy (De Lange et al.)", "max", 2, "%",
               "De Lange et al.'s worst-case accuracy on the earlier tasks",
               "Shown on each run's page and in the CLI summary.",
               "min-ACC = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>k&lt;N</sub> min<sub>i after k was learned</sub> "
               "A<sub>i</sub>(E<sub>k</sub>)"),
    MetricInfo("wc_acc", "WC-ACC", "worst-case accuracy (De Lange et al.)", "max", 2, "%",
               "De Lange et al.'s worst-case accuracy, final task included",
               "Shown on each run's page and in the CLI summary.",
               "WC-ACC = <sup>1</sup>⁄<sub>N</sub> A<sub>final</sub>(E<sub>N</sub>) + (1 − <sup>1</sup>⁄<sub>N</sub>) "
               "· min-ACC"),
    MetricInfo("recovery", "recovery@p", "updates to recover accuracy on the pre-training classes (paper Table 4)",
               "min", 0, "",
               "updates to recover p % of the joint model's accuracy on the pre-training classes, per session",
               "0 means no stability gap at all; “–” means the run never recovered in that session.",
               "first eval point after the drop where A<sub>i</sub>(E<sub>1</sub>) ≥ p · "
               "A<sub>joint</sub>(E<sub>1</sub>), p ∈ {97, 98, 99, 100} %"),
    MetricInfo("to_best", "to 99% best", "updates to learn the new classes (paper Fig. 5)", "min", 0, "",
               "updates to reach 99 % of the run's own best new-class accuracy, per session",
               "How fast a method learns each session's new classes, to its own best level.",
               "first eval point where A<sub>i</sub>(E<sub>j</sub>) ≥ 0.99 · "
               "max<sub>i</sub> A<sub>i</sub>(E<sub>j</sub>) "
               "of the same run"),
    *(_time_to_result(which, unit) for which in ("old", "new") for unit in ("updates", "tflops")),
    MetricInfo("A_joint", "A_joint", "joint reference", "ref", 2, "%",
               "accuracy of a model trained jointly on every session so far",
               "The upper bound, owned by the harness: the newest complete joint run with the same protocol "
               "hash and seed as the run scored, made with the protocol's joint settings (a joint run given "
               "modifiers or --set is never used).",
               "A<sub>joint</sub>(E) = accuracy on E of a model trained jointly on S<sub>1</sub>..S<sub>j</sub>",
               "A<sub>joint</sub>"),
    MetricInfo("A_best", "A_best", "best new-class accuracy", "ref", 2, "%",
               "best new-class accuracy of the protocol's reference runs (same seed) or the run scored",
               "Per seed and session, over the runs of the protocol's reference set (best_new_reference, "
               "default settings, the same seed) and the run being scored: a submitted run never moves "
               "another run's reference. The paper's form (over every ranked run of the seed) gives "
               "P<sub>Δ</sub> (paper).",
               "A<sub>best</sub>(E<sub>j</sub>) = max over reference runs r (and the scored run) and eval "
               "points i of A<sub>i</sub><sup>r</sup>(E<sub>j</sub>)",
               "A<sub>best</sub>"),
    MetricInfo("acc", "ACC", "final accuracy over tasks (Lopez-Paz & Ranzato)", "max", 2, "%",
               "final accuracy averaged over tasks, each task weighing the same",
               "Lopez-Paz & Ranzato's ACC: the accuracy on each task's classes at the end of the stream, "
               "averaged over tasks (α averages over test images instead).",
               "ACC = <sup>1</sup>⁄<sub>N</sub> Σ<sub>k=1..N</sub> R<sub>N,k</sub> &nbsp;(%)",
               compute=cl_metrics.final_task_accuracy, optional=True),
    MetricInfo("avg_acc", "Ā", "average accuracy over sessions (Chaudhry et al.)", "max", 2, "%",
               "task-averaged accuracy after each session, averaged over sessions 2..N",
               "Chaudhry et al.'s average accuracy A<sub>i</sub> after each learning session, averaged over "
               "the sessions: the task-averaged counterpart of μ.",
               "Ā = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>i=2..N</sub> <sup>1</sup>⁄<sub>i</sub> Σ<sub>k=1..i</sub> "
               "R<sub>i,k</sub> &nbsp;(%)", compute=cl_metrics.average_task_accuracy, optional=True),
    MetricInfo("forgetting", "F", "average forgetting (Chaudhry et al.)", "min", 2, "%",
               "how far each earlier task fell from its best end-of-session accuracy, in points",
               "Chaudhry et al.'s average forgetting: for each task before the last, its best accuracy at the "
               "end of any earlier session minus its final accuracy, averaged.",
               "F = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>k=1..N−1</sub> (max<sub>l=k..N−1</sub> R<sub>l,k</sub> − "
               "R<sub>N,k</sub>) &nbsp;(points)", compute=cl_metrics.average_forgetting, optional=True),
    MetricInfo("bwt", "BWT", "backward transfer (Lopez-Paz & Ranzato)", "max", 2, "%",
               "change on each earlier task from right after it was learned to the end, in points",
               "Lopez-Paz & Ranzato's backward transfer: negative values are forgetting.",
               "BWT = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>k=1..N−1</sub> (R<sub>N,k</sub> − R<sub>k,k</sub>) "
               "&nbsp;(points)", compute=cl_metrics.backward_transfer, optional=True),
    MetricInfo("fwt", "FWT", "forward transfer (Lopez-Paz & Ranzato)", "max", 2, "%",
               "accuracy on each task's classes before they are learned, in points (baseline 0)",
               "Lopez-Paz & Ranzato's forward transfer with the baseline b<sub>k</sub> = 0 (bench trains no "
               "randomly initialised model): accuracy on the classes still to come of the model each session "
               "starts from (its before point, ahead of begin_session), 0 for a class-incremental head, "
               "which has no units for them yet.",
               "FWT = <sup>1</sup>⁄<sub>N−1</sub> Σ<sub>k=2..N</sub> (R<sub>k−1,k</sub> − b<sub>k</sub>), "
               "b<sub>k</sub> = 0 &nbsp;(points)", compute=cl_metrics.forward_transfer, optional=True),
)

METRICS: dict[str, MetricInfo] = {m.key: m for m in CATALOG}
# Metrics computed from one run's curves alone, by their catalog entry (``compute_metrics`` runs them).
CURVE_METRICS: tuple[MetricInfo, ...] = tuple(m for m in CATALOG if m.compute is not None)
# Leaderboard columns shown only on request.
OPTIONAL_KEYS: tuple[str, ...] = tuple(m.key for m in CATALOG if m.optional)

# Time to result (``MetricInfo.per_session``), updates and TFLOPs side by side.
TIME_TO_RESULT_KEYS: tuple[str, ...] = tuple(m.key for m in CATALOG if m.per_session is not None)

# The leaderboard's columns (the paper's Table 1 plus the budget figures and time to result) and the CLI summary's rows.
TABLE_KEYS: tuple[str, ...] = ("params", "S_delta", "P_delta", "P_delta_paper", "CK_delta",
                               "sigma", "mu", "alpha", "updates",
                               "tflops") + TIME_TO_RESULT_KEYS + ("wall",)
SUMMARY_KEYS: tuple[str, ...] = ("params", "S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha", "min_acc",
                                 "wc_acc")
# Accuracies stored as fractions (or percentages, by the run's own choice) and shown in %.
ACCURACY_KEYS: tuple[str, ...] = ("sigma", "mu", "alpha", "min_acc", "wc_acc") + tuple(m.key for m in CURVE_METRICS)


def _tiny_compute(value: float, info: MetricInfo) -> bool:
    """TFLOPs too small for the column's digits (a tiny protocol spends hundredths): scientific notation."""
    return (info.key == "tflops" or info.unit == "TFLOPs") and 0 < abs(value) < 0.01


def format_value(value: float | None, info: MetricInfo) -> str:
    """The metric's display precision; "–" for a missing value; tiny TFLOPs in scientific notation."""
    if value is None:
        return "–"
    if _tiny_compute(value, info):
        return f"{value:.2e}"
    return f"{value:,.{info.digits}f}" if info.digits == 0 else f"{value:.{info.digits}f}"


def format_std(std: float | None, info: MetricInfo) -> str | None:
    """The ± part: one more digit than the mean for the gaps (as the paper prints it); none when 0 or absent."""
    if std is None or std == 0:
        return None
    if _tiny_compute(std, info):
        return f"{std:.1e}"
    digits = info.digits + 1 if info.digits >= 3 and info.unit != "TFLOPs" else info.digits
    return f"{std:.{digits}f}"


def displayed(value: float, info: MetricInfo) -> float:
    """The value as a reader sees it (``format_value``): what rankings and marks compare, so two cells
    that read the same are tied, never one bold and one not."""
    return float(format_value(value, info).replace(",", ""))
