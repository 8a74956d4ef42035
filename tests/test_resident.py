"""Trunk features kept on the device or streamed to it ahead: the choice follows the declared margin,
and every path gives the evaluation today's path gives (the same rows, the same accuracies).

No GPU here: the device's memory report is the only thing mocked (the boundary of an unavailable GPU);
the stores, shards and evaluation are the real ones, on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench_stability_gap.harness.data import inputs as IN
from bench_stability_gap.harness.data import resident as R
from bench_stability_gap.harness.data.inputs import InputStore, Preprocess
from bench_stability_gap.harness.data.sources import ArraySplit
from bench_stability_gap.harness.data.stream import Catalog
from bench_stability_gap.harness.run.evaluation import EvalPlan, evaluate
from bench_stability_gap.harness.spec.protocol import load_protocol

GiB = 2**30


def test_features_stay_on_the_device_only_with_the_declared_margin_left(monkeypatch):
    # 80 GiB device: the margin is 10 % of it (8 GiB), more than the 2 GiB floor
    assert R.fits_device(62 * GiB, 70 * GiB, 80 * GiB)
    assert not R.fits_device(62 * GiB + 1, 70 * GiB, 80 * GiB)
    # 10 GiB device: 10 % is 1 GiB, so the 2 GiB floor applies
    assert R.fits_device(6 * GiB, 8 * GiB, 10 * GiB) and not R.fits_device(6 * GiB + 1, 8 * GiB, 10 * GiB)

    assert R.placement(1, torch.device("cpu")) == "host"  # the CPU reads rows when asked, as before
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GiB, 80 * GiB))
    cuda = torch.device("cuda", 0)
    assert R.placement(62 * GiB, cuda) == "resident" and R.placement(62 * GiB + 1, cuda) == "streamed"


class _Bf16Trunk(nn.Module):
    """A trunk whose features come out in bf16, as under CUDA autocast: shards store them in bf16."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 4, 3, stride=4, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).to(torch.bfloat16)


def _catalog(n: int) -> Catalog:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, n)
    split = ArraySplit(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), labels, [str(k) for k in range(5)])
    return Catalog((split,), labels.astype(np.int64))


def _store(catalog: Catalog, trunk: nn.Module, cache, mode: str = "trunk-disk", device: str = "cpu") -> InputStore:
    return InputStore(catalog, Preprocess(load_protocol("tiny_cil").backbone), trunk.to(device), torch.device(device),
                      cache_key="resident-test", cache_root=cache, chunk=16, progress=False, mode=mode)


def _plan(catalog: Catalog) -> EvalPlan:
    labels = catalog.labels
    old = labels < 3
    return EvalPlan(ids=np.arange(len(labels))[::-1].copy(), labels=torch.from_numpy(labels[::-1].copy()), old=old[::-1],
                    new=~old[::-1], task=(~old[::-1]).astype(np.int64), tasks=2)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (ci/gpu_checks.sh runs it)")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
@pytest.mark.parametrize("mode", ["trunk-disk", "trunk-ram"])
def test_resident_and_streamed_features_evaluate_as_todays_path(tmp_path, monkeypatch, mode, device):
    catalog, trunk = _catalog(90), _Bf16Trunk()
    torch.manual_seed(1)
    body = nn.Sequential(nn.Flatten(), nn.Linear(4 * 8 * 8, 5)).to(device)
    plan = _plan(catalog)  # ids in reverse: batches cross shards and are not in storage order
    monkeypatch.setattr("bench_stability_gap.harness.data.features.SHARD_BYTES", 4 * 8 * 8 * 2 * 25)  # 25 rows a shard

    def run(store: InputStore) -> tuple[tuple, torch.Tensor]:
        seen: list[torch.Tensor] = []

        def predict(x: torch.Tensor) -> torch.Tensor:
            seen.append(x)
            return body(x)

        acc = evaluate(predict, store, plan, 32, chunk=32)
        return (acc.old, acc.new, acc.all, acc.tasks, acc.predicted.tolist()), torch.cat(seen)

    monkeypatch.setattr(IN, "placement", lambda nbytes, device: "host")  # today's path: float32 rows from the host
    today = _store(catalog, trunk, tmp_path, mode, device)
    assert today.shards is not None or today.table.dtype == torch.float32
    expected, rows = run(today)
    assert rows.dtype == torch.float32

    # resident: the placement says it fits, so the whole table moves once, in the dtype it is stored in
    monkeypatch.setattr(IN, "placement", lambda nbytes, device: "resident")
    resident = _store(catalog, trunk, tmp_path, mode, device)
    assert resident.shards is None and resident.table.dtype == torch.bfloat16
    assert resident.table.device.type == device
    got, got_rows = run(resident)
    assert got == expected and torch.equal(got_rows, rows)

    # streamed: the evaluation's batches announced, read ahead in the stored dtype and converted on arrival
    monkeypatch.setattr(IN, "placement", lambda nbytes, device: "streamed")
    streamed = _store(catalog, trunk, tmp_path, "trunk-disk", device)
    served: list[int] = []

    class Counted(R.RowsAhead):
        def close(self) -> None:
            served.append(self.taken)
            super().close()

    monkeypatch.setattr(IN, "RowsAhead", Counted)
    monkeypatch.setattr(streamed, "read_ahead", lambda batches: InputStore.read_ahead(streamed, batches, on_cpu=True))
    got, got_rows = run(streamed)
    assert served == [3]  # all three batches (32, 32, 26 rows) came from the read-ahead
    assert got == expected and torch.equal(got_rows, rows)


def test_a_read_that_is_not_the_announced_batch_is_read_as_usual(tmp_path):
    catalog = _catalog(40)
    store = _store(catalog, _Bf16Trunk(), tmp_path)
    ahead = R.RowsAhead(store.shards, [np.arange(10), np.arange(10, 20)], torch.device("cpu"))
    try:
        assert ahead.take(np.arange(5)) is None  # not the next announced batch
        assert torch.equal(ahead.take(np.arange(10)), store.shards.read(np.arange(10)))
        assert torch.equal(ahead.take(np.arange(10, 20)), store.shards.read(np.arange(10, 20)))
        assert ahead.take(np.arange(20, 30)) is None and ahead.taken == 2
    finally:
        ahead.close()


@CUDA
def test_on_cuda_a_small_eval_set_is_placed_on_the_device_by_the_real_memory_report(tmp_path):
    store = _store(_catalog(40), _Bf16Trunk(), tmp_path, "trunk-disk", "cuda")
    assert store.shards is None and store.table.device.type == "cuda" and store.table.dtype == torch.bfloat16
