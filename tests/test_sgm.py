"""SGM's modifiers, each pinned against a hand-computed case (the arithmetic is in the comments).

Everything runs on a tiny SplitModel (a 1x1-conv block in the body, a 4-d embedding) and a stub
context, never on the real backbone.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from support import fake_training
from bench_stability_gap.harness.model.backbone import GrowingHead, SplitModel
from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import Entry, build_method, protocol_defaults
from bench_stability_gap.harness.data.stream import Session
from bench_stability_gap.methods.base import Method, MethodConfig, StandardMethod, TrainBatch, layerwise_groups
from bench_stability_gap.methods.baselines import OutputOnly, Vanilla
from bench_stability_gap.methods.sgm.combined import SGM, OneCycleConfig, SGMConfig, one_cycle
from bench_stability_gap.methods.sgm.init import DataDrivenInit, InitConfig, class_mean_rows
from bench_stability_gap.methods.sgm.lora import LoRA, LoRAConfig, lora_modules
from bench_stability_gap.methods.sgm.oocf import OldClassFreezing
from bench_stability_gap.methods.sgm.soft import SoftTargets, SoftTargetsConfig

# ---------------------------------------------------------------------------------------------------
# a tiny model and context


class Block(nn.Module):
    """An inverted-residual-like block: the two 1x1 convs are the LoRA targets (as in EfficientNet)."""

    def __init__(self, c_in: int = 4, c_mid: int = 6) -> None:
        super().__init__()
        self.conv_pw = nn.Conv2d(c_in, c_mid, 1)
        self.bn = nn.BatchNorm2d(c_mid)
        self.conv_pwl = nn.Conv2d(c_mid, c_in, 1, bias=False)

    def forward(self, x):
        return x + self.conv_pwl(F.relu(self.bn(self.conv_pw(x))))


def tiny_model(n_classes: int = 3, seed: int = 0) -> SplitModel:
    torch.manual_seed(seed)
    trunk = nn.Sequential(nn.Conv2d(2, 4, 1))
    body = nn.Sequential(Block(), nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()))
    return SplitModel(trunk, body, GrowingHead(4, n_classes))


class Inputs:
    """InputStore stand-in: train inputs by global id."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def get(self, ids):
        return self.x[torch.as_tensor(np.asarray(ids))]


def tiny_ctx(x: torch.Tensor, labels: np.ndarray, updates: int = 4, targets=("conv_pw", "conv_pwl")):
    protocol = SimpleNamespace(name="tiny", backbone=SimpleNamespace(lora_targets=list(targets)),
                               training=fake_training(updates))
    stream = SimpleNamespace(train=SimpleNamespace(labels=labels))
    return SimpleNamespace(protocol=protocol, stream=stream, device=torch.device("cpu"), inputs=Inputs(x),
                           generator=torch.Generator().manual_seed(0), counters={},
                           compute=ComputeEnv.for_run(torch.device("cpu")))


def session(new_classes, train_ids, seen) -> Session:
    return Session(index=2, train_ids=np.asarray(train_ids), classes=np.asarray(new_classes),
                   new_classes=np.asarray(new_classes), seen_classes=seen)


def tiny_run(modifiers, steps: int = 3, method_cls=Vanilla, seed: int = 0, **cfg):
    """3 old classes, a session adding classes 3 and 4; returns the method after ``steps`` updates."""
    torch.manual_seed(123)
    x = torch.randn(20, 2, 3, 3)
    labels = np.array([0, 1, 2] * 4 + [3, 4] * 4)
    model = tiny_model(3, seed)
    method = method_cls(method_cls.Config(**cfg), modifiers)
    method.setup(model, tiny_ctx(x, labels))
    s = session([3, 4], np.arange(12, 20), 5)
    model.head.grow(2, torch.Generator().manual_seed(1))
    method.begin_session(s)
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        ids = torch.randperm(20, generator=g)[:8].numpy()
        y = torch.as_tensor(labels[ids])
        method.observe(TrainBatch(x[ids], y, ids, y >= 3))
    return method, s


# ---------------------------------------------------------------------------------------------------
# soft targets


def test_soft_target_vectors_for_a_hand_computed_history():
    soft = SoftTargets()
    soft.grow(3)
    y0 = torch.tensor([0])
    # step 1, class 0, p = (.7, .2, .1), correct. u_0 is uniform (1/3 each): t = (1, 1/3, 1/3) / (5/3)
    #   = (.6, .2, .2). Then u_0 <- (0 * u_0 + p) / 1 = (.7, .2, .1), c_0 = 1.
    p = torch.tensor([[0.7, 0.2, 0.1]])
    torch.testing.assert_close(soft.build(p, y0), torch.tensor([[0.6, 0.2, 0.2]]))
    soft.update(p, y0)
    torch.testing.assert_close(soft.u[0], torch.tensor([0.7, 0.2, 0.1]))
    # step 2, p = (.5, .4, .1), correct: t = (1, .2, .1) / 1.3 = (.769231, .153846, .076923);
    #   u_0 <- (1 * (.7, .2, .1) + (.5, .4, .1)) / 2 = (.6, .3, .1), c_0 = 2.
    p = torch.tensor([[0.5, 0.4, 0.1]])
    torch.testing.assert_close(soft.build(p, y0), torch.tensor([[1 / 1.3, 0.2 / 1.3, 0.1 / 1.3]]))
    soft.update(p, y0)
    torch.testing.assert_close(soft.u[0], torch.tensor([0.6, 0.3, 0.1]))
    # step 3, p = (.2, .7, .1): predicted 1, wrong. t = u_0 = (.6, .3, .1), t[0] = 1, t[1] = 1/K = 1/3:
    #   (1, 1/3, .1) / (43/30) = (.697674, .232558, .069767). u_0 is not updated (wrong prediction).
    p = torch.tensor([[0.2, 0.7, 0.1]])
    torch.testing.assert_close(soft.build(p, y0), torch.tensor([[30 / 43, 10 / 43, 3 / 43]]))
    soft.update(p, y0)
    torch.testing.assert_close(soft.u[0], torch.tensor([0.6, 0.3, 0.1]))
    assert soft.counts.tolist() == [2, 0, 0]
    # class 2 never seen correct, predicted 0: u_2 uniform, t[0] = 1/3, t[2] = 1: (1/3, 1/3, 1) / (5/3) = (.2, .2, .6)
    torch.testing.assert_close(soft.build(torch.tensor([[0.5, 0.2, 0.3]]), torch.tensor([2])),
                               torch.tensor([[0.2, 0.2, 0.6]]))
    # the head grows to K = 4: updated u_0 is zero-padded (.6, .3, .1, 0); never-updated u_1 is uniform (1/4 each)
    soft.grow(4)
    torch.testing.assert_close(soft.u[0], torch.tensor([0.6, 0.3, 0.1, 0.0]))
    torch.testing.assert_close(soft.u[1], torch.full((4,), 0.25))
    # class 0, correct: t = (1, .3, .1, 0) / 1.4 = (.714286, .214286, .071429, 0)
    torch.testing.assert_close(soft.build(torch.tensor([[0.4, 0.3, 0.2, 0.1]]), y0),
                               torch.tensor([[1 / 1.4, 0.3 / 1.4, 0.1 / 1.4, 0.0]]))


def test_soft_targets_batch_update_equals_sequential_and_reset_growth():
    # two correct class-1 samples in one batch: u_1 = (p + q) / 2 = ((.1,.8,.1) + (.3,.6,.1)) / 2 = (.2, .7, .1)
    soft = SoftTargets()
    soft.grow(3)
    soft.update(torch.tensor([[0.1, 0.8, 0.1], [0.3, 0.6, 0.1]]), torch.tensor([1, 1]))
    torch.testing.assert_close(soft.u[1], torch.tensor([0.2, 0.7, 0.1]))
    assert soft.counts.tolist() == [0, 2, 0]
    reset = SoftTargets(SoftTargetsConfig(grow="reset"))
    reset.load_state_dict(soft.state_dict())
    reset.grow(4)  # reset: every u_k uniform over 4 classes again, counts 0
    torch.testing.assert_close(reset.u, torch.full((4, 4), 0.25))
    assert reset.counts.tolist() == [0, 0, 0, 0]


def test_soft_targets_hook_uses_softmax_and_state_survives_a_checkpoint():
    soft = SoftTargets()
    method = SimpleNamespace(session=SimpleNamespace(new_classes=[1, 2]))  # class 0 is old: its base is u_0
    p = torch.tensor([[0.7, 0.2, 0.1]])
    batch = SimpleNamespace(y=torch.tensor([0]))
    # logits = log p, so softmax(logits) = p: the first target is (.6, .2, .2) as above
    t = soft.targets(method, batch, p.log())
    torch.testing.assert_close(t, torch.tensor([[0.6, 0.2, 0.2]]))
    restored = SoftTargets()
    restored.load_state_dict(soft.state_dict())
    torch.testing.assert_close(restored.u[0], torch.tensor([0.7, 0.2, 0.1]))
    assert restored.counts.tolist() == [1, 0, 0]
    # and through a method's own state_dict (what a checkpoint stores)
    m1, _ = tiny_run([SoftTargets()], steps=2)
    m2 = Vanilla(Vanilla.Config(), [SoftTargets()])
    m2.load_state_dict(m1.state_dict())
    assert torch.equal(m2.modifiers[0].u, m1.modifiers[0].u)
    assert m1.modifiers[0].u.shape == (5, 5)  # grew with the head (3 old + 2 new)


# ---------------------------------------------------------------------------------------------------
# data-driven init


def test_init_row_is_the_mean_of_normalised_embeddings():
    # class 5: h = (3, 4) -> (.6, .8); h = (0, 2) -> (0, 1); mean = (.3, .9).  class 6: (1, 0), (2, 0) -> (1, 0)
    h = torch.tensor([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0], [2.0, 0.0]])
    y = torch.tensor([5, 5, 6, 6])
    torch.testing.assert_close(class_mean_rows(h, y, [5, 6]), torch.tensor([[0.3, 0.9], [1.0, 0.0]]))
    # centred on the mean m = (1.5, 1.5): (1.5, 2.5)/sqrt(8.5), (-1.5, .5)/sqrt(2.5) -> class 5 mean
    #   ((.514496 - .948683)/2, (.857493 + .316228)/2) = (-.217094, .586861)
    #   (-.5, -1.5)/sqrt(2.5), (.5, -1.5)/sqrt(2.5) -> class 6 mean (0, -.948683)
    rows = class_mean_rows(h, y, [5, 6], centre=h.mean(0))
    torch.testing.assert_close(rows, torch.tensor([[-0.217094, 0.586861], [0.0, -0.948683]]), atol=1e-6, rtol=0)


def test_init_modifier_writes_new_rows_keeps_bias_and_counts_forwards():
    # Identity trunk and body, so embed(x) = x: the 2-d "embeddings" are the inputs themselves.
    model = SplitModel(nn.Sequential(nn.Identity()), nn.Sequential(nn.Identity()), GrowingHead(2, 3))
    x = torch.tensor([[3.0, 4.0], [0.0, 2.0], [1.0, 0.0], [2.0, 0.0], [9.0, 9.0], [2.0, 0.0], [0.0, 3.0]])
    labels = np.array([3, 3, 4, 4, 1, 0, 1])  # id 4: an old class inside the session (not forwarded)
    method = Vanilla(Vanilla.Config(), [DataDrivenInit()])
    ctx = tiny_ctx(x, labels)
    ctx.memory = SimpleNamespace(ids=[5, 6, 0])  # two old-class samples, and one of new class 3 (ignored)
    method.setup(model, ctx)
    model.head.grow(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.head.fc.bias[3:] = torch.tensor([0.5, -0.5])
    old = model.head.fc.weight[:3].detach().clone()
    method.begin_session(session([3, 4], np.arange(5), 5))
    torch.testing.assert_close(model.head.fc.weight[3:], torch.tensor([[0.3, 0.9], [1.0, 0.0]]))
    assert torch.equal(model.head.fc.weight[:3], old)
    assert model.head.fc.bias[3:].tolist() == [0.5, -0.5]  # bias untouched
    assert method.ctx.counters["init_forward_samples"] == 4

    # scale=logit. Old rows (1, 0), (0, 1), (1, 1), bias (.5, 0, 0). Memory: (2, 0) of class 0 -> own logit
    #   2 + .5 = 2.5; (0, 3) of class 1 -> 3. Reference: (2.5 + 3) / 2 = 2.75.
    # Unscaled new rows (.3, .9) and (1, 0) on their own samples: (3,4) -> .9 + 3.6 = 4.5, (0,2) -> 1.8,
    #   (1,0) -> 1, (2,0) -> 2: mean 9.3 / 4 = 2.325; the new biases average (.5 + .5 - .5 - .5) / 4 = 0.
    # s = (2.75 - 0) / 2.325 = 1.182796: rows (.354839, 1.064516) and (1.182796, 0).
    with torch.no_grad():
        model.head.fc.weight[:3] = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
        model.head.fc.bias[:3] = torch.tensor([0.5, 0.0, 0.0])
    DataDrivenInit(InitConfig(scale="logit")).begin_session(method, session([3, 4], np.arange(5), 5))
    torch.testing.assert_close(model.head.fc.weight[3:], torch.tensor([[0.354839, 1.064516], [1.182796, 0.0]]))
    assert method.ctx.counters["init_forward_samples"] == 4 + 4 + 2  # + the two memory samples


# ---------------------------------------------------------------------------------------------------
# old output class freezing


@pytest.mark.parametrize("old_rows", ["frozen", "decay"])
def test_oocf_old_rows_get_zero_gradient_and_weight_decay_as_configured(old_rows):
    # Control: AdamW with lr .1 and weight decay .5 shrinks a zero-gradient row by (1 - .1 * .5) = .95.
    w = nn.Parameter(torch.ones(2, 2))
    opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.5)
    w.grad = torch.zeros_like(w)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.full((2, 2), 0.95))

    torch.manual_seed(0)
    x = torch.randn(8, 2, 3, 3)
    labels = np.array([0, 1, 2, 3, 4, 3, 4, 0])
    model = tiny_model(3)
    method = Vanilla(Vanilla.Config(lr=0.1, weight_decay=0.5),
                     [OldClassFreezing(OldClassFreezing.Config(old_rows=old_rows))])
    method.setup(model, tiny_ctx(x, labels))
    model.head.grow(2, torch.Generator().manual_seed(1))
    method.begin_session(session([3, 4], np.arange(3, 7), 5))
    w0, b0 = model.head.fc.weight.detach().clone(), model.head.fc.bias.detach().clone()
    y = torch.as_tensor(labels)
    method.observe(TrainBatch(x, y, np.arange(8), y >= 3))
    fc = model.head.fc
    assert torch.count_nonzero(fc.weight.grad[:3]) == 0 and torch.count_nonzero(fc.bias.grad[:3]) == 0
    if old_rows == "frozen":
        assert torch.equal(fc.weight[:3], w0[:3]) and torch.equal(fc.bias[:3], b0[:3])  # not even decayed
    else:  # the published code: only decay moves them. Tensor-wise lr: bias .1, weight .1 * .9 = .09,
        # so the bias shrinks by 1 - .1 * .5 = .95 and the weight by 1 - .09 * .5 = .955
        torch.testing.assert_close(fc.weight[:3], w0[:3] * 0.955)
        torch.testing.assert_close(fc.bias[:3], b0[:3] * 0.95)
    assert not torch.equal(fc.weight[3:], w0[3:])  # new rows learn
    assert any(not torch.equal(a, b) for a, b in zip(model.body.parameters(), tiny_model(3).body.parameters()))
    method.end_session(None)
    assert not method.modifiers[0]._handles  # hooks released with the session


# ---------------------------------------------------------------------------------------------------
# LoRA


def test_lora_trainable_count_merge_is_exact_and_body_is_plain_again():
    torch.manual_seed(0)
    model = tiny_model(3)
    keys = list(model.state_dict())
    x = torch.randn(6, 2, 3, 3)
    labels = np.array([0, 1, 2, 3, 4, 3])
    method = Vanilla(Vanilla.Config(lr=0.05), [LoRA(LoRAConfig(rank=2))])
    method.setup(model, tiny_ctx(x, labels))
    model.head.grow(2, torch.Generator().manual_seed(1))
    method.begin_session(session([3, 4], np.arange(3, 6), 5))
    # rank 2 on conv_pw Conv2d(4, 6, 1): 2 * (4 + 6) = 20; on conv_pwl Conv2d(6, 4, 1): 2 * (6 + 4) = 20;
    # head Linear(4, 5): 4 * 5 + 5 = 25. Nothing else trains: 20 + 20 + 25 = 65.
    assert model.trainable_parameters() == 65
    assert {n.split(".")[-3] for n, p in model.named_parameters() if p.requires_grad and "lora" in n} == {"lora_A", "lora_B"}
    bn = model.body[0].bn
    stats = bn.running_mean.clone()
    y = torch.as_tensor(labels)
    for _ in range(3):
        method.observe(TrainBatch(x, y, np.arange(6), y >= 3))
    assert torch.equal(bn.running_mean, stats)  # norm=frozen: BatchNorm statistics do not move
    assert any(float(layer.lora_B["default"].weight.detach().abs().sum()) > 0 for _, layer in lora_modules(model.body))
    model.eval()
    with torch.no_grad():
        before = model(x)
    model.train()
    model.eval()  # toggles merge nothing (the loralib trap)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)
    method.end_session(None)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=1e-5)
    assert list(model.state_dict()) == keys
    assert "peft_config" not in vars(model.body)
    assert type(model.body[0].conv_pw) is nn.Conv2d and type(model.body[0].conv_pwl) is nn.Conv2d
    assert all(p.requires_grad for p in model.body.parameters())  # the base's setting comes back
    # a second session: fresh adapters (B = 0), so the model is unchanged at its first update
    model.head.grow(1, torch.Generator().manual_seed(2))
    method.begin_session(session([5], np.arange(3, 6), 6))
    assert all(float(layer.lora_B["default"].weight.detach().abs().sum()) == 0 for _, layer in lora_modules(model.body))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(x)[:, :5], before, rtol=0, atol=1e-5)


def test_lora_adapters_survive_a_mid_session_checkpoint():
    method, s = tiny_run([LoRA(LoRAConfig(rank=2))], steps=2)
    state = method.state_dict()
    assert any("lora_B" in k for k in state["modifiers"]["lora"]["adapters"])
    model2 = copy.deepcopy(method.model)
    from bench_stability_gap.methods.sgm.lora import fold_lora
    fold_lora(model2.body)  # a body without adapters
    m2 = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=2))])
    m2.setup(model2, method.ctx)
    m2.load_state_dict(state)  # re-injects and loads the live adapters
    for (n1, p1), (n2, p2) in zip(method.model.body.state_dict().items(), model2.body.state_dict().items()):
        assert n1 == n2
        if "lora_" in n1:
            assert torch.equal(p1, p2)


def test_lora_needs_a_base_that_trains_the_body():
    model = tiny_model(3)
    method = OutputOnly(OutputOnly.Config(), [LoRA(LoRAConfig(rank=2))])
    with pytest.raises(BenchError, match="only the head"):
        method.setup(model, tiny_ctx(torch.zeros(1, 2, 3, 3), np.array([0])))
    method = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=2, targets=["mlp.fc1"]))])
    with pytest.raises(BenchError, match="mlp.fc1"):
        method.setup(tiny_model(3), tiny_ctx(torch.zeros(1, 2, 3, 3), np.array([0])))


# ---------------------------------------------------------------------------------------------------
# OneCycle with layer-wise decay


def test_one_cycle_keeps_per_group_lr_ratios():
    model = tiny_model(3)
    # head lr 1e-3; body.1 has no parameters; body.0 (depth 2 below the head) 1e-3 * .9^2 = 8.1e-4
    groups = [g for g in layerwise_groups(model, 1e-3, 0.05, 0.9, train_body=True, unit="module") if g["params"]]
    opt = torch.optim.AdamW(groups)
    sched = one_cycle(opt, total_steps=10, cfg=OneCycleConfig(max_lr="per_group"))
    # OneCycle starts at max_lr / 25: 4e-5 and 3.24e-5
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([4e-5, 3.24e-5])
    peak = []
    for _ in range(9):
        opt.step()
        sched.step()
        lrs = [g["lr"] for g in opt.param_groups]
        assert lrs[1] / lrs[0] == pytest.approx(0.81)  # the layer-wise ratio survives every step
        peak.append(lrs[0])
    assert max(peak) == pytest.approx(1e-3)  # the head's own lr is its max_lr (not a shared scalar)
    # a scalar max_lr (the published code's, the default) flattens the ratio to 1:
    opt2 = torch.optim.AdamW([dict(g) for g in groups])
    one_cycle(opt2, total_steps=10, base_lr=1e-3)
    assert opt2.param_groups[1]["lr"] / opt2.param_groups[0]["lr"] == pytest.approx(1.0)


def test_sgm_builds_a_one_cycle_over_the_lora_groups():
    method, _ = tiny_run([SGM(SGMConfig(**{"lora.rank": 2, "onecycle.max_lr": "per_group"}))], steps=1,
                         layer_decay=0.5, layer_decay_unit="module")
    sched = method.scheduler
    assert isinstance(sched, torch.optim.lr_scheduler.OneCycleLR)
    max_lrs = [g["max_lr"] for g in method.optimizer.param_groups]
    assert max_lrs == pytest.approx([1e-3, 2.5e-4])  # head 1e-3; the LoRA block, depth 2: 1e-3 * .5^2
    # the default (published code): one scalar peak, the method's lr, for every tensor's group
    method, _ = tiny_run([SGM(SGMConfig(**{"lora.rank": 2}))], steps=1, layer_decay=0.5)
    # trainable tensors: head weight and bias, lora_A and lora_B of conv_pw and of conv_pwl
    assert [g["max_lr"] for g in method.optimizer.param_groups] == pytest.approx([1e-3] * 6)


# ---------------------------------------------------------------------------------------------------
# composition


def test_modifier_order_does_not_change_the_result():
    def parts():
        return [LoRA(LoRAConfig(rank=2)), DataDrivenInit(), OldClassFreezing(), SoftTargets()]

    a, _ = tiny_run(parts(), steps=3)
    b, _ = tiny_run(list(reversed(parts())), steps=3)
    for name, p in a.model.state_dict().items():
        assert torch.equal(p, b.model.state_dict()[name]), name
    # sgm = the same four parts (+ OneCycle, which only acts from the first step on)
    a0, _ = tiny_run(list(reversed(parts())), steps=0)
    c0, _ = tiny_run([SGM(SGMConfig(**{"lora.rank": 2}))], steps=0)
    for name, p in a0.model.state_dict().items():
        assert torch.equal(p, c0.model.state_dict()[name]), name


def test_sgm_use_switches_parts_off():
    # use without lora and onecycle: no adapters, the whole body trains, no scheduler; soft targets still act
    method, _ = tiny_run([SGM(SGMConfig(use=["soft", "init", "oocf"]))], steps=1)
    assert not lora_modules(method.model.body) and method.scheduler is None
    assert method.modifiers[0].soft.u.shape == (5, 5)
    # and a part switched off may then be given on its own
    method, _ = tiny_run([SGM(SGMConfig(use=["soft", "init", "oocf"])), LoRA(LoRAConfig(rank=2))], steps=1)
    assert lora_modules(method.model.body)


def test_sgm_rejects_a_part_named_twice_before_anything_trains():
    with pytest.raises(BenchError, match="already includes lora"):
        Vanilla(Vanilla.Config(), [SGM(), LoRA()])
    with pytest.raises(BenchError, match="already includes soft"):
        build_method("vanilla+soft+sgm", "tiny_cil")  # what `bench run` calls before the joint reference


@pytest.mark.parametrize("text", ["vanilla+lora+oocf", "vanilla+sgm", "vanilla+soft", "finetune+sgm",
                                  "vanilla+init+lora", "output_only+oocf"])
def test_a_method_string_builds_its_modifiers_in_order_on_the_standard_step(text):
    spec, method = build_method(text, "tiny_cil")
    assert [m.name for m in method.modifiers] == text.split("+")[1:]
    assert isinstance(method, StandardMethod)


def test_modifier_settings_route_through_set():
    _, method = build_method("vanilla+sgm", "tiny_cil", {"sgm.lora.rank": 16, "lr": 2e-3})
    assert method.modifiers[0].config.lora.rank == 16 and method.config.lr == 2e-3
    _, method = build_method("vanilla+lora", "tiny_cil", {"lora.rank": 8})
    assert method.modifiers[0].config.rank == 8
    with pytest.raises(BenchError, match="rnk"):
        build_method("vanilla+lora", "tiny_cil", {"lora.rnk": 8})


def test_defaults_resolve_default_then_property_rules_then_the_protocol_itself():
    table = {"default": {"a": 1, "c": 0},
             "when": [{"match": {"backbone.model": "tf_efficientnet_lite0", "backbone.input_size": 32},
                       "set": {"a": 2, "b": 1}}],
             "tiny_cil": {"b": 3}}
    assert protocol_defaults(table, load_protocol("tiny_cil")) == {"a": 2, "c": 0, "b": 3}
    assert protocol_defaults(table, load_protocol("tiny_online_2k")) == {"a": 2, "c": 0, "b": 1}
    assert protocol_defaults(table, load_protocol("cil_places_lt")) == {"a": 1, "c": 0}
    # a copy of tiny_cil under another name is what it is, not what it is called
    renamed = load_protocol("tiny_cil").model_copy(update={"name": "my_study"})
    assert protocol_defaults(table, renamed) == {"a": 2, "c": 0, "b": 1}
    with pytest.raises(BenchError, match=r"when\[0\]\.match names 'backbone.modle'"):
        protocol_defaults({"when": [{"match": {"backbone.modle": "x"}, "set": {}}]}, renamed)


def test_shipped_defaults_are_the_published_ones_on_every_protocol():
    """A method string with no --set runs the published code's SGM on the embedded family too: no
    protocol gets hand-tuned settings from methods/defaults.yaml."""
    for protocol in ("tiny_cil", "tiny_cil_storage_150", "cil_places_lt"):
        _, method = build_method("derpp+sgm", protocol)
        sgm = method.modifiers[0].config
        assert sgm == type(sgm)(), protocol
        _, method = build_method("vanilla+init", protocol)
        assert method.modifiers[0].config.scale == "unit"


class NonStandard(Method):
    name = "nonstandard"
    Config = MethodConfig

    def setup(self, model, ctx):
        pass

    def observe(self, batch):
        pass

    def predict(self, x):
        return x


class FakeEntry(Entry):
    def load(self):
        return NonStandard


def test_modifier_on_a_non_standard_base_is_an_error(monkeypatch):
    import bench_stability_gap.methods.registry as registry

    real = registry.entries

    def entries(group):
        found = dict(real(group))
        if group == registry.METHOD_GROUP:
            found["nonstandard"] = FakeEntry("nonstandard", group, "x:y", "fake", "0")
        return found

    monkeypatch.setattr(registry, "entries", entries)
    build_method("nonstandard", "tiny_cil")  # alone it is fine
    with pytest.raises(BenchError, match="does not use the standard training step"):
        build_method("nonstandard+lora", "tiny_cil")


def test_the_progress_bar_label_is_the_whole_method_string():
    from bench_stability_gap.methods.registry import build_method

    assert build_method("vanilla+soft+oocf", "tiny_cil")[1].label == "vanilla+soft+oocf"
    assert build_method("vanilla+sgm", "tiny_cil")[1].label == "vanilla+sgm"
    assert build_method("vanilla", "tiny_cil")[1].label == "vanilla"
