"""FLOP accounting (harness.model.flops): fvcore against PyTorch's own counter, the per-part split, the
backward convention and the run-time meter, on tiny models (fast)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from bench_stability_gap.harness.model import flops as FL
from bench_stability_gap.harness.model.backbone import GrowingHead, SplitModel, create_network, split_network
from bench_stability_gap.harness.spec.protocol import load_protocol


class SmallNet(nn.Module):
    """Conv / BN / ReLU6 / residual add / pooling / linear: every kind of op the counters disagree on."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        h = nn.functional.relu6(self.bn1(self.conv1(x)))
        h = h + nn.functional.relu(self.bn2(self.conv2(h)))  # residual add
        return self.fc(self.pool(self.conv3(h)).flatten(1))


def test_fvcore_matches_pytorch_flop_counter_within_10_percent():
    torch.manual_seed(0)
    net = SmallNet().eval()
    x = torch.randn(2, 3, 32, 32)
    analysis = FL.fvcore_analysis(net, x)
    with FlopCounterMode(display=False) as mode:
        net(x)
    torch_flops = mode.get_total_flops()
    fvcore_flops = 2 * analysis.total()  # fvcore counts a multiply-add as one: FLOPs = 2 x MACs
    assert fvcore_flops == pytest.approx(torch_flops, rel=0.10)

    # Where they differ: fvcore also counts batch_norm and adaptive_avg_pool2d (PyTorch's counter
    # does not); on conv + linear alone they agree exactly.
    by_op = analysis.by_operator()
    assert set(by_op) == {"conv", "batch_norm", "adaptive_avg_pool2d", "linear"}
    assert 2 * (by_op["conv"] + by_op["linear"]) == torch_flops
    counted_by_torch = {str(op) for op in mode.get_flop_counts()["Global"]}
    assert counted_by_torch == {"aten.convolution", "aten.addmm"}  # no batch_norm, no pooling
    # Ops fvcore skips (cost 0): the residual add and ReLU6 are reported as unsupported;
    # relu, flatten and the like are on its silent ignore list. PyTorch's counter skips them too.
    assert set(analysis.unsupported_ops()) == {"aten::add", "aten::relu6"}


def test_backward_convention_per_module():
    """Backward = 2x forward for modules with trainable weights, 1x for modules gradient only passes
    through, 0 for modules before anything trainable (a LoRA-adapted body, in miniature)."""
    frozen0, trainable1, frozen2 = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 1), nn.Conv2d(8, 8, 3)
    pool, fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)
    net = nn.Sequential(frozen0, trainable1, frozen2, pool, nn.Flatten(), fc)
    for m in (frozen0, frozen2):
        m.requires_grad_(False)
    macs = FL.module_macs(net, torch.zeros(1, 3, 12, 12))
    c0, c1, c2, p, lin = macs["0"], macs["1"], macs["2"], macs["3"], macs["5"]
    assert c0 == 3 * 8 * 9 * 10 * 10 and c1 == 8 * 8 * 10 * 10 and c2 == 8 * 8 * 9 * 8 * 8
    assert p == 8 * 8 * 8 and lin == 8 * 4
    cost = FL.part_cost(net, (3, 12, 12))
    assert cost.forward == c0 + c1 + c2 + p + lin
    assert cost.backward == 0 * c0 + 2 * c1 + 1 * c2 + 1 * p + 2 * lin
    assert cost.out_shape == (4,)
    # everything frozen and no gradient coming in: no backward at all
    net.requires_grad_(False)
    assert FL.part_cost(net, (3, 12, 12)).backward == 0
    # ... but gradient flowing in from upstream passes through every module once
    assert FL.part_cost(net, (3, 12, 12), input_requires_grad=True).backward == cost.forward


def test_tiny_cil_parts_are_positive_and_sum_to_the_whole_network():
    spec = load_protocol("tiny_cil").backbone.model_copy(update={"weights": "none:"})  # same compute
    model = split_network(create_network(spec), spec, 30).eval()
    parts = FL.split_macs(model, (3, 32, 32))
    assert all(parts[p] > 0 for p in FL.PARTS)
    whole = FL.fvcore_analysis(model, torch.zeros(1, 3, 32, 32)).total()  # trunk -> body -> head in one trace
    assert sum(parts.values()) == whole
    assert parts["head"] == 1280 * 30  # Linear: in x out per sample


def _tiny_split(classes: int = 3) -> SplitModel:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    body = nn.Sequential(nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return SplitModel(trunk, body, GrowingHead(6, classes))


def test_meter_counts_every_forward_and_each_backward():
    model = _tiny_split()
    meter = FL.FlopMeter(model, (3, 8, 8))
    trunk, body, head = (meter.cost(p).forward for p in FL.PARTS)
    pool = 6 * 4 * 4  # adaptive pool over 6 x 4 x 4: fvcore counts one per input element
    body_bwd = 2 * (body - pool) + pool  # the pool has no weights: gradient passes through it once
    x = torch.randn(5, 3, 8, 8)
    with meter.attached():
        meter.start_update()
        model(x).sum().backward()  # train: 5 samples forward + backward through body and head
        assert meter.end_update() == (5, "body")
        with torch.no_grad():
            copy.deepcopy(model)(x[:2])  # a teacher copy: the hooks come along, 2 forwards counted
        with meter.evaluating(), torch.no_grad():
            model(x[:3])
    model(x)  # detached: not counted
    t = meter.tally
    assert t.fwd_samples["train"] == {"trunk": 7, "body": 7, "head": 7}
    assert t.bwd_samples["train"] == {"trunk": 0, "body": 5, "head": 5}
    assert t.fwd_samples["eval"] == {"trunk": 3, "body": 3, "head": 3}
    assert meter.train_macs() == 7 * (trunk + body + head) + 5 * (body_bwd + 2 * head)
    assert meter.eval_macs() == 3 * (trunk + body + head)


def test_meter_cached_trunk_counts_the_uncached_equivalent_and_follows_a_growing_head():
    model = _tiny_split()
    model.trunk_cached = True
    meter = FL.FlopMeter(model, (3, 8, 8))
    trunk, body, head3 = (meter.cost(p).forward for p in FL.PARTS)
    feats = torch.randn(4, 4, 8, 8)
    with meter.attached(), torch.no_grad():
        model(feats)
        model.head.grow(2)  # 5 classes now: the head's cost follows
        model(feats)
    assert meter.cost("head").forward == head3 * 5 / 3
    assert meter.tally.fwd_samples["train"]["trunk"] == 8  # no trunk ran, but an uncached run would have
    assert meter.train_macs() == 8 * (trunk + body) + 4 * head3 + 4 * head3 * 5 / 3
    executed = FL.executed_macs(meter, "train", meter.train_macs(), distinct=4)
    assert executed == meter.train_macs() - 4 * trunk  # the 4 images went through the trunk once
    counters = {FL.TRUNK_FEATURE_SAMPLES: 2, FL.EXTRA_MACS: 100.0, FL.INIT_FORWARD_SAMPLES: 7}
    assert FL.adjusted_train_macs(meter, counters) == meter.train_macs() + 2 * trunk + 100
    # a method feeding features it made itself (REMIND flips trunk_cached for a moment) in an
    # uncached run: the trunk it ran is counted by the trunk's hook, the body adds no trunk forward
    model.trunk_cached = False
    uncached = FL.FlopMeter(model, (3, 8, 8))
    with uncached.attached(), torch.no_grad():
        model.trunk_cached = True
        model(feats)
    assert uncached.tally.fwd_samples["train"] == {"trunk": 0, "body": 4, "head": 4}
