"""The referee: every fair-play rule of a run, as data, and the few fixed points of the run where they are checked.

Each rule is a ``Rule``: its name, the points of the run where it is checked, its tier (every run, or
``bench check-method`` only) and the one paragraph a user reads when it is broken. ``RULES`` lists them
all, so this is the one place to read them (docs/writing-a-method.md's table is rendered from it). The
continual loop calls ``Referee.at(point, facts)`` at its fixed points; a rule's check reads the ``Facts``
and returns what was broken, in words, or None, and the referee raises the BenchError.

Cheap invariants run in every run. The reflective audits (what closures hold, the state of a plugin's
classes and modules, the re-runs of ``bench check-method``) run where ``auditing()`` is on: check-method
turns it on around its runs. Two kinds of rule have no check here: those a lent object enforces where a
method asks it (``request``: the refusal is the check), and the re-runs of check-method (``audit``:
harness/tools/check_method.py holds them by rule name, above the run in the import graph).

A check reads counters and the method's state, and compares digests or tensors the method already
holds: it draws no random number, changes no order of evaluation and adds no float op to the model's
path, so a run's numbers are the same with the referee as without.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from torch import Tensor

from ...methods.base import Method, StepStats, TrainBatch
from ..errors import BenchError
from ..model import flops as FL
from .budget_guards import (
    Observed,
    StepCounter,
    memory_overfilled,
    observe_counted,
    steps_in_observe,
    stray_steps,
    trained_beyond_batch,
)
from .isolation import INPUTS_RULE, TEST_SPLIT_RULE, EvalCopy, copy_changes, eval_copy, owner_changes, retained_finding
from .memory import Memory

Point = Literal["session_start", "before_update", "after_update", "memory_added", "evaluation", "session_end",
                "request", "audit"]
Tier = Literal["every run", "check-method"]

WHEN: dict[Point, str] = {  # each point in the words of the guide's table
    "session_start": "a session's start",
    "before_update": "before each update",
    "after_update": "after each update",
    "memory_added": "the memory receives samples",
    "evaluation": "after each eval point",
    "session_end": "a session's end",
    "request": "when the method asks",
    "audit": "check-method's re-runs",
}


@dataclass(frozen=True, slots=True)
class Facts:
    """What the checks read at a point: the run's method and memory, the optimizer steps counted and
    granted so far (``since``: the hooks run since the last count), and the point's own: the update just
    observed, the eval copy just used, the shape of one input and the objects the harness lent."""

    method: Method
    memory: Memory | None = None
    steps: int = 0
    granted: int = 0
    since: str = ""
    observed: Observed | None = None
    copy: EvalCopy | None = None
    shape: tuple[int, ...] = ()
    lent: Sequence[object] = ()  # the harness's objects, by identity


Check = Callable[[Facts], "str | None"]


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: where it is checked, in which tier, its check (None where a lent object or check-method's
    re-run enforces it) and the paragraph that says what it forbids."""

    name: str
    points: tuple[Point, ...]
    tier: Tier
    check: Check | None
    message: str

    def breach(self, finding: str) -> BenchError:
        """The error for ``finding`` (what the method did, naming it): the finding, then the rule."""
        return BenchError(f"{finding} Rule: {self.message}")


def _observed(f: Facts, judge: Callable[[Method, Observed], str | None]) -> str | None:
    assert f.observed is not None
    return judge(f.method, f.observed)


def _memory(f: Facts) -> str | None:
    return None if f.memory is None else memory_overfilled(f.method, f.memory)  # None: a loop without one (perf)


def _retained(f: Facts) -> str | None:
    assert f.memory is not None
    return retained_finding(f.method, f.memory, f.shape, f.lent)


def _copy(f: Facts, closures: bool) -> str | None:
    assert f.copy is not None
    return copy_changes(f.copy, closures)


def _owners(f: Facts) -> str | None:
    assert f.copy is not None
    return owner_changes(f.copy)


EVAL_RULE = ("evaluation teaches a method nothing (the harness evaluates a throwaway copy and checks it is "
             "unchanged); keep test inputs, labels or statistics of them out of the method's state.")

RULES: tuple[Rule, ...] = (
    Rule("one_step_per_observe", ("after_update",), "every run", lambda f: _observed(f, steps_in_observe),
         "the protocol's budget is exactly one optimizer step per observe() call."),
    Rule("batch_per_update", ("after_update",), "every run", lambda f: _observed(f, trained_beyond_batch),
         "backward through at most the protocol's batch per update (trunk, body, head, and copies of them). Extra "
         "forward passes without gradient (teacher logits, init passes) are allowed and counted as FLOPs; "
         "training samples are not."),
    Rule("memory_cap", ("after_update", "memory_added", "session_end"), "every run", _memory,
         "the rehearsal memory is the harness's and never holds more than the protocol's cap; a method's own "
         "eviction policy must keep it within the cap."),
    Rule("retained_samples", ("session_end",), "every run", _retained,
         "what a method retains between sessions counts against the cap; store samples through the harness's "
         "memory (input-shaped tensors or arrays the method keeps elsewhere count as samples, beyond its "
         "retained_allowance)."),
    Rule("no_steps_outside_observe", ("session_start", "before_update", "session_end"), "every run",
         lambda f: stray_steps(f.method, f.steps, f.granted, f.since),
         "the protocol's budget is exactly one update per observe() call and none elsewhere (setup, "
         "begin_session, predict, end_session)."),
    Rule("eval_copy_unchanged", ("evaluation",), "every run", lambda f: _copy(f, closures=False), EVAL_RULE),
    Rule("eval_closures_unchanged", ("evaluation",), "check-method", lambda f: _copy(f, closures=True),
         f"{EVAL_RULE} What functions, bound methods and partials the method keeps hold counts as its state."),
    Rule("eval_module_state_unchanged", ("evaluation",), "check-method", _owners,
         f"{EVAL_RULE} The class attributes of the method's classes and the globals of every module of its "
         f"package count as its state."),
    Rule("no_test_split", ("request",), "every run", None, TEST_SPLIT_RULE),
    Rule("inputs_from_memory_or_session", ("request",), "every run", None, INPUTS_RULE),
    Rule("determinism", ("audit",), "check-method", None,
         "same seed, same numbers (draw randomness from ctx.rng / ctx.generator)."),
    Rule("eval_independence", ("audit",), "check-method", None,
         "evaluation teaches a method nothing: what predict sees must not reach training, by any route (a global "
         "of another package's module, an object found through the garbage collector); the run made again with "
         "its evaluations shown other test images trains exactly the same."),
    Rule("state_round_trip", ("audit",), "check-method", None,
         "a method's state_dict holds everything it keeps besides the model and the memory, so a run can be "
         "checkpointed and resumed: saved and loaded into a fresh instance, it gives the same state back."),
    Rule("resume", ("audit",), "check-method", None,
         "state_dict/load_state_dict hold everything the method keeps, so a run stopped mid-session and resumed "
         "by a fresh instance is bit-identical to the uninterrupted one."),
    Rule("loss_terms_train", ("audit",), "check-method", None,
         "each term of the loss (loss_terms) leaves a non-zero gradient on some parameter the optimizer updates, "
         "at every update, once the modifiers are applied."),
)

BY_NAME: dict[str, Rule] = {rule.name: rule for rule in RULES}

_AUDITING: ContextVar[bool] = ContextVar("bench_referee_auditing", default=False)


@contextmanager
def auditing() -> Iterator[None]:
    """The check-method tier on for the runs made inside (``bench check-method``)."""
    token = _AUDITING.set(True)
    try:
        yield
    finally:
        _AUDITING.reset(token)


class Referee:
    """The rules of the tiers in force, by point: ``at(point, facts)`` raises the first rule broken there."""

    def __init__(self, audit: bool | None = None) -> None:
        self.audit = _AUDITING.get() if audit is None else audit
        tiers = ("every run", "check-method") if self.audit else ("every run",)
        self._at: dict[str, tuple[Rule, ...]] = {
            point: tuple(r for r in RULES if point in r.points and r.tier in tiers and r.check is not None)
            for point in WHEN}

    def at(self, point: Point, facts: Facts) -> None:
        for rule in self._at[point]:
            assert rule.check is not None
            finding = rule.check(facts)
            if finding is not None:
                raise rule.breach(finding)


def breach(name: str, finding: str) -> BenchError:
    """The error of rule ``name`` for ``finding``: for the checks made outside ``Referee.at``."""
    return BY_NAME[name].breach(finding)


@contextmanager
def isolated_predict(method: Method, shared: list[object], unused: Sequence[object] = (),
                     referee: Referee | None = None) -> Iterator[Callable[[Tensor], Tensor]]:
    """``predict`` of a throwaway copy of ``method`` (``isolation.eval_copy``); after the eval point, the
    evaluation rules of ``referee`` (every tier without one) judge what predict changed."""
    referee = referee if referee is not None else Referee(audit=True)
    copy = eval_copy(method, shared, unused, audit=referee.audit)
    yield copy.clone.predict
    referee.at("evaluation", Facts(method, copy=copy))


def check_retained_samples(method: Method, memory: Memory, shape: tuple[int, ...], skip: list[object]) -> None:
    """The ``retained_samples`` rule on its own, as a session's end checks it."""
    finding = retained_finding(method, memory, shape, skip)
    if finding is not None:
        raise breach("retained_samples", finding)


def observe_within_budget(method: Method, batch: TrainBatch, steps: StepCounter, meter: FL.FlopMeter | None,
                          limit: int) -> tuple[StepStats, int]:
    """One ``observe`` judged as the continual loop judges it (outside a run: ``tools.perf``): the method's
    stats and the samples it trained on."""
    observed = observe_counted(method, batch, steps, meter, limit)
    Referee(audit=False).at("after_update", Facts(method, observed=observed))
    return observed.stats, observed.trained


# ------------------------------------------------------------------ the guide's table

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-method.md"
BEGIN = "<!-- BEGIN GENERATED by harness/run/referee.py: edit RULES, not this -->"
END = "<!-- END GENERATED rules -->"


def rules_table() -> str:
    """``RULES`` as the guide's Markdown table: name, when it is checked, tier, what it forbids."""
    rows = ["| rule | checked | tier | what it forbids |", "|---|---|---|---|"]
    for rule in RULES:
        when = ", ".join(WHEN[p] for p in rule.points)
        text = rule.message.replace("|", "\\|")
        rows.append(f"| `{rule.name}` | {when} | {rule.tier} | {text} |")
    return "\n".join(rows)


def guide_with_table(text: str) -> str:
    """``text`` (the guide) with the part between the markers replaced by ``rules_table()``."""
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise BenchError(f"{GUIDE} lacks the markers of the rules table ({BEGIN} ... {END}).")
    return f"{head}{BEGIN}\n{rules_table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    """Print the rules table, or ``--write`` it into the guide; ``--check``: exit 1 when the guide's differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(rules_table())
        return 0
    text = GUIDE.read_text()
    rendered = guide_with_table(text)
    if args.write:
        GUIDE.write_text(rendered)
        return 0
    if rendered != text:
        print(f"{GUIDE}: the rules table differs from RULES; run python -m {__spec__.name if __spec__ else __name__} "
              f"--write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
