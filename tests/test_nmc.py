"""The nearest-mean head (methods/nmc.py, ``+nmc``): predictions from known means, the means of known
features by hand, and the combinations it refuses with the reason (exit 2)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.methods.nmc import NearestMeanHead, nmc_scores
from bench_stability_gap.methods.registry import build_method
from support import invoke


def test_the_nearest_normalised_mean_wins_and_a_class_without_samples_never_does():
    features = torch.tensor([[3.0, 4.0]])                      # phi = (.6, .8)
    means = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8]])
    scores = nmc_scores(features, means, torch.tensor([True, True, False]))
    # -||phi - mu||^2: class 0 .16 + .64 = .8, class 1 .36 + .04 = .4; class 2 (no sample held) the lowest float
    assert scores[0, :2].tolist() == pytest.approx([-0.8, -0.4], abs=1e-6)
    assert float(scores[0, 2]) == torch.finfo(torch.float32).min and int(scores.argmax()) == 1


class Embedder(nn.Module):
    """embed = identity on 2-d inputs; a 3-class head (as the harness's SplitModel has)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = SimpleNamespace(num_classes=3, fc=nn.Linear(2, 3))

    def embed(self, x):
        return x


def test_means_come_from_the_memory_and_the_session_capped_per_class_in_id_order():
    inputs = {0: [2.0, 0.0], 1: [0.0, 2.0], 2: [9.0, 9.0], 3: [0.0, -1.0], 4: [5.0, 5.0]}
    labels = np.array([0, 0, 0, 1, 1])
    counters: dict = {}
    ctx = SimpleNamespace(memory=SimpleNamespace(ids=(0, 1, 2)), counters=counters, device=torch.device("cpu"),
                          inputs=SimpleNamespace(current=np.array([3, 4]),
                                                 get=lambda ids: torch.tensor([inputs[int(i)] for i in ids])),
                          stream=SimpleNamespace(train=SimpleNamespace(labels=labels)),
                          protocol=SimpleNamespace(training=SimpleNamespace(online=False)))
    nmc = NearestMeanHead(NearestMeanHead.Config(per_class=2))
    nmc.refresh(SimpleNamespace(model=Embedder(), ctx=ctx))
    # class 0: ids 0, 1 (id 2 is past the cap) -> unit (1,0), (0,1) -> mean (.5,.5) -> (.7071, .7071)
    # class 1: ids 3, 4 (the session in progress) -> (0,-1), (.7071,.7071) -> mean renormalised
    r = 0.5 ** 0.5
    second = torch.tensor([r, r - 1.0]) / torch.tensor([r, r - 1.0]).norm()
    assert torch.allclose(nmc.means[0], torch.tensor([r, r]), atol=1e-6)
    assert torch.allclose(nmc.means[1], second, atol=1e-6)
    assert nmc.present.tolist() == [True, True, False] and counters["nmc_mean_forward_samples"] == 4
    ctx.protocol.training.online = True  # online: the memory only (arrivals are added to it)
    nmc.refresh(SimpleNamespace(model=Embedder(), ctx=ctx))
    assert nmc.present.tolist() == [True, False, False]


@pytest.mark.parametrize(("text", "protocol", "reason"), [
    ("vanilla+nmc+oocf", "tiny_cil", r"oocf acts on the linear head's output rows"),
    ("vanilla+nmc+sgm", "tiny_cil", r"init, oocf \(inside sgm"),
    ("lwf+nmc", "tiny_cil", r"method 'lwf' replays nothing"),
    ("vanilla+nmc", "tiny_cil_norehearsal", r"stores nothing \(memory.policy: none\)"),
    ("remind+nmc", "tiny_cil", r"predicts in its own way"),
])
def test_combinations_that_cannot_work_are_refused_with_the_reason(text, protocol, reason):
    with pytest.raises(BenchError, match=reason):
        build_method(text, protocol)


def test_what_composes_builds_and_sgm_without_its_head_parts_too():
    assert build_method("derpp+nmc+lora+soft", "tiny_cil")[1].label == "derpp+nmc+lora+soft"
    build_method("er_ace+nmc+sgm", "tiny_cil", {"sgm.use": ["soft", "lora", "onecycle"]})


def test_the_cli_refuses_with_exit_2_before_anything_trains(tmp_path):
    out = invoke("run", "--protocol", "tiny_cil", "--method", "vanilla+nmc+sgm", "--results-dir", str(tmp_path))
    assert out.exit_code == 2 and "nmc" in out.output and "oocf" in out.output
    assert not any(tmp_path.rglob("*.json"))
