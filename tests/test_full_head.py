"""The published model's full head on a 4-class toy: 2 classes seen, 2 not yet. Their units are in the
argmax (one can win it) and in the loss (they receive the softmax gradient the code's cross-entropy over
all outputs gives them), and the grown head, the other reading, has neither."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench_stability_gap.harness.model.backbone import GrowingHead
from bench_stability_gap.harness.run.evaluation import EvalPlan, evaluate
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method

W = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-1.0, -1.0]]   # rows of classes 0, 1 (seen), 2, 3 (not yet)
B = [0.0, 0.0, 0.3, 0.1]
H = [[1.0, 1.0], [2.0, 0.0]]                              # two penultimate embeddings
Y = [0, 1]


def _toy(full: bool) -> GrowingHead:
    head = GrowingHead(2, 2)
    head.size_for(seen=2, total=4, full=full, generator=torch.Generator().manual_seed(0))
    if full:
        with torch.no_grad():
            head.fc.weight.copy_(torch.tensor(W))
            head.fc.bias.copy_(torch.tensor(B))
    return head


def test_unseen_rows_start_at_nn_linears_init():
    head = GrowingHead(2, 2)
    before = head.fc.weight.detach().clone()
    head.size_for(seen=2, total=4, full=True, generator=torch.Generator().manual_seed(0))
    assert head.num_classes == 4 and torch.equal(head.fc.weight[:2], before)
    bound = 2 ** -0.5  # U(+-1/sqrt(fan_in)) for weight (kaiming_uniform, a = sqrt 5) and bias
    assert head.fc.weight[2:].abs().max() <= bound and head.fc.bias[2:].abs().max() <= bound
    assert head.fc.bias[2:].abs().min() > 0  # not the grown head's zero bias
    head.size_for(seen=3, total=4, full=True)  # later sessions add nothing: the units are there
    assert head.num_classes == 4
    grown = GrowingHead(2, 2)
    grown.size_for(seen=3, total=4, full=False, generator=torch.Generator().manual_seed(0))
    assert grown.num_classes == 3 and grown.fc.bias[2] == 0


def test_an_unseen_unit_wins_the_argmax_in_the_harnesss_evaluation():
    head = _toy(full=True)
    x = torch.tensor(H)
    plan = EvalPlan(ids=np.arange(2), labels=torch.tensor(Y), old=np.array([True, True]), new=np.array([False, False]),
                    task=np.zeros(2, dtype=np.int64), tasks=1)
    acc = evaluate(head, SimpleNamespace(get=lambda ids: x[torch.as_tensor(ids)]), plan, batch_size=2, chunk=2)
    # logits of sample 0: 1, 1, 1.3, -1.9 -> unit 2, a class not seen yet, wins; sample 1: 2, 0, 1.3, -1.9 -> 0
    assert acc.predicted.tolist() == [2, 0]
    assert acc.old == 0.0
    grown = GrowingHead(2, 2)  # the same seen rows without the unseen units: sample 0 is right (tie -> unit 0)
    with torch.no_grad():
        grown.fc.weight.copy_(torch.tensor(W[:2]))
        grown.fc.bias.copy_(torch.tensor(B[:2]))
    acc = evaluate(grown, SimpleNamespace(get=lambda ids: x[torch.as_tensor(ids)]), plan, batch_size=2, chunk=2)
    assert acc.predicted.tolist() == [0, 0] and acc.old == 0.5


def _softmax(z: list[float]) -> list[float]:
    e = [math.exp(v - max(z)) for v in z]
    return [v / sum(e) for v in e]


def test_unseen_units_receive_the_codes_cross_entropy_gradient():
    """The code's vanilla loss: nn.CrossEntropyLoss over all 1,365 outputs, mean over the batch; so
    dL/db_k = mean_i (p_ik - [y_i = k]) and dL/dW_k = mean_i (p_ik - [y_i = k]) h_i, by hand below."""
    head = _toy(full=True)
    _, method = build_method("vanilla", load_protocol("tiny_cil"))
    logits = head(torch.tensor(H))
    batch = SimpleNamespace(y=torch.tensor(Y))
    loss = method.loss(batch, logits, torch.tensor(Y))
    loss.backward()
    probs = [_softmax([sum(w * h for w, h in zip(W[k], x)) + B[k] for k in range(4)]) for x in H]
    for k in (2, 3):  # the units of classes not seen yet
        g_b = sum(p[k] - (y == k) for p, y in zip(probs, Y)) / len(H)
        g_w = [sum((p[k] - (y == k)) * x[d] for p, y, x in zip(probs, Y, H)) / len(H) for d in range(2)]
        assert head.fc.bias.grad[k].item() == pytest.approx(g_b, rel=1e-6)
        assert head.fc.weight.grad[k].tolist() == pytest.approx(g_w, rel=1e-6)
        assert g_b > 0  # gradient descent pushes an absent class's logit down, before its session
    # by hand, sample 0: z = (1, 1, 1.3, -1.9); p_2 = e^1.3 / (2e + e^1.3 + e^-1.9)
    p2 = math.exp(1.3) / (2 * math.e + math.exp(1.3) + math.exp(-1.9))
    assert probs[0][2] == pytest.approx(p2)
