"""ER-ACE (methods/er_ace.py), whose loss depends on which samples are new (``TrainBatch.is_new``) and on
the head's layout: eq. 4-5 of Caccia et al. (ICLR 2022) pinned on hand-computed toy batches."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.methods.base import TrainBatch
from support import invoke


def batch(y: list[int], new: list[bool]) -> TrainBatch:
    return TrainBatch(torch.zeros(len(y), 1), torch.tensor(y), np.arange(len(y)), torch.tensor(new))


def test_new_samples_compete_only_with_their_own_classes_old_ones_with_all():
    _, method = build_method("er_ace", "tiny_cil")
    # two new samples (classes 2 and 3 in the batch) and one replayed sample of class 0, 4 classes seen
    logits3 = torch.tensor([[5.0, 5.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]])
    b3 = batch([2, 3, 0], [True, True, False])
    got = method.loss(b3, logits3, b3.y)
    new_a = math.log(1 + math.exp(-1.0))         # classes {2, 3}: logits 1 vs 0, target 2
    new_b = math.log(1 + math.exp(-2.0))         # logits 0 vs 2, target 3
    old = math.log(4.0)                          # all four classes, equal logits
    assert float(got) == pytest.approx((new_a + new_b + old) / 3, rel=1e-6)
    # the same batch seen as all-old is plain cross-entropy: the loss depends on is_new
    plain = torch.nn.functional.cross_entropy(logits3, b3.y)
    assert float(method.loss(batch([2, 3, 0], [False] * 3), logits3, b3.y)) == pytest.approx(float(plain))


def test_soft_targets_on_masked_classes_are_dropped_and_renormalised():
    _, method = build_method("er_ace", "tiny_cil")
    logits = torch.tensor([[5.0, 5.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]], requires_grad=True)
    b = batch([2, 3], [True, True])
    soft = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.2, 0.0, 0.0, 0.8]])  # mass on class 0, masked for both
    loss = method.loss(b, logits, soft)
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(-2.0))) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[:, :2].abs().sum()) == 0.0


def test_the_loss_is_one_named_term_and_defaults_are_the_standard_steps():
    _, method = build_method("er_ace", "tiny_cil")
    b = batch([2, 0], [True, False])
    assert list(method.loss_terms(b, torch.zeros(2, 4), b.y)) == ["asymmetric_cross_entropy"]
    assert method.config.lr == 1e-3 and method.config.mask == "batch"
    assert build_method("er_ace", "tiny_cil", {"lr": 5e-4})[1].config.lr == 5e-4  # --set wins


def test_session_mask_lets_new_samples_compete_with_every_class_of_the_session():
    _, method = build_method("er_ace", "tiny_cil", {"mask": "session"})
    method.session_classes = torch.tensor([1, 2, 3])
    logits = torch.tensor([[9.0, 0.0, 1.0, 0.0]])  # class 0 (old) masked out, 1 and 3 (session) kept
    got = method.loss(batch([2], [True]), logits, torch.tensor([2]))
    assert float(got) == pytest.approx(-math.log(math.e / (1 + math.e + 1)), rel=1e-6)


@pytest.mark.slow  # two whole check-method runs (about a minute each on a shared 2-core machine)
def test_er_ace_passes_check_method_alone_and_with_sgm(check_benches_once):
    for text in ("er_ace", "er_ace+sgm"):
        out = invoke("check-method", text)
        assert out.exit_code == 0, out.output
        assert out.output.count("PASS") == 7 and f"{text}: passes the contract." in out.output


def _session_on_a_full_head(method, monkeypatch, seen: int) -> None:
    """``begin_session`` of a session after which ``seen`` classes are known, on a head that holds more units
    (``backbone.head_units: full``); the standard step's part (optimizer, modifiers) needs a model: skipped."""
    from bench_stability_gap.harness.data.stream import Session
    from bench_stability_gap.methods.base import StandardMethod

    monkeypatch.setattr(StandardMethod, "begin_session", lambda self, session: None)
    method.begin_session(Session(index=2, train_ids=np.arange(2), classes=np.array([2, 3]),
                                 new_classes=np.array([2, 3]), seen_classes=seen))


def test_on_a_full_head_replayed_samples_compete_with_the_seen_classes_only(monkeypatch):
    """A 30-unit head after 4 classes are seen (0-1 before the session, 2-3 in it): the replayed sample's
    cross-entropy runs over units 0-3 (eq. 5's C_old u C_curr), not over the 26 units of classes to come,
    which hold the largest logits here."""
    _, method = build_method("er_ace", "tiny_cil")
    _session_on_a_full_head(method, monkeypatch, seen=4)
    logits = torch.full((1, 30), 2.0)
    logits[0, :4] = torch.tensor([0.0, 1.0, 0.0, 0.0])
    b = batch([1], [False])
    seen = math.log(3 + math.e) - 1.0                     # -log(e / (1 + e + 1 + 1))
    every_unit = math.log(3 + math.e + 26 * math.e ** 2) - 1.0
    assert float(method.loss(b, logits, b.y)) == pytest.approx(seen, rel=1e-6)
    # the other reading, a switch: every head unit (Mammoth's er_ace), 2.3 nats more on this toy
    _, every = build_method("er_ace", "tiny_cil", {"replay_classes": "all"})
    _session_on_a_full_head(every, monkeypatch, seen=4)
    assert float(every.loss(b, logits, b.y)) == pytest.approx(every_unit, rel=1e-6)
    assert every_unit - seen > 2.0


def test_replayed_soft_targets_on_classes_not_seen_yet_are_dropped(monkeypatch):
    """SGM's soft targets spread mass over every unit of a full head; a replayed sample keeps the seen
    classes' share, renormalised, and no gradient reaches the units of classes to come."""
    _, method = build_method("er_ace", "tiny_cil")
    _session_on_a_full_head(method, monkeypatch, seen=4)
    logits = torch.zeros(1, 30, requires_grad=True)
    soft = torch.full((1, 30), 0.5 / 29)
    soft[0, 1] = 0.5                                       # half on the true class, the rest uniform
    loss = method.loss(batch([1], [False]), logits, soft)
    assert float(loss.detach()) == pytest.approx(math.log(4.0), rel=1e-6)  # equal logits over 4 seen units
    loss.backward()
    assert float(logits.grad[0, 4:].abs().sum()) == 0.0 and float(logits.grad[0, :4].abs().sum()) > 0
