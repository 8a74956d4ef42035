"""Fidelity to the published code behind the paper's tables (docs/fidelity.md has a row per
choice). Each test pins one reading against a hand-computed case; the arithmetic is in the comments.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from support import fake_training
from bench_stability_gap.harness.model.backbone import GrowingHead, SplitModel, create_network, split_network
from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.harness.data.stream import Session
from bench_stability_gap.methods.base import TrainBatch, layerwise_groups
from bench_stability_gap.methods.baselines import Vanilla
from bench_stability_gap.methods.lwf import LwF
from bench_stability_gap.methods.sgm.init import DataDrivenInit
from bench_stability_gap.methods.sgm.lora import LoRA, LoRAConfig, fold_lora, lora_modules
from bench_stability_gap.methods.sgm.soft import SoftTargets, SoftTargetsConfig


class Inputs:
    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def get(self, ids):
        return self.x[torch.as_tensor(np.asarray(ids))]


def ctx_for(x: torch.Tensor, labels: np.ndarray, targets=("fc1",), name: str = "t", updates=4):
    protocol = SimpleNamespace(name=name, backbone=SimpleNamespace(lora_targets=list(targets)),
                               training=fake_training(updates))
    stream = SimpleNamespace(train=SimpleNamespace(labels=labels))
    return SimpleNamespace(protocol=protocol, stream=stream, device=torch.device("cpu"), inputs=Inputs(x),
                           generator=torch.Generator().manual_seed(0), counters={}, memory=SimpleNamespace(ids=[]),
                           compute=ComputeEnv.for_run(torch.device("cpu")))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2, 2)

    def forward(self, x):
        return self.fc1(x)


def linear_model() -> SplitModel:
    torch.manual_seed(0)
    return SplitModel(nn.Sequential(nn.Flatten()), nn.Sequential(Mlp()), GrowingHead(2, 2))


def new_session(new, ids, seen) -> Session:
    return Session(index=2, train_ids=np.asarray(ids), classes=np.asarray(new), new_classes=np.asarray(new),
                   seen_classes=seen)


# --------------------------------------------------------------------------------------------- item 1


def test_lora_merged_weight_after_one_known_step_at_scale_one_over_48():
    """Rank 48, alpha 1 (loralib's default in the published code): the fold adds (B @ A) / 48.

    A := ones(48, 2) after injection; B = 0. One AdamW step at lr .01, no weight decay, no layer decay:
    B's gradient is (1/48) G A^T, G = dL/dW of the base layer (the same as the plain model's, as B A = 0),
    so B'[i, :] = -.01 sign(rowsum G)[i] (Adam's first step is lr * g / |g|), and A gets no gradient
    (it is multiplied by B = 0). Folded: W' = W + (1/48) B' A' = W - .01 sign(rowsum G)[i] * 48 / 48,
    i.e. every entry of row i moves by .01 (scale 1 would move it by .48).
    """
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]])
    labels = np.array([0, 1, 2])
    model = linear_model()
    w0 = model.body[0].fc1.weight.detach().clone()
    # G from the plain model: the same forward (B A = 0), cross-entropy over the grown head
    model.head.grow(1, torch.Generator().manual_seed(1))
    plain = SplitModel(nn.Sequential(nn.Flatten()), nn.Sequential(Mlp()), GrowingHead(2, 3))
    plain.load_state_dict(model.state_dict())
    F.cross_entropy(plain(x), torch.as_tensor(labels)).backward()
    row_sign = torch.sign(plain.body[0].fc1.weight.grad.sum(1))
    assert bool((row_sign != 0).all())

    method = Vanilla(Vanilla.Config(lr=0.01, weight_decay=0.0, layer_decay=1.0), [LoRA(LoRAConfig(rank=48))])
    method.setup(model, ctx_for(x, labels))
    method.begin_session(new_session([2], [2], 3))
    (_, layer), = lora_modules(model.body)
    assert layer.scaling["default"] == pytest.approx(1 / 48)
    with torch.no_grad():
        layer.lora_A["default"].weight.fill_(1.0)
    method.observe(TrainBatch(x, torch.as_tensor(labels), np.arange(3), torch.tensor([False, False, True])))
    b = layer.lora_B["default"].weight.detach()
    torch.testing.assert_close(b, -0.01 * row_sign[:, None].expand(2, 48), rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(layer.lora_A["default"].weight.detach(), torch.ones(48, 2))
    fold_lora(model.body)
    torch.testing.assert_close(model.body[0].fc1.weight.detach(), w0 - 0.01 * row_sign[:, None].expand(2, 2),
                               rtol=1e-5, atol=1e-7)


def test_lora_init_is_loralibs_kaiming_uniform_by_default_and_gaussian_on_request():
    x, labels = torch.zeros(1, 2), np.array([0])
    # loralib: kaiming_uniform_(A, a=sqrt 5) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)); fan_in = 2 -> |A| <= .7071
    model = linear_model()
    method = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=400))])
    method.setup(model, ctx_for(x, labels))
    method.begin_session(new_session([], [], 2))
    a = lora_modules(model.body)[0][1].lora_A["default"].weight.detach()
    assert float(a.abs().max()) <= 2**-0.5 and float(a.abs().max()) > 0.69  # 800 draws fill the range
    assert float(a.std()) == pytest.approx(2**-0.5 / 3**0.5, rel=0.1)  # U(-b, b) has std b / sqrt 3
    model = linear_model()
    method = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=400, init="gaussian", alpha=None))])
    method.setup(model, ctx_for(x, labels))
    method.begin_session(new_session([], [], 2))
    layer = lora_modules(model.body)[0][1]
    assert float(layer.lora_A["default"].weight.detach().std()) == pytest.approx(1 / 400, rel=0.1)  # N(0, 1/r^2)
    assert layer.scaling["default"] == pytest.approx(1.0)  # alpha unset: alpha = r, the text's W + BA


# --------------------------------------------------------------------------------------------- item 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_pw = nn.Conv2d(4, 6, 1)
        self.bn = nn.BatchNorm2d(6)
        self.conv_pwl = nn.Conv2d(6, 4, 1, bias=False)

    def forward(self, x):
        return x + self.conv_pwl(F.relu(self.bn(self.conv_pw(x))))


def block_model() -> SplitModel:
    torch.manual_seed(0)
    body = nn.Sequential(Block(), nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()))
    return SplitModel(nn.Sequential(nn.Conv2d(2, 4, 1)), body, GrowingHead(4, 3))


def test_tensor_wise_layer_decay_gives_named_tensors_their_hand_computed_lr():
    # named_parameters of body then head: conv_pw.weight, conv_pw.bias, bn.weight, bn.bias,
    # conv_pwl.weight, head.fc.weight, head.fc.bias. Reversed, tensor i from the end gets 1e-3 * .9^i:
    # head.fc.bias 1e-3, head.fc.weight 9e-4, conv_pw.weight (i = 6) 1e-3 * .9^6 = 5.31441e-4.
    lrs = {g["name"]: g["lr"] for g in layerwise_groups(block_model(), 1e-3, 0.05, 0.9, train_body=True, unit="tensor")}
    assert lrs["head.fc.bias"] == pytest.approx(1e-3)
    assert lrs["head.fc.weight"] == pytest.approx(9e-4)
    assert lrs["body.0.conv_pw.weight"] == pytest.approx(5.31441e-4)
    assert len(lrs) == 7
    # per module (bench's earlier reading): head 1e-3, the block (depth 2, the pooling has no tensors) 8.1e-4
    mods = {g["name"]: g["lr"] for g in layerwise_groups(block_model(), 1e-3, 0.05, 0.9, train_body=True, unit="module")}
    assert mods == pytest.approx({"head": 1e-3, "body.0": 8.1e-4})


def test_tensor_wise_decay_counts_frozen_tensors_as_steps_as_the_code_does():
    # With LoRA on conv_pw (rank 2): conv_pw becomes base_layer.weight, base_layer.bias, lora_A, lora_B.
    # Order: base w, base b, lora_A, lora_B, bn.w, bn.b, conv_pwl.w, head.w, head.b. Reversed, lora_B is
    # i = 5 (1e-3 * .9^5 = 5.9049e-4) and lora_A i = 6 (5.31441e-4); the frozen ones get no group.
    model = block_model()
    method = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=2, targets=["conv_pw"]))])
    method.setup(model, ctx_for(torch.zeros(1, 2, 3, 3), np.array([0]), targets=("conv_pw",)))
    method.begin_session(new_session([], [], 3))
    lrs = {g["name"]: g["lr"] for g in method.optimizer.param_groups}
    assert lrs == pytest.approx({"head.fc.bias": 1e-3, "head.fc.weight": 9e-4,
                                 "body.0.conv_pw.lora_B.default.weight": 5.9049e-4,
                                 "body.0.conv_pw.lora_A.default.weight": 5.31441e-4})


# --------------------------------------------------------------------------------------------- item 3


def test_soft_target_vectors_for_an_old_and_a_new_sample_as_the_code_builds_them():
    """C = 3 output units; class 0 old with u_0 = (.7, .2, .1) (one correct sample so far this session);
    class 2 new. Sample of class 0, softmax (.2, .5, .3), predicted 1 (wrong): base u_0, t[1] = 1/3, t[0] = 1
    -> (1, 1/3, .1) / (43/30) = (30/43, 10/43, 3/43). Sample of class 2, softmax (.1, .6, .3), predicted 1:
    base = its own softmax, t[1] = 1/3, t[2] = 1 -> (.1, 1/3, 1) / (43/30) = (3/43, 10/43, 30/43)."""
    soft = SoftTargets()
    soft.grow(3)
    soft.update(torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([0]))
    probs = torch.tensor([[0.2, 0.5, 0.3], [0.1, 0.6, 0.3]])
    y = torch.tensor([0, 2])
    t = soft.build(probs, y, torch.tensor([False, True]))
    torch.testing.assert_close(t, torch.tensor([[30 / 43, 10 / 43, 3 / 43], [3 / 43, 10 / 43, 30 / 43]]))
    # the text's reading: the new sample's base is u_2, still uniform (1/3 each): (1/3, 1/3, 1) / (5/3)
    text = SoftTargets(SoftTargetsConfig(new_samples="running_mean", reset="never"))
    text.load_state_dict(soft.state_dict())
    torch.testing.assert_close(text.build(probs, y, torch.tensor([False, True]))[1], torch.tensor([0.2, 0.2, 0.6]))


def test_soft_targets_learn_from_correct_samples_only_unless_told_otherwise():
    # class 0 predicted 1 (wrong): the code leaves u_0 uniform; the text's reading averages it in:
    # u_0 = (0 * u + (.2, .7, .1)) / 1
    p, y = torch.tensor([[0.2, 0.7, 0.1]]), torch.tensor([0])
    code, text = SoftTargets(), SoftTargets(SoftTargetsConfig(update_on="all"))
    for soft in (code, text):
        soft.grow(3)
        soft.update(p, y)
    torch.testing.assert_close(code.u[0], torch.full((3,), 1 / 3))
    torch.testing.assert_close(text.u[0], torch.tensor([0.2, 0.7, 0.1]))


def test_soft_target_accumulators_reset_at_each_session_start_by_default():
    head = SimpleNamespace(num_classes=4, fc=nn.Linear(2, 4))
    method = SimpleNamespace(model=SimpleNamespace(head=head))
    for reset, expect in (("session", torch.full((4,), 0.25)), ("never", torch.tensor([0.7, 0.2, 0.1, 0.0]))):
        soft = SoftTargets(SoftTargetsConfig(reset=reset))
        soft.grow(3)
        soft.update(torch.tensor([[0.7, 0.2, 0.1]]), torch.tensor([0]))
        soft.grow(4)  # the head grew for the next session
        soft.begin_session(method, None)
        torch.testing.assert_close(soft.u[0], expect)
        assert soft.counts.tolist() == ([0, 0, 0, 0] if reset == "session" else [1, 0, 0, 0])


# --------------------------------------------------------------------------------------------- item 4


def _places_model(num_classes: int = 1365, protocol: str = "cil_places_lt") -> SplitModel:
    spec = load_protocol(protocol).backbone.model_copy(update={"weights": "none:"})
    return split_network(create_network(spec), spec, num_classes)


def _sgm_params(model: SplitModel, targets: tuple[str, ...]) -> int:
    method = Vanilla(Vanilla.Config(), [LoRA(LoRAConfig(rank=48))])
    method.setup(model, ctx_for(torch.zeros(1), np.array([0]), targets=targets))
    LoRA.inject(method.modifiers[0], method)
    return model.trainable_parameters()


def test_convnextv2_femto_split_gives_the_papers_trainable_parameter_counts():
    # Body (stages.2.blocks.*, stages.3) 4,550,016 + head 384 * 1365 + 1365 = 525,525 -> 5,075,541 (paper 5.08M).
    model = _places_model()
    assert model.trainable_parameters() == 5_075_541
    # The frozen part ends after downsample_layers.2 (timm: stages.2.downsample).
    assert "stages.2.downsample" in load_protocol("cil_places_lt").backbone.trunk
    # SGM: LoRA rank 48 on mlp.fc1 / mlp.fc2 of the 8 plastic blocks: 6 * 48 * (192 + 768) * 2
    # + 2 * 48 * (384 + 1536) * 2 = 921,600 (paper 0.92M), + head 525,525 = 1,447,125 (paper 1.45M).
    assert _sgm_params(model, ("mlp.fc1", "mlp.fc2")) == 1_447_125


def test_other_backbones_trainable_parameter_counts_against_the_papers():
    # ConvNeXtV1-Tiny, same split rule: body 26,289,408 + head 768 * 1365 + 1365 = 1,049,685 -> 27,339,093
    # (paper 27.00M); LoRA 9 * 480 * 384 + 3 * 480 * 768 = 2,764,800 -> SGM 3,814,485 (paper 3.53M, which
    # is 2,764,800 + a 1,000-unit head's 769,000).
    v1 = _places_model(protocol="cil_convnextv1_places_lt")
    assert v1.trainable_parameters() == 27_339_093
    assert _sgm_params(v1, ("mlp.fc1", "mlp.fc2")) == 3_814_485
    # MobileViT-S: stages.3.1 1,680,768 + stages.4 2,314,192 + final_conv 103,680 + head 640 * 1365 + 1365
    # = 4,973,605 (paper 4.97M). LoRA on timm's fused qkv: r (d + 3d) per layer, 4 layers at d 192 and 3 at
    # 240: 48 * 4 * (4 * 192 + 3 * 240) = 285,696 -> SGM 1,160,661 (paper 1.30M: separate q, k, v adapters).
    mvit = _places_model(protocol="cil_mobilevit_places_lt")
    assert mvit.trainable_parameters() == 4_973_605
    assert _sgm_params(mvit, ("attn.qkv",)) == 1_160_661


# --------------------------------------------------------------------------------------------- item 7


@pytest.mark.parametrize(("method", "protocol", "lr"), [
    ("derpp+sgm", "cil_places_std_24k", 1.5e-3), ("derpp", "cil_places_std_24k", 1e-3),
    ("gdumb+sgm", "cil_places_std_192k", 1.5e-3), ("gdumb", "cil_places_std_192k", 1e-3),
    ("vanilla", "cil_places_lt_balanced", 1e-4), ("vanilla+sgm", "cil_places_lt_balanced", 1e-3),
    ("lwf+sgm", "cil_places_lt_norehearsal", 2e-4), ("lwf", "cil_places_lt_norehearsal", 6e-5),
    ("vanilla", "cil_places_lt", 1e-3),
])
def test_learning_rates_keyed_by_the_full_method_string(method, protocol, lr):
    assert build_method(method, protocol)[1].config.lr == pytest.approx(lr)


def test_set_still_wins_over_a_full_method_string_default():
    assert build_method("derpp+sgm", "cil_places_std_24k", {"lr": 2e-3})[1].config.lr == pytest.approx(2e-3)


# --------------------------------------------------------------------------------------------- item 8


def test_lwf_distillation_is_not_multiplied_by_t_squared():
    """Old-class teacher logits (0, ln 3), student (0, 0), T = 2: teacher probs softmax((0, ln 3)/2)
    = (1, sqrt 3)/(1 + sqrt 3) = (.366025, .633975); student (.5, .5).
    KL = .366025 ln(.732051) + .633975 ln(1.267949) = -.114171 + .150512 = .036341 (lambda 1, no T^2)."""
    method = LwF(LwF.Config())
    method.teacher = lambda x: torch.tensor([[0.0, float(np.log(3.0)), 5.0]])
    method.n_old = 2
    method.ctx = SimpleNamespace(counters={})
    batch = SimpleNamespace(x=torch.zeros(1), y=torch.tensor([2]))
    kd = method.distillation(batch, torch.tensor([[0.0, 0.0, 1.0]]))
    p = np.array([1.0, 3**0.5]) / (1 + 3**0.5)
    expected = float((p * np.log(p / 0.5)).sum())
    assert float(kd) == pytest.approx(expected, rel=1e-5) and expected == pytest.approx(0.036341, abs=1e-6)
    method.config = LwF.Config(t2_scale=True)
    assert float(method.distillation(batch, torch.tensor([[0.0, 0.0, 1.0]]))) == pytest.approx(4 * expected, rel=1e-5)


# --------------------------------------------------------------------------------------------- item 6


def test_online_init_writes_a_row_at_the_class_first_arrival_from_arrived_samples_only():
    """Online (per_sample): nothing is read at session start. Update 1 brings sample 3 (class 3): row 3
    becomes its unit embedding h_3/||h_3|| (the session's other class-3 sample, id 5, has not arrived);
    row 4 keeps its He init until class 4 arrives (update 2, sample 4)."""
    torch.manual_seed(0)
    x = torch.randn(8, 2, 3, 3)
    labels = np.array([0, 1, 2, 3, 4, 3, 4, 0])
    model = block_model()
    init = DataDrivenInit()
    method = Vanilla(Vanilla.Config(lr=1e-3), [init])
    method.setup(model, ctx_for(x, labels, targets=(), updates="per_sample"))
    model.head.grow(2, torch.Generator().manual_seed(1))
    method.begin_session(new_session([3, 4], [3, 4, 5, 6], 5))
    he = model.head.fc.weight.detach().clone()
    assert torch.equal(model.head.fc.weight, he) and init.pending == {3, 4}

    def unit_embedding(i: int) -> torch.Tensor:
        model.eval()
        with torch.no_grad():
            return F.normalize(model.embed(x[[i]]), dim=1)[0]

    h3 = unit_embedding(3)
    method.observe(TrainBatch(x[[3, 0]], torch.tensor([3, 0]), np.array([3, 0]), torch.tensor([True, False])))
    assert init.pending == {4}
    # the update after the write moved row 3 by at most ~lr per entry (Adam's first step)
    torch.testing.assert_close(model.head.fc.weight[3].detach(), h3, atol=2e-3, rtol=0)
    assert not torch.allclose(model.head.fc.weight[3].detach(), he[3], atol=0.1)
    torch.testing.assert_close(model.head.fc.weight[4].detach(), he[4], atol=2e-3, rtol=0)  # not yet arrived
    h4 = unit_embedding(4)
    method.observe(TrainBatch(x[[4, 1]], torch.tensor([4, 1]), np.array([4, 1]), torch.tensor([True, False])))
    torch.testing.assert_close(model.head.fc.weight[4].detach(), h4, atol=2e-3, rtol=0)
    assert init.pending == set() and method.ctx.counters["init_forward_samples"] == 2


def test_batch_protocols_keep_the_session_start_init():
    torch.manual_seed(0)
    x = torch.randn(8, 2, 3, 3)
    labels = np.array([0, 1, 2, 3, 4, 3, 4, 0])
    model = block_model()
    method = Vanilla(Vanilla.Config(), [DataDrivenInit()])
    method.setup(model, ctx_for(x, labels, targets=(), updates=4))
    model.head.grow(2, torch.Generator().manual_seed(1))
    method.begin_session(new_session([3, 4], [3, 4, 5, 6], 5))
    model.eval()
    with torch.no_grad():
        h = F.normalize(model.embed(x[[3, 5]]), dim=1).mean(0)  # both class-3 samples, read at the start
    torch.testing.assert_close(model.head.fc.weight[3].detach(), h)


# --------------------------------------------------------------------------------------------- item 5


def _split(capacity: int, share: float, labels, seed: int = 0):
    from bench_stability_gap.harness.run.memory import Memory
    from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec

    spec = MemorySpec(policy="split", capacity=capacity, pretrain_share=share)
    return Memory(spec, np.asarray(labels), lambda gid: 1, np.random.default_rng(seed))


def test_split_memory_keeps_a_fixed_pretrain_share_and_a_class_balanced_stream_part():
    # ids 0..9: S1 (classes 0, 1); ids 10..: stream. Cap 10, share .8: 8 S1 samples, 2 stream slots.
    labels = [0] * 5 + [1] * 5 + [2, 2, 3, 3, 4, 2]
    a, b = _split(10, 0.8, labels, seed=0), _split(10, 0.8, labels, seed=7)
    a.add(range(10), pretrain=True)
    b.add(range(10), pretrain=True)
    assert len(a.pretrain) == 8 and a.pretrain == b.pretrain  # the same subset whatever the run's seed
    a.add([10, 11])  # the stream part fills: {c2: 2}
    assert len(a) == 10 and sorted(a.ids[8:]) == [10, 11]
    a.add([12])  # c3 arrives, c2 is largest (2 vs 1): one of 10/11 gives way -> one c2, one c3
    assert sorted(np.asarray(labels)[[g for g in a.ids if g not in a.pretrain]].tolist()) == [2, 3]
    kept_c2 = next(g for g in a.ids if labels[g] == 2)
    a.add([14])  # c4: all three classes tie at 1; the first seen (c2, as max() over the code's dict) loses
    assert sorted(g for g in a.ids if g not in a.pretrain) == [12, 14] and kept_c2 not in a.ids
    assert len(a) == 10 and a.pretrain <= set(a.ids)  # S1's share never moves
    # resume: the rebuilt bookkeeping evicts exactly as the live memory does
    c = _split(10, 0.8, labels)
    c.load_state_dict(a.state_dict())
    a.add([15])
    c.add([15])
    assert a.ids == c.ids


def test_split_policy_needs_its_share_and_a_stored_s1():
    from pydantic import ValidationError

    from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec

    with pytest.raises(ValidationError, match="pretrain_share"):
        MemorySpec(policy="split", capacity=10)
    with pytest.raises(ValidationError, match="pretrain_share"):
        MemorySpec(policy="reservoir", capacity=10, pretrain_share=0.8)
    with pytest.raises(ValidationError, match="include_pretrain"):
        MemorySpec(policy="split", capacity=10, pretrain_share=0.8, include_pretrain=False)


# --------------------------------------------------------------------------------------------- item 8


def test_remind_default_schedule_steps_every_100_samples_of_a_class():
    """REMIND: gamma = (1e-5 / 1e-3)^(100 / 1300) = 10^(-2/13) = .701704; the k-th sample of a class
    trains at 1e-3 * gamma^floor(k / 100): k = 0 and 99 -> 1e-3, 100 -> 7.01704e-4, 250 -> 4.92388e-4,
    1300 -> 1e-5, 1400 -> 7.01704e-6 (no floor, as StepLR)."""
    _, method = build_method("remind", "online_cub_20k")
    assert (method.config.lr_step, method.config.lr_decay_samples, method.config.pq_subquantizers) == (100, 1300, 32)
    method.class_total = np.array([30])
    method.class_seen = np.array([0])
    for k, lr in ((0, 1e-3), (99, 1e-3), (100, 7.01704e-4), (250, 4.92388e-4), (1300, 1e-5), (1400, 7.01704e-6)):
        method.class_seen[0] = k
        assert method.class_lr(0) == pytest.approx(lr, rel=1e-5)


# -------------------------------------------------------------------------------------------- item 10


def test_session_curve_holds_one_training_loss_per_update_or_none():
    from pydantic import ValidationError

    from bench_stability_gap.harness.results.curves import SessionCurve

    base = dict(session=2, total_updates=3, updates=[0, 3], old=[0.9, 0.8], new=[0.0, 0.5], all=[0.8, 0.7],
                tasks=[[0.9, 0.8], [0.0, 0.5]])
    assert SessionCurve(**base).loss == []  # results written before the field existed still load
    assert SessionCurve(**base, loss=[2.3, 1.9, 1.7]).loss == [2.3, 1.9, 1.7]
    with pytest.raises(ValidationError, match="one value per update"):
        SessionCurve(**base, loss=[2.3, 1.9])


def test_the_papers_other_settings_have_protocols_and_reported_numbers():
    from bench_stability_gap.leaderboard.reported import load_reported

    reported = load_reported()
    for name, label, sgm_params in (("cil_convnextv1_places_lt", "tab:sup_convnextv1", 3.53),
                                    ("cil_mobilevit_places_lt", "tab:vit_backbone", 1.30),
                                    ("cil_places_std_unlimited", "tab:non-LT", 1.45)):
        protocol = load_protocol(name)
        (table,) = reported[name]
        assert table.label == label
        assert next(r for r in table.rows if r.method == "vanilla+sgm").params == sgm_params
        assert protocol.memory.policy == "unlimited"
    assert load_protocol("cil_places_lt_every10").eval.every == 10
    mvit = load_protocol("cil_mobilevit_places_lt")
    assert (mvit.training.updates, mvit.training.batch.size, mvit.joint.lr, mvit.joint.weight_decay) == (1200, 32, 1e-2, 0.01)
    assert build_method("vanilla", "cil_mobilevit_places_lt")[1].config.weight_decay == pytest.approx(0.01)
    assert build_method("vanilla+sgm", "cil_convnextv1_places_lt")[1].config.lr == pytest.approx(4e-3)
