"""The referee (harness/run/referee.py): the rules as data, judged at the run's fixed points by tier, and the
guide's rules table rendered from them."""

from __future__ import annotations

import typing

import pytest
import torch
from torch import nn

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.run import referee
from bench_stability_gap.harness.run.budget_guards import Observed
from bench_stability_gap.harness.run.referee import RULES, WHEN, Facts, Referee, auditing, isolated_predict
from bench_stability_gap.harness.tools.check_method import AUDITS

STASH: list = []  # a module global a predict below leaves data in


def test_the_guides_rules_table_is_the_one_rendered_from_RULES():
    text = referee.GUIDE.read_text()
    assert referee.guide_with_table(text) == text, \
        "docs/writing-a-method.md's rules table differs: python -m bench_stability_gap.harness.run.referee --write"
    assert referee.main(["--check"]) == 0
    for rule in RULES:
        assert f"| `{rule.name}` |" in text


def test_every_rule_is_named_once_checked_at_known_points_and_says_what_it_forbids():
    assert len({r.name for r in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.points and set(rule.points) <= set(typing.get_args(referee.Point)) == set(WHEN)
        assert rule.tier in typing.get_args(referee.Tier) and len(rule.message) > 40
        # a rule without a check is enforced where the method asks (a lent object) or by check-method's re-runs
        assert (rule.check is None) == bool(set(rule.points) & {"request", "audit"})
    # check-method runs exactly the audit rules, each under its own outcome
    assert set(AUDITS.values()) == {r.name for r in RULES if "audit" in r.points}


class Named:
    name = "m"


def observed(made: int = 1, trained: int = 8) -> Observed:
    return Observed(stats=None, made=made, trained=trained, part="head", limit=16)  # type: ignore[arg-type]


def test_a_broken_rule_raises_the_finding_then_the_rule_and_a_kept_one_nothing():
    ref = Referee(audit=False)
    ref.at("after_update", Facts(Named(), observed=observed()))
    with pytest.raises(BenchError, match=r"'m' made 2 optimizer steps in one observe\(\) call\. Rule: .*exactly one "
                                         r"optimizer step per observe"):
        ref.at("after_update", Facts(Named(), observed=observed(made=2)))
    with pytest.raises(BenchError, match=r"'m' trained on 17 samples .*allows 16 per update\. Rule: backward"):
        ref.at("after_update", Facts(Named(), observed=observed(trained=17)))
    with pytest.raises(BenchError, match=r"'m' made 1 optimizer step\(s\) outside observe\(\) \(predict\)\. Rule: "):
        ref.at("before_update", Facts(Named(), steps=4, granted=3, since="predict"))


class Closure:
    """A predict that leaves its inputs in a list a closure holds (not an attribute of the method)."""

    name = "closure"

    def __init__(self) -> None:
        kept: list = []
        self.keep = lambda x: kept.append(x)
        self.model = nn.Linear(4, 2)

    def predict(self, x):
        self.keep(x)
        return self.model(x)


class Global(Closure):
    def predict(self, x):
        STASH.append(x)
        return self.model(x)


@pytest.mark.parametrize("cls, seen", [(Closure, r"its keep\.<closure kept>"), (Global, r"test_referee\.STASH")])
def test_the_reflective_audits_run_in_check_method_only(cls, seen):
    for audit in (False, True):
        with auditing() if audit else torch.no_grad():
            ref = Referee()
        assert ref.audit is audit
        method = cls()
        if not audit:  # every run's tier: the cheap checks only, which this predict passes
            with isolated_predict(method, shared=[], referee=ref) as predict:
                predict(torch.ones(1, 4))
            continue
        with pytest.raises(BenchError, match=rf"'closure': predict\(\) changed {seen}.*Rule: evaluation teaches"):
            with isolated_predict(method, shared=[], referee=ref) as predict:
                predict(torch.ones(1, 4))
    STASH.clear()


def test_the_every_run_tier_still_catches_a_predict_that_keeps_inputs_in_an_attribute():
    class Keeper(Closure):
        def predict(self, x):
            self.kept = x
            return self.model(x)

    with pytest.raises(BenchError, match=r"predict\(\) changed its kept while being evaluated\. Rule: evaluation"):
        with isolated_predict(Keeper(), shared=[], referee=Referee(audit=False)) as predict:
            predict(torch.ones(1, 4))


def test_the_referee_changes_no_number_of_a_run(capped_workbench, tmp_path, monkeypatch):
    """Judged with every tier, or not judged at all, a run gives bit-identical curves and budget: the checks
    draw no random number and add no float op to the model's path."""
    from bench_stability_gap.harness.run.continual import run_cl
    from bench_stability_gap.harness.run.options import RunOptions
    from bench_stability_gap.methods.registry import build_method

    options = RunOptions(results_dir=tmp_path, progress=False, log=False)

    def run() -> tuple:
        _, method = build_method("vanilla", capped_workbench.protocol.name)
        curves, budget, _ = run_cl(capped_workbench, method, 0, options)
        return curves, budget

    with auditing():
        judged = run()
    judgements: list[str] = []
    monkeypatch.setattr(Referee, "at", lambda self, point, facts: judgements.append(point))
    assert run() == judged and "evaluation" in judgements and "after_update" in judgements
