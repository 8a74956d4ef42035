"""A FLOP-budgeted protocol (training.budget.tflops): each session trains while its next update fits the
session's training TFLOPs, so a method with cheaper updates makes more of them. Counts are pinned against
a hand computation from the meter's per-sample costs; bad budgets exit 2 naming the field."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.model import flops as FL
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.spec.protocol import ComputeBudget, ComputeSchedule
from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.methods.sgm.lora import inject_adapters

from support import reduced_tiny

HEAD_IN = 1280  # the embedded backbone's embedding width: the head costs 1280 MACs per class per sample


@pytest.fixture(scope="module")
def workbench(tmp_path_factory, small_workbench):
    """The session's reduced tiny workbench; runs swap in a FLOP-budgeted copy of its spec."""
    options = RunOptions(results_dir=tmp_path_factory.mktemp("flop-budget") / "results", progress=False, log=False)
    return small_workbench, options


def _with_budget(bench, tflops: float):
    p = bench.protocol
    training = p.training.model_copy(update={"updates": None, "budget": ComputeBudget(tflops=tflops)})
    return dataclasses.replace(bench, protocol=p.model_copy(update={"training": training}))


def _update_macs(bench, method_text: str) -> list[float]:
    """MACs of one update in each session, by hand from the per-sample costs fvcore gives each part
    (``flops.part_cost``): batch x (trunk forward + body forward and backward under the method's
    trainability + head forward and 2x backward at the session's class count)."""
    net, p = bench.deployed, bench.protocol
    trunk = FL.part_cost(net.trunk, bench.input_shape)
    body = copy.deepcopy(net.body)
    if "lora" in method_text:
        _, method = build_method(method_text, p)
        lora = method.modifiers[0]
        inject_adapters(body, list(p.backbone.lora_targets), lora.config.rank, lora.scaling_alpha, lora.config.init,
                        torch.Generator().manual_seed(0))
        for name, param in body.named_parameters():
            param.requires_grad_("lora_" in name)
    else:
        for param in body.parameters():
            param.requires_grad_(True)
    cost = FL.part_cost(body, trunk.out_shape)
    assert cost.out_shape == (HEAD_IN,)
    batch = p.training.batch.size
    return [batch * (trunk.forward + cost.forward + cost.backward + 3 * HEAD_IN * s.seen_classes)
            for s in bench.stream.sessions]


def _run(bench, options, method_text: str):
    _, method = build_method(method_text, bench.protocol)
    return run_cl(bench, method, 0, options)


def test_cheaper_updates_buy_more_of_them_within_the_same_flop_budget(workbench):
    bench, options = workbench
    costs = {m: _update_macs(bench, m) for m in ("vanilla", "vanilla+lora")}
    # LoRA's backward skips the frozen weights' gradients but adds its adapters': on this 32x32 protocol the
    # trunk's forward dominates an update and LoRA (rank 48) saves about 0.1 % of it, so the budget sits
    # between three of LoRA's first-session updates and three of vanilla's
    assert all(c < v for c, v in zip(costs["vanilla+lora"], costs["vanilla"]))
    tflops = FL.flops(1.5 * (costs["vanilla+lora"][0] + costs["vanilla"][0])) / 1e12
    flop_bench = _with_budget(bench, tflops)
    made = {}
    for text, cost in costs.items():
        curves, budget, _ = _run(flop_bench, options, text)
        expected = [math.floor(tflops * 1e12 / 2 / c) for c in cost]
        assert budget.updates_per_session == expected, text
        made[text] = expected
        assert budget.train_tflops_budget == tflops
        assert budget.train_flops_per_session == pytest.approx([FL.flops(n * c) for n, c in zip(expected, cost)],
                                                               rel=1e-9)
        assert all(f <= tflops * 1e12 for f in budget.train_flops_per_session)
        assert budget.optimizer_steps == sum(expected) and budget.max_trained_per_update == 16  # guards still on
        for curve, n in zip(curves, expected):  # the schedule's points clipped to the updates made, and the end
            assert curve.total_updates == n and curve.updates == flop_bench.protocol.eval.points(n)
            assert len(curve.loss) == n
    assert made == {"vanilla": [2, 2, 2, 2], "vanilla+lora": [3, 2, 2, 2]}


def test_a_budget_below_one_update_is_refused_before_training(workbench):
    bench, options = workbench
    tflops = FL.flops(0.5 * _update_macs(bench, "vanilla")[0]) / 1e12
    with pytest.raises(BenchError, match=r"training\.budget\.tflops \(.*\) is smaller than one update of vanilla "
                                         r"in session 2"):
        _run(_with_budget(bench, tflops), options, "vanilla")


def test_a_protocol_with_both_budgets_exits_2_naming_the_field(tmp_path):
    spec = reduced_tiny()
    spec["training"]["budget"] = {"tflops": 0.01}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = CliRunner().invoke(main, ["validate", str(path)])
    assert out.exit_code == 2 and "training" in out.output and "not both" in out.output, out.output
    del spec["training"]["updates"]
    spec["training"]["budget"] = {"tflops": 0}
    path.write_text(yaml.safe_dump(spec))
    out = CliRunner().invoke(main, ["validate", str(path)])
    assert out.exit_code == 2 and "training.budget.tflops" in out.output, out.output


def test_a_budget_no_method_can_spend_exits_2_before_any_compute(tmp_path, monkeypatch):
    """Output-only training on one batch is the cheapest update there is; a budget below it is refused by
    the preflight, naming the field, before data opens or anything trains (no cache, no result)."""
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "starved.yaml"
    path.write_text("extends: tiny_cil_flops\nname: starved\ntraining: {budget: {tflops: 1.0e-5}}\n")
    out = CliRunner().invoke(main, ["run", "-p", str(path), "-m", "vanilla", "--no-mlflow",
                                    "--results-dir", str(tmp_path / "results")])
    assert out.exit_code == 2, out.output
    assert "training.budget.tflops (1e-05)" in out.output and "cheapest method" in out.output, out.output
    assert not list((tmp_path / "cache").rglob("*.*")) and not list(tmp_path.glob("results/runs/**/*.json"))  # probed only


class _PlanLog:
    """What the loop asks of an input store (planning decodes ahead), recorded."""

    def __init__(self) -> None:
        self.planned: list = []

    def plan(self, ids: list) -> None:
        self.planned.append(ids)

    def end_plan(self) -> None:
        pass


def test_a_stretch_with_a_stop_draws_each_batch_when_due_and_ends_where_the_stop_says(tmp_path):
    from bench_stability_gap.harness.run.loop import Stretch, train_stretch

    drawn, stepped, seen = [], [], []
    store = _PlanLog()
    options = RunOptions(results_dir=tmp_path, progress=False, log=False)
    stretch = Stretch("session 2", "continual", 1000, draw=lambda: drawn.append(len(drawn)) or len(drawn) - 1,
                      step=lambda u, b: stepped.append((u, b, len(drawn))), before=seen.append,
                      stop=lambda u: u == 4, draw_ahead=False)
    train_stretch(stretch, None, store, options)
    assert stepped == [(0, 0, 1), (1, 1, 2), (2, 2, 3), (3, 3, 4)]  # batch u drawn just before update u
    assert seen == [0, 1, 2, 3, 4] and drawn == [0, 1, 2, 3] and store.planned == []
    with pytest.raises(ValueError, match="cannot draw its batches ahead"):
        train_stretch(dataclasses.replace(stretch, draw_ahead=True), None, store, options)


def _new_only():
    """Vanilla trained on the session's new samples only (half the batch): its updates cost half the
    standard step that the first update of a session is priced at."""
    from bench_stability_gap.methods.baselines import Vanilla
    from bench_stability_gap.methods.configs import VanillaConfig

    class NewOnly(Vanilla):
        name = "new_only"

        def observe(self, batch):
            keep = batch.is_new
            return super().observe(dataclasses.replace(batch, x=batch.x[keep], y=batch.y[keep],
                                                       ids=batch.ids[keep.cpu().numpy()], is_new=batch.is_new[keep]))

    return NewOnly(VanillaConfig())


class _Killed(Exception):
    pass


def _sparse_eval(bench):
    """Evaluated at each session's start and end only (the schedule's every past any session's count)."""
    p = bench.protocol
    return dataclasses.replace(bench, protocol=p.model_copy(update={"eval": p.eval.model_copy(
        update={"every": 1000, "dense_every": None, "dense_until": 0})}))


def test_the_next_update_is_priced_as_the_last_one_the_meter_measured(workbench):
    """A method whose update costs more than the standard step (a teacher forward before it): after its
    first update, each next one is priced at what the meter measured for the last, so it makes
    floor(budget / its real cost) updates, fewer than the standard step's price would allow."""
    from bench_stability_gap.methods.configs import VanillaConfig

    from tests.test_budget import TeacherLike

    bench, options = workbench
    net, batch = bench.deployed, bench.protocol.training.batch.size
    trunk = FL.part_cost(net.trunk, bench.input_shape)
    body = FL.part_cost(net.body, trunk.out_shape).forward
    standard = _update_macs(bench, "vanilla")
    real = [c + batch * (trunk.forward + body + HEAD_IN * s.seen_classes)  # plus the teacher's forward
            for c, s in zip(standard, bench.stream.sessions)]
    tflops = FL.flops(4.7 * real[0]) / 1e12
    expected = [math.floor(tflops * 1e12 / 2 / c) for c in real]
    assert expected[0] == 4 and math.floor(4.7 * real[0] / standard[0]) > 4
    _, budget, _ = run_cl(_sparse_eval(_with_budget(bench, tflops)), TeacherLike(VanillaConfig()), 0, options)
    assert budget.updates_per_session == expected
    assert all(f <= tflops * 1e12 for f in budget.train_flops_per_session)


def test_a_resumed_flop_budgeted_session_keeps_the_last_price_and_the_numbers(workbench, tmp_path, monkeypatch):
    """Killed right after its checkpoint at update 4 of session 2 and resumed, a method whose updates cost
    half the standard step makes the updates and numbers of an uninterrupted run: the last measured price
    is checkpointed (re-priced as the standard step, the resumed session would stop one update early)."""
    from bench_stability_gap.harness.run import loop
    from bench_stability_gap.harness.run.checkpoint import Checkpointer

    bench, options = workbench
    half = [c / 2 for c in _update_macs(bench, "vanilla")]
    tflops = FL.flops(5.5 * half[0]) / 1e12
    flop_bench = _sparse_eval(_with_budget(bench, tflops))
    expected = [math.floor(tflops * 1e12 / 2 / c) for c in half]
    assert expected[0] == 5 and 4 * half[0] + 2 * half[0] > tflops * 1e12 / 2

    plain = run_cl(flop_bench, _new_only(), 0, options, Checkpointer(tmp_path / "plain.pt", every=2))
    assert plain[1].updates_per_session == expected and plain[1].max_trained_per_update == 8

    calls = [0]

    def die_at_the_fifth_update(phase: str) -> None:  # maybe_die runs after the checkpoint due at update 4
        calls[0] += 1
        if calls[0] == 5:
            raise _Killed

    monkeypatch.setattr(loop, "maybe_die", die_at_the_fifth_update)
    saver = Checkpointer(tmp_path / "killed.pt", every=2)
    with pytest.raises(_Killed):
        run_cl(flop_bench, _new_only(), 0, options, saver)
    assert saver.load(mid=True)["loop"]["update"] == 4
    resumed = run_cl(flop_bench, _new_only(), 0, options, Checkpointer(tmp_path / "killed.pt", every=2))
    assert resumed[1].updates_per_session == expected
    assert resumed[1].train_flops_per_session == plain[1].train_flops_per_session
    assert [c.model_dump() for c in resumed[0]] == [c.model_dump() for c in plain[0]]


def _by_compute(bench, every_tflops: float):
    p = bench.protocol
    schedule = p.eval.model_copy(update={"every": None, "dense_every": None, "dense_until": 0,
                                         "tflops": ComputeSchedule(every=every_tflops)})
    return dataclasses.replace(bench, protocol=p.model_copy(update={"eval": schedule}))


def test_eval_points_fall_at_the_same_compute_for_methods_with_different_update_costs(workbench):
    """Under eval.tflops every method is evaluated right after the update that crosses each multiple of
    ``every``: the k-th point lies within one of the method's own updates past k x every, so vanilla and
    vanilla+lora, whose updates cost differently, are compared at the same compute (not the same update)."""
    bench, options = workbench
    costs = {m: _update_macs(bench, m) for m in ("vanilla", "vanilla+lora")}
    vanilla = costs["vanilla"][0]
    every = FL.flops(2.5 * vanilla) / 1e12  # between two and three updates: the two methods cross it apart
    flop_bench = _by_compute(_with_budget(bench, FL.flops(10.5 * vanilla) / 1e12), every)
    marks = {}
    for text, cost in costs.items():
        curves, budget, _ = _run(flop_bench, options, text)
        marks[text] = []
        for curve, c in zip(curves, cost):
            spent = [(f - curve.train_flops[0]) / 1e12 for f in curve.train_flops]  # session TFLOPs at each point
            inner = spent[1:-1]  # the schedule's points: after update 0, before the session's end
            ks = [math.floor(t / every) for t in inner]
            assert ks == list(range(1, len(ks) + 1)), (text, curve.session, spent)
            for k, t in zip(ks, inner):  # at or past k x every, by less than one update
                assert k * every <= t + 1e-12 and t - FL.flops(c) / 1e12 < k * every, (text, k, t)
            marks[text].append(ks)
    # 10 updates each: marks at 2.5, 5 and 7.5 of vanilla's updates; the 4th (10) is the session's end point
    assert marks["vanilla"] == marks["vanilla+lora"] == [[1, 2, 3]] * 4


def test_onecycle_under_a_flop_budget_runs_on_the_predicted_update_count(workbench, monkeypatch):
    """SGM's OneCycle needs a session length: under a FLOP budget the harness predicts it in begin_session
    (after the init pass, with LoRA's trainability) and the run makes exactly that many updates."""
    from bench_stability_gap.harness.run import continual

    bench, options = workbench
    predicted = []
    original = continual.FlopStop.affordable
    monkeypatch.setattr(continual.FlopStop, "affordable", lambda self: predicted.append(original(self)) or predicted[-1])
    # init's forward pass over the session's samples costs about 7 of these updates on this protocol
    tflops = FL.flops(12.5 * _update_macs(bench, "vanilla")[0]) / 1e12
    curves, budget, _ = _run(_with_budget(bench, tflops), options, "vanilla+sgm")
    assert len(predicted) == len(curves) and budget.updates_per_session == predicted
    assert all(2 <= n < 12 for n in predicted), predicted
    assert all(f <= tflops * 1e12 for f in budget.train_flops_per_session)
