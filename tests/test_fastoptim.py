"""The standard step's AdamW: fused on the CPU, the same update as the stock one to float rounding."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.model.fastoptim import adamw
from bench_stability_gap.methods.registry import build_method


def _steps(fused_groups: bool) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(7))]
    groups = [{"params": [params[0]], "lr": 1e-2, "weight_decay": 0.05},
              {"params": [params[1]], "lr": 3e-3, "weight_decay": 0.0, "betas": (0.85, 0.99)}]
    opt = adamw(groups) if fused_groups else torch.optim.AdamW(groups)
    for step in range(5):
        opt.zero_grad()
        loss = (params[0] ** 2).sum() * (step + 1) + params[1].sin().sum()
        loss.backward()
        opt.step()
    return [p.detach() for p in params]


def test_adamw_is_fused_on_the_cpu_and_takes_the_stock_step():
    assert adamw([{"params": [torch.nn.Parameter(torch.zeros(2))]}]).defaults["fused"] is True
    for fused, stock in zip(_steps(True), _steps(False)):
        assert not torch.equal(fused, torch.zeros_like(fused))
        torch.testing.assert_close(fused, stock, rtol=1e-6, atol=1e-6)


def test_the_standard_step_builds_the_optimizer_of_the_runs_kernel_set():
    from bench_stability_gap.harness.model.backbone import network_or_random_init, split_network
    from bench_stability_gap.harness.spec.protocol import load_protocol

    spec = load_protocol("tiny_cil")
    net, backbone, _ = network_or_random_init(spec, False)
    _, method = build_method("vanilla", spec.name)
    method.model = split_network(net, backbone, 5)
    method.ctx = SimpleNamespace(compute=ComputeEnv.for_run(torch.device("cpu")))
    optimizer, _ = method.build_optimizer(10)
    assert optimizer.defaults["fused"] is True and len(optimizer.param_groups) > 1
    method.ctx = SimpleNamespace(compute=ComputeEnv.for_run(torch.device("cpu"), "stock"))
    assert not method.build_optimizer(10)[0].defaults.get("fused")
