"""A method that misbehaves at run time (raises in a hook, exits, returns what breaks its contract) ends the
run with one paragraph and exit 2 naming the method, the hook, the point of the run and the method's own
line; nothing already computed is lost, and a rerun resumes from the run's checkpoint. A bug of the
harness itself stays a traceback; non-finite logits stop the run as 'diverged', as a non-finite loss does."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.model import flops as FL
from bench_stability_gap.harness.run.checkpoint import checkpointer
from bench_stability_gap.harness.run.continual import Diverged, run_cl
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.methods.base import StandardMethod, StepStats
from bench_stability_gap.methods.baselines import Vanilla
from bench_stability_gap.methods.configs import VanillaConfig
from support import invoke, refused, small_protocol, write_dist

THIS = Path(__file__).name


def raises(exc: BaseException) -> Callable[..., Any]:
    def act(*_: Any) -> Any:
        raise exc  # the method's own line a fault names
    return act


class Faulty(Vanilla):
    """Vanilla whose ``hook`` misbehaves (``act`` gets what the hook would return and raises, or returns
    something else): observe from its ``at``-th call on, the other hooks at every call."""

    name = "faulty"

    def __init__(self, hook: str = "", act: Callable[[Any], Any] = lambda out: out, at: int = 1) -> None:
        super().__init__(VanillaConfig())
        self.hook, self.act, self.at, self.observed = hook, act, at, 0

    def _misbehave(self, hook: str, out: Any) -> Any:
        return self.act(out) if hook == self.hook else out

    def begin_session(self, session) -> None:
        super().begin_session(session)
        self._misbehave("begin_session", None)

    def observe(self, batch):
        stats = super().observe(batch)
        self.observed += 1
        return self._misbehave("observe", stats) if self.observed >= self.at else stats

    def end_session(self, session) -> None:
        super().end_session(session)
        self._misbehave("end_session", None)

    def predict(self, x):  # on the eval copy: changes nothing of it
        return self._misbehave("predict", super().predict(x))


def _run(bench, method, tmp_path: Path, every: int | None = 1):
    saver = checkpointer(tmp_path, "run", "faulty", every, 1e9)
    options = RunOptions(results_dir=tmp_path, progress=False, log=False)
    return run_cl(bench, method, 0, options, saver), saver


def _fault(bench, method, tmp_path: Path) -> BenchError:
    with pytest.raises(BenchError) as caught:
        _run(bench, method, tmp_path)
    assert caught.value.exit_code == 2
    return caught.value


def _text(err: BaseException) -> str:
    return " ".join(str(err).split())


@pytest.mark.parametrize(("hook", "exc", "where"), [
    ("begin_session", ValueError("no such session"), "at the start of session 2"),
    ("observe", ValueError("bad batch"), "in update 2 of session 2"),
    ("end_session", KeyError("buffer"), "at the end of session 2"),
    ("predict", RuntimeError("mat1 and mat2 shapes cannot be multiplied"), "before session 2"),
])
def test_an_exception_in_a_hook_is_one_paragraph_naming_method_hook_point_and_line(capped_workbench, tmp_path, hook,
                                                                                   exc, where):
    err = _fault(capped_workbench, Faulty(hook, raises(exc), at=2), tmp_path)
    text = _text(err)
    assert f"Method 'faulty' (class {Faulty.__module__}.Faulty) failed in {hook}() {where}: " \
           f"{type(exc).__name__}: {exc}" in text, text
    assert f"{THIS}:" in text and "in act" in text  # the method's own line, for its author
    assert "The fault is in the method's code, not bench's" in text and "BENCH_DEBUG=1" in text
    assert "\n" not in str(err) and err.__cause__ is exc  # the original kept for the Python API


def test_a_fault_after_a_checkpoint_says_it_is_kept_and_a_rerun_resumes_to_the_same_numbers(capped_workbench,
                                                                                            tmp_path):
    err = _fault(capped_workbench, Faulty("observe", raises(ValueError("bad batch")), at=3), tmp_path)
    saver = checkpointer(tmp_path, "run", "faulty", 1, 1e9)
    assert saver.mid_path.is_file() and f"Its last checkpoint ({saver.mid_path}) is kept: running the same " \
                                           f"command again resumes from it" in _text(err)
    (resumed, _, _), _ = _run(capped_workbench, Faulty(), tmp_path)
    (straight, _, _), _ = _run(capped_workbench, Faulty(), tmp_path / "fresh")
    assert resumed == straight


def test_a_fault_before_any_checkpoint_says_a_rerun_starts_over(capped_workbench, tmp_path):
    err = _fault(capped_workbench, Faulty("begin_session", raises(ValueError("no"))), tmp_path)
    assert "No checkpoint of it was saved yet, so running the same command again starts it over" in _text(err)


@pytest.mark.parametrize("code", [0, 1, None])
def test_system_exit_in_a_hook_is_a_fault_not_an_exit(capped_workbench, tmp_path, code):
    err = _fault(capped_workbench, Faulty("observe", raises(SystemExit(code))), tmp_path)
    assert "failed in observe() in update 1 of session 2: SystemExit" in _text(err)


def test_observe_returning_none_is_refused_at_that_update(capped_workbench, tmp_path):
    err = _fault(capped_workbench, Faulty("observe", lambda out: None, at=2), tmp_path)
    assert "failed in observe() in update 2 of session 2: it returned None, where StepStats(loss=...) is due" \
        in _text(err)


@pytest.mark.parametrize("loss, said", [
    (lambda: torch.ones(5), "its StepStats.loss is a tensor of shape [5], where one number"),
    (lambda: "0.5", "its StepStats.loss is a str, where a 0-dim tensor or a float is due"),
])
def test_a_loss_that_is_not_one_number_is_refused_at_that_update(capped_workbench, tmp_path, loss, said):
    """A per-sample loss vector was a RuntimeError traceback at the next loss read, updates later."""
    err = _fault(capped_workbench, Faulty("observe", lambda out: StepStats(loss=loss()), at=2), tmp_path)
    assert f"failed in observe() in update 2 of session 2: {said}" in _text(err)


class Charging(Vanilla):
    """Vanilla that sets ``ctx.counters[name]`` by ``change`` (the counter's value -> its new value) in its
    ``hook``: a method taking a charge back, or writing something that is not a number."""

    name = "charging"

    def __init__(self, counter: str, change: Callable[[float], Any], hook: str = "observe") -> None:
        super().__init__(VanillaConfig())
        self.counter, self.change, self.hook = counter, change, hook

    def _charge(self) -> None:
        self.ctx.counters[self.counter] = self.change(self.ctx.counters.get(self.counter, 0.0))

    def observe(self, batch):
        stats = super().observe(batch)
        if self.hook == "observe":
            self._charge()
        return stats

    def end_session(self, session) -> None:
        super().end_session(session)
        if self.hook == "end_session":
            self._charge()


@pytest.mark.parametrize("counter, change, hook, said", [
    (FL.EXTRA_MACS, lambda v: v - 5e8, "observe", "ctx.counters['extra_macs'] went down, from 0 to -5e+08"),
    (FL.EXTRA_MACS, lambda v: v + 1e9 if v == 0 else v - 1e9, "end_session", "went down, from 1e+09 to 0"),
    (FL.TRUNK_FEATURE_SAMPLES, lambda v: math.nan, "observe", "ctx.counters['trunk_feature_samples'] is nan"),
])
def test_a_charge_taken_back_is_refused(capped_workbench, tmp_path, counter, change, hook, said):
    """A negative extra_macs bought a FLOP-budgeted session twice vanilla's updates and halved the training
    FLOPs the tables report; the JSON's declared counters were its only trace."""
    err = _fault(capped_workbench, Charging(counter, change, hook), tmp_path)
    assert "failed in one of its hooks by update " in _text(err) and said in _text(err), _text(err)


def test_a_charge_that_grows_is_counted(capped_workbench, tmp_path):
    (_, charged, _), _ = _run(capped_workbench, Charging(FL.EXTRA_MACS, lambda v: v + 1e6), tmp_path)
    (_, plain, _), _ = _run(capped_workbench, Vanilla(VanillaConfig()), tmp_path / "plain")
    updates = sum(plain.updates_per_session)
    assert charged.train_flops == pytest.approx(plain.train_flops + 2 * 1e6 * updates)


def test_logits_of_the_wrong_width_are_refused_not_scored(capped_workbench, tmp_path):
    classes = capped_workbench.deployed.head.num_classes
    err = _fault(capped_workbench, Faulty("predict", lambda out: out[:, :1]), tmp_path)
    assert "failed in predict() before session 2: it returned logits of shape (" in _text(err)
    assert ", 1), where logits of shape (" in _text(err) and f", {classes}) are due" in _text(err)


def test_non_finite_logits_stop_the_run_as_diverged(capped_workbench, tmp_path):
    with pytest.raises(Diverged, match=r"diverged at its eval point at update 0 of session 2: predict\(\) gave "
                                       r"non-finite logits") as caught:
        _run(capped_workbench, Faulty("predict", lambda out: torch.full_like(out, math.nan)), tmp_path)
    assert caught.value.curves == []  # no point scored from an argmax over NaN


@pytest.mark.parametrize("value, finite", [(math.nan, False), (math.inf, False), (-math.inf, False),
                                           (3e38, True), (-3e38, True), (0.0, True)])
def test_a_trained_weight_that_is_not_finite_is_found_and_a_frozen_one_is_not_read(value, finite):
    from bench_stability_gap.harness.run.continual import _finite

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model.register_parameter("empty", torch.nn.Parameter(torch.zeros(0)))  # no values: nothing to read
    with torch.no_grad():
        model[1].weight[1, 2] = value
        model[0].bias[0] = math.nan
    model[0].requires_grad_(False)  # frozen: not trained, so never the run's divergence
    assert _finite(model) is finite
    model[1].requires_grad_(False)
    assert _finite(model) is True  # only the empty one is left trainable


def test_a_builtin_method_s_fault_asks_for_a_report(capped_workbench, tmp_path, monkeypatch):
    monkeypatch.setattr(StandardMethod, "loss_terms", raises(ArithmeticError("a bug")), raising=True)
    err = _fault(capped_workbench, Vanilla(VanillaConfig()), tmp_path)
    assert "Method 'vanilla' (bench-stability-gap " in _text(err)
    assert "This is a bug in a method built into bench: please report it" in _text(err)


def test_bench_debug_prints_the_full_traceback(capped_workbench, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_DEBUG", "1")
    _fault(capped_workbench, Faulty("observe", raises(ValueError("bad batch"))), tmp_path)
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: bad batch" in err and f"{THIS}" in err


def test_a_harness_bug_during_an_update_stays_a_traceback(capped_workbench, tmp_path, monkeypatch):
    def broken(self):
        raise RuntimeError("a bug of the FLOP meter")

    monkeypatch.setattr(FL.FlopMeter, "end_update", broken)
    with pytest.raises(RuntimeError, match="a bug of the FLOP meter"):
        _run(capped_workbench, Faulty(), tmp_path)


PLUGIN = '''
import os

from bench_stability_gap.methods.baselines import Vanilla


class Faulty(Vanilla):
    name = "faulty"
    count = 0

    def observe(self, batch):
        self.count += 1
        fault = os.environ.get("FAULTY")
        if fault == "exit":
            raise SystemExit(0)
        if fault == "raise" and self.count == 3:
            raise ValueError("observe cannot use this batch")
        return super().observe(batch)
'''


def _error_line(out: Any) -> str:
    """The one paragraph of a refusal (progress notes go before it)."""
    (line,) = [ln for ln in out.output.splitlines() if ln.startswith("Error:")]
    return line


def test_a_plugin_s_fault_exits_2_naming_its_distribution_and_keeps_what_was_computed(site, tmp_path, bench_cache):
    (site / "bench_fault_plugin.py").write_text(PLUGIN)
    write_dist(site, "bench-fault-plugin", "0.2.0", {"bench.methods": {"faulty": "bench_fault_plugin:Faulty"}})
    results = tmp_path / "results"
    common = ("run", "-m", "faulty", "--protocol", str(small_protocol(tmp_path)), "--results-dir", str(results),
              "--no-mlflow", "--no-progress", "--checkpoint-every", "1")
    head = "Method 'faulty' (bench-fault-plugin 0.2.0) failed in observe() in update"
    out = invoke(*common, env={"FAULTY": "exit"})
    refused(out, "SystemExit: 0")
    assert _error_line(out).startswith(f"Error: {head} 1 of session 2: SystemExit: 0"), out.output
    stored = sorted(p.name for p in results.rglob("*.json"))
    assert len(stored) == 2  # the joint reference and the A_best reference run it trained first are kept
    out = invoke(*common, env={"FAULTY": "raise"})
    refused(out)
    line = _error_line(out)
    for needle in (f"{head} 3 of session 2: ValueError: observe cannot use this batch", "bench_fault_plugin.py:",
                   "is kept: running the same command again resumes from it"):
        assert needle in line, (needle, out.output)
    assert sorted(p.name for p in results.rglob("*.json")) == stored and list(results.rglob("run-*.mid.pt"))
    out = invoke(*common, env={"FAULTY": ""})
    assert out.exit_code == 0 and "from its checkpoint at update 2 of session 2" in out.output, out.output
    (run,) = [json.loads(p.read_text()) for p in results.rglob("*.json") if "faulty" in p.read_text()]
    assert run["status"] == "complete" and run["method"]["distribution"] == "bench-fault-plugin"
