"""Budgets are enforced, not trusted, and every figure is recorded: fake methods that break the
budget on the reduced embedded protocol fail with a BenchError; vanilla's FLOPs match the hand count."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from bench_stability_gap.harness.model import flops as FL
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.data.inputs import InputStore, Preprocess
from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.results.efficiency import efficiency_vs_joint
from bench_stability_gap.methods.base import StepStats
from bench_stability_gap.methods.configs import VanillaConfig
from bench_stability_gap.methods.baselines import Vanilla


@pytest.fixture(scope="module")
def workbench(tmp_path_factory, small_workbench):
    """The session's reduced tiny workbench on 3 updates per session, eval at 0, 2, 3."""
    bench, protocol = small_workbench, small_workbench.protocol
    options = RunOptions(results_dir=tmp_path_factory.mktemp("budget") / "results", progress=False, log=False)
    short = protocol.model_copy(update={"training": protocol.training.model_copy(update={"updates": 3}),
                                        "eval": protocol.eval.model_copy(update={"every": 3, "dense_every": 2,
                                                                                 "dense_until": 2})})
    return dataclasses.replace(bench, protocol=short), options


@pytest.fixture(scope="module")
def vanilla(workbench):
    """One vanilla run on the cached trunk: curves, budget and how many distinct training images it fetched."""
    curves, budget, _ = run_cl(workbench[0], Vanilla(VanillaConfig()), 0, workbench[1])
    return curves, budget, workbench[0].train_inputs.distinct_seen()


def _run(workbench, method):
    bench, options = workbench
    return run_cl(bench, method, 0, options)


class TwoSteps(Vanilla):
    name = "two_steps"

    def observe(self, batch):
        stats = super().observe(batch)
        self.optimizer.step()  # a second update inside one observe
        return stats


class StepsAtSessionStart(Vanilla):
    name = "early_bird"

    def begin_session(self, session):
        super().begin_session(session)
        self.optimizer.step()


class MoreSamples(Vanilla):
    """Trains on the batch plus as many samples again, pulled from the inputs by itself."""

    name = "greedy"

    def observe(self, batch):
        extra = self.ctx.inputs.get(batch.ids[::-1].copy())
        x, y = torch.cat([batch.x, extra]), torch.cat([batch.y, batch.y.flip(0)])
        self.model.train()
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return StepStats(float(loss.detach()))


class TeacherLike(Vanilla):
    """A no-grad forward of each batch through a frozen copy of the model taken at session start
    (LwF's teacher logits) before the standard step: allowed, and its FLOPs are counted."""

    name = "teacher_like"

    def begin_session(self, session):
        super().begin_session(session)
        self.teacher = copy.deepcopy(self.model).eval()  # the hooks come along with the copy

    def observe(self, batch):
        with torch.no_grad():
            self.teacher(batch.x)
        counters = self.ctx.counters
        counters[FL.TEACHER_FORWARD_SAMPLES] = counters.get(FL.TEACHER_FORWARD_SAMPLES, 0) + len(batch.x)
        return super().observe(batch)


class Hoarder(Vanilla):
    name = "hoarder"

    def observe(self, batch):
        # the lent view is read-only (its ids are a tuple); a method digging out the harness's own memory
        # to store past the cap behind its back is still caught by the cap check
        assert isinstance(self.ctx.memory.ids, tuple) and not hasattr(self.ctx.memory, "add")
        self.ctx.memory._memory.ids.extend(int(i) for i in batch.ids)
        return super().observe(batch)


def test_a_second_optimizer_step_in_one_observe_fails(workbench):
    with pytest.raises(BenchError, match=r"'two_steps' made 2 optimizer steps in one observe\(\) call"):
        _run(workbench, TwoSteps(VanillaConfig()))


def test_an_optimizer_step_outside_observe_fails(workbench):
    with pytest.raises(BenchError, match=r"'early_bird' made 1 optimizer step\(s\) outside observe\(\)"):
        _run(workbench, StepsAtSessionStart(VanillaConfig()))


def test_training_on_more_samples_than_the_batch_fails(workbench):
    with pytest.raises(BenchError, match=r"'greedy' trained on 32 samples in one update .* allows 16 per update"):
        _run(workbench, MoreSamples(VanillaConfig()))


def test_overfilling_the_memory_fails_naming_method_and_cap(workbench):
    bench, options = workbench
    capped = bench.protocol.model_copy(update={"memory": MemorySpec(policy="reservoir", capacity=50)})
    with pytest.raises(BenchError, match=r"'hoarder' overfilled the rehearsal memory: \d+ samples stored, .*cap is 50"):
        run_cl(dataclasses.replace(bench, protocol=capped), Hoarder(VanillaConfig()), 0, options)


def _expected_vanilla_macs(bench, budget):
    """samples x per-sample MACs x (1 forward + 2 backward) on body and head, 1 forward on the trunk;
    evaluation: samples x forward MACs. fvcore per part; the head has 1280 x (classes seen) MACs."""
    p, stream = bench.protocol, bench.stream
    trunk, body = budget.macs_per_sample["trunk"], budget.macs_per_sample["body"]
    net = bench.deployed
    body_in = FL.part_cost(net.trunk, (3, 32, 32)).out_shape
    per_module = FL.module_macs(net.body, torch.zeros(1, *body_in))
    weightless = sum(v for k, v in per_module.items() if not list(net.body.get_submodule(k).parameters(recurse=False)))
    assert weightless == 1280  # only global pooling (1280 channels, 1x1): gradient passes through it once
    body_train = 3 * body - weightless
    batch = p.training.batch.new + p.training.batch.old
    train, evals = [], []
    for s in stream.sessions:
        head = 1280 * s.seen_classes
        train.append(p.training.updates * batch * (trunk + body_train + 3 * head))
        n_test = len(stream.test_ids(np.arange(s.seen_classes)))
        evals.append(len(p.eval.points(p.training.updates)) * n_test * (trunk + body + head))
    return train, evals


def test_vanilla_flops_equal_the_hand_count_and_every_budget_figure_is_recorded(workbench, vanilla):
    bench, _ = workbench
    curves, budget, distinct = vanilla
    train, evals = _expected_vanilla_macs(bench, budget)
    assert budget.train_flops_per_session == pytest.approx([2 * t for t in train], rel=1e-12)
    assert budget.eval_flops_per_session == pytest.approx([2 * e for e in evals], rel=1e-12)
    assert budget.train_flops == pytest.approx(2 * sum(train), rel=1e-12)
    assert budget.eval_flops == pytest.approx(2 * sum(evals), rel=1e-12)
    # curves: cumulative training FLOPs at each eval point (update 0 of session 2 is 0)
    assert curves[0].train_flops[0] == 0 and curves[-1].train_flops[-1] == pytest.approx(budget.train_flops)
    per_update = 2 * train[0] / 3
    assert curves[0].updates == [0, 2, 3]
    assert np.diff(curves[0].train_flops) == pytest.approx([2 * per_update, per_update])
    # the trunk really ran once per distinct image (cached), not once per sample
    assert budget.trunk_cached and budget.train_flops_executed < budget.train_flops
    assert budget.train_flops_executed == pytest.approx(
        budget.train_flops - 2 * (4 * 3 * 16 - distinct) * budget.macs_per_sample["trunk"])
    # every budget figure used
    assert budget.batch_limit == 16 and budget.max_trained_per_update == 16
    assert budget.optimizer_steps == 12 and budget.samples_trained == 12 * 16
    assert budget.forward_samples["train/body/backward"] == 12 * 16
    assert budget.forward_samples["train/trunk/backward"] == 0
    assert budget.declared == {} and budget.flops_convention == FL.CONVENTION
    # efficiency against joint: joint's totals over the run's
    joint = budget.model_copy(update={"optimizer_steps": 120, "train_flops": 10 * budget.train_flops})
    ratios = efficiency_vs_joint(budget, joint)
    assert ratios.updates_vs_joint == 10.0 and ratios.train_flops_vs_joint == pytest.approx(10.0)


def test_extra_forwards_without_gradient_are_allowed_and_counted(workbench):
    _, budget, _ = _run(workbench, TeacherLike(VanillaConfig()))
    assert budget.max_trained_per_update == 16
    f = budget.forward_samples
    assert f["train/body/forward"] == 2 * 12 * 16 and f["train/body/backward"] == 12 * 16
    assert budget.declared == {FL.TEACHER_FORWARD_SAMPLES: 12 * 16}


def test_cached_and_uncached_trunk_give_the_same_flops_and_curves(workbench, vanilla):
    """The headline FLOPs are the uncached equivalent: the cache setting changes only what ran."""
    bench, options = workbench
    cached_curves, cached, _ = vanilla
    deployed = copy.deepcopy(bench.deployed)
    deployed.trunk_cached = False
    pre = Preprocess(bench.protocol.backbone)
    uncached_bench = dataclasses.replace(
        bench, deployed=deployed,
        train_inputs=InputStore(bench.stream.train, pre, None, bench.device),
        test_inputs=InputStore(bench.stream.test, pre, None, bench.device))
    assert uncached_bench.test_inputs.kind == "images"  # decoded and preprocessed once per run
    curves, uncached, _ = run_cl(uncached_bench, Vanilla(VanillaConfig()), 0, options)
    # The trunk's outputs are the same computation in another batch shape (the cache is filled in chunks),
    # which oneDNN may reduce in another order: last-bit differences that can flip a near-tie. Measured on
    # one intra-op thread: one image of the smallest eval set. Accuracies agree to that, FLOPs exactly.
    one_image = 1 / len(bench.stream.test_ids(np.arange(bench.stream.pretrain_classes)))
    for c, u in zip(cached_curves, curves):
        assert c.old == pytest.approx(u.old, abs=one_image + 1e-9) and c.all == pytest.approx(u.all, abs=one_image + 1e-9)
        assert c.train_flops == pytest.approx(u.train_flops, rel=1e-12)
    assert uncached.train_flops == pytest.approx(cached.train_flops, rel=1e-12)
    assert uncached.eval_flops == pytest.approx(cached.eval_flops, rel=1e-12)
    assert uncached.forward_samples == cached.forward_samples
    assert not uncached.trunk_cached and uncached.train_flops_executed == uncached.train_flops
    assert cached.eval_flops_executed < cached.eval_flops  # the eval set went through the trunk once


def test_joint_flops_equal_per_sample_costs_times_samples_by_the_continual_runs_code(workbench, monkeypatch):
    """The joint reference's budget, counted by hand from the meter's per-sample costs: each joint model
    trains ``joint.updates x joint.batch_size`` samples through trunk (forward) and body + head (forward
    and backward) with the head of its session; each session evaluates its test set once. And it is closed
    by the same function as a continual run's budget."""
    from bench_stability_gap.harness.run import continual, joint, loop

    bench, options = workbench
    p = bench.protocol
    short = dataclasses.replace(bench, protocol=p.model_copy(update={"joint": p.joint.model_copy(
        update={"updates": 2, "batch_size": 8})}))
    closed_by = []

    def spy(*args, **kwargs):
        closed_by.append(kwargs["updates_per_session"])
        return loop.closing_budget(*args, **kwargs)

    monkeypatch.setattr(joint, "closing_budget", spy)
    monkeypatch.setattr(continual, "closing_budget", spy)
    refs, budget, _ = joint.train_joint(short, 0, options)
    distinct = short.train_inputs.distinct_seen()  # before the continual run resets what was fetched
    _, vanilla_budget = run_cl(short, Vanilla(VanillaConfig()), 0, options)[:2]
    assert closed_by == [[2] * len(bench.stream.sessions), [3] * len(bench.stream.sessions)]

    trunk, body = budget.macs_per_sample["trunk"], budget.macs_per_sample["body"]
    assert (trunk, body) == (vanilla_budget.macs_per_sample["trunk"], vanilla_budget.macs_per_sample["body"])
    net = bench.deployed
    body_in = FL.part_cost(net.trunk, (3, 32, 32)).out_shape
    per_module = FL.module_macs(net.body, torch.zeros(1, *body_in))
    weightless = sum(v for k, v in per_module.items() if not list(net.body.get_submodule(k).parameters(recurse=False)))
    train, evals = [], []
    for s in bench.stream.sessions:
        head = 1280 * s.seen_classes
        train.append(2 * 8 * (trunk + 3 * body - weightless + 3 * head))
        evals.append(len(bench.stream.test_ids(np.arange(s.seen_classes))) * (trunk + body + head))
    assert budget.train_flops_per_session == pytest.approx([2 * t for t in train], rel=1e-12)
    assert budget.eval_flops_per_session == pytest.approx([2 * e for e in evals], rel=1e-12)
    assert budget.train_flops == pytest.approx(2 * sum(train), rel=1e-12)
    assert budget.eval_flops == pytest.approx(2 * sum(evals), rel=1e-12)
    assert budget.samples_trained == 2 * 8 * len(bench.stream.sessions)
    assert budget.forward_samples["train/body/backward"] == budget.samples_trained
    # executed: the cached trunk ran once per distinct image fetched, by flops.executed_macs
    trained = budget.forward_samples["train/trunk/forward"]
    assert trained == budget.samples_trained and budget.trunk_cached
    assert budget.train_flops_executed == pytest.approx(
        budget.train_flops - 2 * (trained - distinct) * trunk, rel=1e-12)
    assert len(refs) == len(bench.stream.sessions)
