"""EWC (methods/ewc.py): Kirkpatrick et al.'s eq. 3 penalty with a known Fisher, the empirical Fisher
of a toy head computed by hand, and the penalty reaching LoRA's adapters through the effective weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench_stability_gap.harness.model.backbone import GrowingHead
from bench_stability_gap.methods.ewc import effective_parameters, ewc_penalty, fisher_diagonal
from bench_stability_gap.methods.registry import build_method


class Toy(nn.Module):
    """body (identity) -> head, the parts effective_parameters reads."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Identity())
        self.head = GrowingHead(2, 2)
        with torch.no_grad():
            self.head.fc.weight.zero_()
            self.head.fc.bias.zero_()

    def forward(self, x):
        return self.head(self.body(x))


def test_penalty_is_half_lambda_fisher_weighted_squared_distance_on_anchored_rows():
    current = {"a": torch.tensor([1.0, 2.0]), "head": torch.tensor([[1.0, 1.0], [2.0, 2.0], [5.0, 5.0]])}
    anchor = {"a": torch.zeros(2), "head": torch.tensor([[0.0, 0.0], [1.0, 1.0]])}
    fisher = {"a": torch.tensor([1.0, 0.5]), "head": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    # (2 / 2) * (1*1 + 0.5*4 + 1*1 + 2*1 + 3*1 + 4*1): the third head row (grown since) is not anchored
    assert float(ewc_penalty(current, anchor, fisher, weight=2.0)) == pytest.approx(13.0)


def test_empirical_fisher_of_a_zero_head_by_hand():
    model = Toy()
    x, y = torch.tensor([[1.0, 2.0], [2.0, 0.0]]), torch.tensor([0, 1])
    fisher = fisher_diagonal(model, x, y)
    # softmax of zero logits is (.5, .5): dCE/dW_c = (p_c - y_c) x, dCE/db_c = p_c - y_c
    # sample 1: rows -/+ .5 * (1, 2) -> squared .25 * (1, 4); sample 2: rows +/- .5 * (2, 0) -> (1, 0)
    assert torch.allclose(fisher["head.fc.weight"], torch.tensor([[0.625, 0.5], [0.625, 0.5]]))
    assert torch.allclose(fisher["head.fc.bias"], torch.tensor([0.25, 0.25]))
    assert all(p.grad is None for p in model.parameters())  # nothing left behind for the next update


def test_accumulated_fisher_moves_the_anchor_and_sums_over_sessions(monkeypatch):
    _, method = build_method("ewc", "tiny_cil", {"gamma": 0.5})
    method.model = Toy()
    method.fisher = {"head.fc.weight": torch.ones(1, 2), "head.fc.bias": torch.ones(1)}  # one class anchored
    new = {"head.fc.weight": torch.full((2, 2), 3.0), "head.fc.bias": torch.full((2,), 3.0)}
    monkeypatch.setattr("bench_stability_gap.methods.ewc.fisher_diagonal", lambda *a: new)

    class Ctx:  # what consolidate reads: its rng, inputs and labels; counters it writes
        rng = np.random.default_rng(0)
        device = torch.device("cpu")
        counters: dict = {}
        inputs = type("I", (), {"get": staticmethod(lambda ids: torch.zeros(len(ids), 2))})()
        stream = type("S", (), {"train": type("T", (), {"labels": np.zeros(10, dtype=int)})()})()

    method.ctx = Ctx()
    method.consolidate(np.arange(10))
    assert torch.equal(method.fisher["head.fc.weight"], torch.tensor([[3.5, 3.5], [3.0, 3.0]]))  # 3 + .5 * 1
    assert Ctx.counters["ewc_fisher_samples"] == 10
    assert torch.equal(method.anchor["head.fc.weight"], torch.zeros(2, 2))


def test_the_penalty_reads_lora_adapters_through_the_effective_weight():
    from bench_stability_gap.methods.sgm.lora import inject_adapters

    model = Toy()
    model.body = nn.Sequential(nn.Conv2d(2, 2, 1, bias=False))
    inject_adapters(model.body, ["0"], rank=1, alpha=1.0, init="kaiming_uniform", generator=torch.Generator().manual_seed(0))
    params = effective_parameters(model)
    assert "body.0.weight" in params and not any("lora_" in n or "base_layer" in n for n in params)
    with torch.no_grad():
        model.body[0].lora_B["default"].weight.fill_(1.0)
    anchor = {"body.0.weight": model.body[0].get_base_layer().weight.detach().clone()}
    penalty = ewc_penalty(effective_parameters(model), anchor, {"body.0.weight": torch.ones(2, 2, 1, 1)}, 1.0)
    penalty.backward()
    assert float(penalty.detach()) > 0 and model.body[0].lora_B["default"].weight.grad.abs().sum() > 0
