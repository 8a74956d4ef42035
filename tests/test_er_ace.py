"""The second example plugin (tests/plugin_er_ace): ER-ACE, whose loss depends on which samples are
new (``TrainBatch.is_new``) and on the head's layout, and which ships its own per-protocol defaults."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.methods.base import TrainBatch
from tests.test_plugins import install_folder, invoke, site  # noqa: F401 - site is a fixture

PLUGIN = Path(__file__).parent / "plugin_er_ace"


@pytest.fixture()
def er_ace(site, monkeypatch):
    yield install_folder(site, PLUGIN, monkeypatch)
    sys.modules.pop("bench_er_ace", None)


def batch(y: list[int], new: list[bool]) -> TrainBatch:
    return TrainBatch(torch.zeros(len(y), 1), torch.tensor(y), np.arange(len(y)), torch.tensor(new))


def test_new_samples_compete_only_with_their_own_classes_old_ones_with_all(er_ace):
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


def test_soft_targets_on_masked_classes_are_dropped_and_renormalised(er_ace):
    _, method = build_method("er_ace", "tiny_cil")
    logits = torch.tensor([[5.0, 5.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0]], requires_grad=True)
    b = batch([2, 3], [True, True])
    soft = torch.tensor([[0.5, 0.0, 0.5, 0.0], [0.2, 0.0, 0.0, 0.8]])  # mass on class 0, masked for both
    loss = method.loss(b, logits, soft)
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(-2.0))) / 2
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[:, :2].abs().sum()) == 0.0


def test_the_plugin_ships_its_own_defaults_chosen_by_protocol_properties(er_ace):
    _, method = build_method("er_ace", "tiny_cil")
    assert method.config.lr == 2e-3  # its when rule: EfficientNet-Lite0
    renamed = load_protocol("tiny_online_500").model_copy(update={"name": "my_copy"})
    assert build_method("er_ace", renamed)[1].config.lr == 2e-3
    assert build_method("er_ace", "cil_places_lt")[1].config.lr == 1e-3  # its default
    assert build_method("er_ace", "tiny_cil", {"lr": 5e-4})[1].config.lr == 5e-4  # --set wins


def test_er_ace_passes_check_method_alone_and_with_sgm(er_ace, bench_cache):
    for text in ("er_ace", "er_ace+sgm"):
        out = invoke("check-method", text)
        assert out.exit_code == 0, out.output
        assert out.output.count("PASS") == 5 and f"{text}: passes the contract." in out.output
