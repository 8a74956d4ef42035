"""A ComputeEnv sets the process's thread count, kernel set and allocator, and gives back what the process
had when it is left, an exception included and nested in another env; the optimizer it lends follows its
kernel set, and a CUDA run's env leaves the CPU's threads and allocator alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from bench_stability_gap.harness.model import cpu, fastconv
from bench_stability_gap.harness.model.compute import ComputeEnv
from bench_stability_gap.harness.results.comparability import CPU_KERNELS, CPU_THREADS

KEEP = [(-3, 32 << 20), (-1, 1 << 30)]  # mallopt(M_MMAP_THRESHOLD, ...), mallopt(M_TRIM_THRESHOLD, ...)
GLIBC_INITIAL = [(-3, 128 << 10), (-1, 128 << 10)]
START = 2 if CPU_THREADS != 2 else 3  # a thread count the run's pin changes


class _Glibc:
    """Records the allocator settings the process is given, in place of the C library."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return 1


@pytest.fixture
def glibc(monkeypatch) -> Iterator[_Glibc]:
    """A recording allocator and a known start: START threads, the fast set, glibc's own thresholds."""
    fake = _Glibc()
    monkeypatch.setattr(cpu, "LIBC", fake)
    threads = torch.get_num_threads()
    try:
        with ComputeEnv(threads=START, kernels="fast", keep_freed=False):
            fake.calls.clear()
            yield fake
    finally:
        torch.set_num_threads(threads)


def _state() -> tuple[int, str, bool | None, bool]:
    """(threads, kernel set, freed memory kept, whether the rewritten convolutions compute with the fast set)."""
    now = ComputeEnv.now()
    return torch.get_num_threads(), now.kernels, now.keep_freed, fastconv._fast(torch.zeros(1))


def _fused(env: ComputeEnv) -> bool:
    return env.optimizer([{"params": [torch.nn.Parameter(torch.zeros(3))]}]).defaults.get("fused") is True


def test_an_env_gives_the_process_back_its_threads_kernels_and_allocator_after_an_exception(glibc):
    assert _state() == (START, "fast", False, True)
    with pytest.raises(RuntimeError, match="inside the run"):
        with ComputeEnv.for_run(torch.device("cpu"), "stock"):
            assert _state() == (CPU_THREADS, "stock", True, False)
            assert glibc.calls == KEEP
            raise RuntimeError("inside the run")
    assert _state() == (START, "fast", False, True)
    assert glibc.calls == KEEP + GLIBC_INITIAL


def test_two_envs_nest_each_giving_back_what_it_found(glibc):
    outer = ComputeEnv(torch.device("cpu"), kernels="stock", threads=START + 1, keep_freed=True)
    inner = ComputeEnv.for_run(torch.device("cpu"), "fast")
    with outer:
        assert _state() == (START + 1, "stock", True, False) and not _fused(outer)
        with inner:
            assert _state() == (CPU_THREADS, "fast", True, True) and _fused(inner)
            with outer:  # the same env entered again nests as well
                assert _state() == (START + 1, "stock", True, False)
            assert _state() == (CPU_THREADS, "fast", True, True)
        assert _state() == (START + 1, "stock", True, False)
    assert _state() == (START, "fast", False, True)
    assert glibc.calls == KEEP + GLIBC_INITIAL  # kept once by the outer env, given back once as it is left


def test_a_cuda_run_leaves_the_cpu_threads_and_allocator_alone_and_records_no_kernel_label(glibc):
    cuda = ComputeEnv.for_run(torch.device("cuda"), "stock", "bf16")
    with cuda:
        assert _state() == (START, "stock", False, False)
        assert cuda.thread_count == START and cuda.kernel_label is None and cuda.precision == "bf16"
    assert _state() == (START, "fast", False, True) and glibc.calls == []
    run = ComputeEnv.for_run(torch.device("cpu"))
    assert run.thread_count == CPU_THREADS and run.kernel_label == CPU_KERNELS and _fused(run)


def test_an_unknown_kernel_set_or_precision_is_refused_before_anything_is_set():
    with pytest.raises(ValueError, match="cpu_kernels 'turbo'"):
        ComputeEnv.for_run(torch.device("cpu"), "turbo")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        ComputeEnv.for_run(torch.device("cpu"), precision="fp8")
