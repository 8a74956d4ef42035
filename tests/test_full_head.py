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
from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.run.evaluation import EvalPlan, evaluate
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method

W = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [-1.0, -1.0]]   # rows of classes 0, 1 (seen), 2, 3 (not yet)
B = [0.0, 0.0, 0.3, 0.1]
H = [[1.0, 1.0], [2.0, 0.0]]                              # two penultimate embeddings
Y = [0, 1]



def _store(x: torch.Tensor) -> SimpleNamespace:
    """An input store over the rows of ``x``, as ``evaluate`` reads one (no read-ahead to plan)."""
    return SimpleNamespace(get=lambda ids: x[torch.as_tensor(ids)], read_ahead=lambda batches: None,
                           end_read_ahead=lambda: None)

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
    acc = evaluate(head, _store(x), plan, batch_size=2, chunk=2)
    # logits of sample 0: 1, 1, 1.3, -1.9 -> unit 2, a class not seen yet, wins; sample 1: 2, 0, 1.3, -1.9 -> 0
    assert acc.predicted.tolist() == [2, 0]
    assert acc.old == 0.0
    grown = GrowingHead(2, 2)  # the same seen rows without the unseen units: sample 0 is right (tie -> unit 0)
    with torch.no_grad():
        grown.fc.weight.copy_(torch.tensor(W[:2]))
        grown.fc.bias.copy_(torch.tensor(B[:2]))
    acc = evaluate(grown, _store(x), plan, batch_size=2, chunk=2)
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


# ------------------------------------------------------------------ one step over the full head, by hand

X = [[1.0, 2.0], [-1.0, 0.5], [0.3, -2.0]]
LABELS = [0, 1, 2]   # classes 0, 1 pre-trained; 2 arrives in this session; 3 arrives later


def _step_model():
    from torch import nn

    from bench_stability_gap.harness.model.backbone import SplitModel

    torch.manual_seed(0)
    model = SplitModel(nn.Sequential(nn.Flatten()), nn.Sequential(nn.Linear(2, 2)), GrowingHead(2, 2))
    model.head.size_for(seen=3, total=4, full=True, generator=torch.Generator().manual_seed(1))
    return model


def _ctx(x, labels):
    from support import fake_training

    protocol = SimpleNamespace(name="t", backbone=SimpleNamespace(lora_targets=[]), training=fake_training(4))
    return SimpleNamespace(protocol=protocol, stream=SimpleNamespace(train=SimpleNamespace(labels=labels)),
                           device=torch.device("cpu"), inputs=SimpleNamespace(get=lambda ids: x[torch.as_tensor(ids)]),
                           generator=torch.Generator().manual_seed(0), counters={}, memory=SimpleNamespace(ids=[]),
                           compute=ComputeEnv.for_run(torch.device("cpu")))


def _one_step(modifiers):
    """One update of session 2 (class 2 new, 4 units) on the toy; returns the model before the step (after
    begin_session), after it, and the step's loss."""
    import copy

    from bench_stability_gap.harness.data.stream import Session
    from bench_stability_gap.methods.base import TrainBatch
    from bench_stability_gap.methods.baselines import Vanilla

    x, labels = torch.tensor(X), np.array(LABELS)
    model = _step_model()
    method = Vanilla(Vanilla.Config(lr=0.01, weight_decay=0.0, layer_decay=1.0), modifiers)
    method.setup(model, _ctx(x, labels))
    method.begin_session(Session(index=2, train_ids=np.array([2]), classes=np.array([2]), new_classes=np.array([2]),
                                 seen_classes=3))
    before = copy.deepcopy(model)
    stats = method.observe(TrainBatch(x, torch.as_tensor(labels), np.arange(3), torch.tensor([False, False, True])))
    return before, model, float(stats.loss)


def _logits(model) -> list[list[float]]:
    """z = W_head (W_body x + b_body) + b_head, written out."""
    wb, bb = model.body[0].weight.tolist(), model.body[0].bias.tolist()
    wh, bh = model.head.fc.weight.tolist(), model.head.fc.bias.tolist()
    out = []
    for x in X:
        h = [sum(wb[r][c] * x[c] for c in range(2)) + bb[r] for r in range(2)]
        out.append([sum(wh[k][d] * h[d] for d in range(2)) + bh[k] for k in range(4)])
    return out


def _moved_by_adams_first_step(before, after, rows, signs):
    """Adam's first step moves a parameter by -lr * g / (|g| + eps): lr .01 against the gradient's sign."""
    for k, s in zip(rows, signs):
        assert after.head.fc.bias[k].item() == pytest.approx(before.head.fc.bias[k].item() - 0.01 * s, abs=1e-6)


def test_one_vanilla_step_over_the_full_head_is_the_codes_cross_entropy():
    before, after, loss = _one_step([])
    z = _logits(before)
    p = [_softmax(v) for v in z]
    hand = sum(-math.log(p[i][y]) for i, y in enumerate(LABELS)) / 3  # nn.CrossEntropyLoss over all 4 units
    assert loss == pytest.approx(hand, rel=1e-6)
    g_b = [sum(p[i][k] - (LABELS[i] == k) for i in range(3)) / 3 for k in range(4)]
    assert g_b[3] > 0  # class 3, not seen yet, is pushed down
    _moved_by_adams_first_step(before, after, range(4), [math.copysign(1, g) for g in g_b])


def test_one_sgm_step_over_the_full_head_is_the_codes_soft_target_loss():
    """Soft targets at the session's start (u uniform, 1/C with C = 4 units), the init row of class 2 (its
    bias untouched: nn.Linear's, as the code's), OOCF on the old rows 0, 1 only: row 3 trains."""
    from bench_stability_gap.methods.sgm.init import DataDrivenInit
    from bench_stability_gap.methods.sgm.oocf import OldClassFreezing
    from bench_stability_gap.methods.sgm.soft import SoftTargets

    before, after, loss = _one_step([SoftTargets(), DataDrivenInit(), OldClassFreezing()])
    fresh = _step_model()
    assert before.head.fc.bias[2] == fresh.head.fc.bias[2] != 0  # init rewrites the weight row only
    wb, bb = before.body[0].weight.tolist(), before.body[0].bias.tolist()
    h2 = [sum(wb[r][c] * X[2][c] for c in range(2)) + bb[r] for r in range(2)]
    norm = math.hypot(*h2)
    assert before.head.fc.weight[2].tolist() == pytest.approx([v / norm for v in h2], rel=1e-6)
    z = _logits(before)
    p = [_softmax(v) for v in z]
    total = 0.0
    for i, y in enumerate(LABELS):
        t = list(p[i]) if y == 2 else [0.25] * 4  # new class: its softmax; old: u_y, uniform at the start
        pred = max(range(4), key=lambda k: p[i][k])
        if pred != y:
            t[pred] = 1 / 4
        t[y] = 1.0
        t = [v / sum(t) for v in t]
        total += -sum(t[k] * math.log(p[i][k]) for k in range(4))
    assert loss == pytest.approx(total / 3, rel=1e-6)
    for k in (0, 1):  # old rows: no gradient, no decay at weight_decay 0
        assert torch.equal(after.head.fc.weight[k], before.head.fc.weight[k])
        assert after.head.fc.bias[k] == before.head.fc.bias[k]
    assert after.head.fc.bias[3] < before.head.fc.bias[3]  # the unseen unit trains (pushed down)


def test_the_convnextv2_protocols_take_the_published_head_and_the_others_keep_the_grown_one():
    from bench_stability_gap.harness.spec.protocol import builtin_protocol_names

    for name in builtin_protocol_names():
        p = load_protocol(name)
        expected = "full" if p.backbone.model == "convnextv2_femto" else None
        assert p.backbone.head_units == expected, name
