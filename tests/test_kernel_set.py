"""The CPU kernel set's label is derived from the kernel code and the torch/timm releases (never written
by hand), a run can choose PyTorch's stock kernels instead, and runs of different sets never mix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness.model.compute import ComputeEnv, cpu_settings_restored
from bench_stability_gap.harness.model.fastconv import PointwiseConvAsGemm, gemm_pointwise_convs
from bench_stability_gap.harness.results.comparability import (
    CPU_KERNELS,
    CPU_THREADS,
    KERNEL_MODULES,
    LEGACY_KERNELS,
    code_digest,
    cpu_problem,
    kernel_label,
    select_runs,
)
from bench_stability_gap.harness.results.schema import library_versions


def _copies(tmp_path: Path) -> tuple[Path, ...]:
    return tuple(Path(shutil.copy(p, tmp_path / p.name)) for p in KERNEL_MODULES)


def test_editing_the_kernel_code_changes_the_label_and_editing_its_prose_or_bare_annotations_does_not(tmp_path):
    copies = _copies(tmp_path)
    assert code_digest(copies) == code_digest()  # the copy is the live code
    conv = copies[0]
    source = conv.read_text()
    conv.write_text(source.replace('"""Faster CPU kernels', '"""Reworded: faster CPU kernels', 1)
                    .replace("SMALL_MAP_PIXELS = 4  #", "SMALL_MAP_PIXELS = 4  # reworded comment;"))
    assert code_digest(copies) == code_digest()
    # a type declared for the checker alone runs nothing: the label stays
    conv.write_text(source.replace("SMALL_MAP_PIXELS = 4", "SMALL_MAP_PIXELS: int\nSMALL_MAP_PIXELS = 4", 1))
    assert code_digest(copies) == code_digest()
    conv.write_text(source.replace("SMALL_MAP_PIXELS = 4", "SMALL_MAP_PIXELS = 9"))
    assert code_digest(copies) != code_digest()
    other = kernel_label("fast", code_digest(copies))
    assert other != CPU_KERNELS and other.split("-")[2:] == CPU_KERNELS.split("-")[2:]  # same torch and timm


def test_the_label_names_the_set_and_the_torch_and_timm_releases():
    versions = library_versions()
    assert CPU_KERNELS == f"fast-{code_digest()}-torch{versions['torch']}-timm{versions['timm']}"
    assert kernel_label("stock") == f"stock-torch{versions['torch']}-timm{versions['timm']}"
    with pytest.raises(ValueError, match="cpu_kernels 'turbo'"):
        kernel_label("turbo")


def _on(run, kernels_label: str | None, torch_version: str | None = None):
    run.options = {"device": "cpu", "torch_threads": CPU_THREADS,
                   **({"cpu_kernels": kernels_label} if kernels_label is not None else {})}
    if torch_version is not None:
        run.versions = {**run.versions, "torch": torch_version}
    return run


def test_runs_of_another_torch_release_or_the_other_set_are_set_apart_and_the_legacy_label_still_counts():
    versions = library_versions()
    legacy = next(iter(LEGACY_KERNELS))
    other_torch = CPU_KERNELS.replace(f"torch{versions['torch']}", "torch2.0.0")
    runs = [_on(joint_run("j-fast", seed=0), CPU_KERNELS), _on(joint_run("j-stock", seed=1), kernel_label("stock")),
            _on(two_session_run("r-fast"), CPU_KERNELS), _on(two_session_run("r-stock"), kernel_label("stock")),
            _on(two_session_run("r-torch", seed=1), other_torch),
            _on(two_session_run("r-legacy", seed=2), legacy, versions["torch"]),
            _on(two_session_run("r-legacy-old-torch", seed=3), legacy, "2.0.0")]
    for r in runs:
        r.versions = {**versions, **{k: v for k, v in r.versions.items() if k == "torch"}}
    fast = select_runs(runs, "h" * 16, ["vanilla"])
    assert {s: r.run_id for s, r in fast.joints.items()} == {0: "j-fast"}
    assert sorted(r.run_id for r in fast.runs.values()) == ["r-fast", "r-legacy"]
    apart = {r.run_id: why for r, why in fast.apart}
    assert set(apart) == {"j-stock", "r-stock", "r-torch", "r-legacy-old-torch"}
    assert "torch2.0.0" in apart["r-torch"] and repr(CPU_KERNELS) in apart["r-torch"]
    stock = select_runs(runs, "h" * 16, ["vanilla"], kernels="stock")
    assert {s: r.run_id for s, r in stock.joints.items()} == {1: "j-stock"}
    assert sorted(r.run_id for r in stock.runs.values()) == ["r-stock"]


def test_a_torch_free_host_compares_the_parts_it_knows(monkeypatch):
    from bench_stability_gap.harness.results import comparability

    unknown = comparability.kernel_label("fast", versions={})  # what a host without torch and timm computes
    assert unknown.endswith("-torch?-timm?")
    monkeypatch.setattr(comparability, "_label_now", lambda kernels="fast": unknown)
    assert cpu_problem({"device": "cpu", "torch_threads": CPU_THREADS, "cpu_kernels": CPU_KERNELS}) is None
    assert cpu_problem({"device": "cpu", "torch_threads": CPU_THREADS,
                        "cpu_kernels": CPU_KERNELS.replace(code_digest(), "0" * 12)}) is not None


def test_the_stock_set_computes_with_pytorchs_kernels_and_a_library_call_restores_the_process():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(torch.nn.Conv2d(96, 160, 1))  # big enough that the two sums differ
    stock_conv = [m for m in conv.modules()][1]
    x = torch.randn(16, 96, 4, 4)
    weight, bias = stock_conv.weight, stock_conv.bias
    gemm_pointwise_convs(conv)
    assert any(isinstance(m, PointwiseConvAsGemm) for m in conv.modules())
    threads = torch.get_num_threads()
    torch.set_num_threads(CPU_THREADS)
    assert not torch.equal(conv(x), torch.nn.functional.conv2d(x, weight, bias))  # the fast set: another sum
    torch.set_num_threads(2)
    try:
        with cpu_settings_restored():
            stock = ComputeEnv.for_run(torch.device("cpu"), "stock")
            stock.apply()
            assert ComputeEnv.now().kernels == "stock" and torch.get_num_threads() == CPU_THREADS
            # PyTorch's convolution, bit for bit (under the same thread count)
            assert torch.equal(conv(x), torch.nn.functional.conv2d(x, weight, bias))
            opt = stock.optimizer([{"params": list(conv.parameters())}])
            assert not opt.defaults.get("fused")
        assert ComputeEnv.now().kernels == "fast" and torch.get_num_threads() == 2
        assert ComputeEnv.now().optimizer([{"params": list(conv.parameters())}]).defaults.get("fused") is True
    finally:
        torch.set_num_threads(threads)
        ComputeEnv(kernels="fast").apply()
