"""No training update waits for the device. A host read of a CUDA tensor's value (``float``, ``bool``,
``.item()``, boolean-mask indexing, ``bincount``...) waits for every kernel queued before it; once per
update, it makes a small model's update cost its kernels' launch latency and leaves the GPU idle while the
host prepares the next batch. The continual loop reads the losses and checks the weights where it waits
anyway (eval points, checkpoints, a session's end); the batch and the paper's methods read nothing.

On the CPU every host read is seen by a torch function mode, with the line that made it; on CUDA
(``ci/gpu_checks.sh``) torch's sync debug mode turns any synchronising call of an update into an error."""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from bench_stability_gap.harness.run import continual
from bench_stability_gap.harness.run.update_reads import UpdateReads

# reading a value, or an op whose output size is a value (the host must learn it before it can go on)
READS = {"__float__", "__int__", "__bool__", "__index__", "item", "tolist", "numpy", "cpu", "nonzero", "argwhere",
         "bincount", "unique", "unique_consecutive", "masked_select", "repeat_interleave"}
INDEXING = {"__getitem__", "__setitem__", "index_put", "index_put_"}
ROOT = Path(continual.__file__).resolve().parents[2]  # the repository (the package's root)
THIS, OVERRIDES = Path(__file__).name, ("torch/overrides.py", "torch/_tensor.py", "torch/utils/_device.py")


def _boolean_index(args: tuple) -> bool:
    index = args[1] if len(args) > 1 else ()
    index = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _site() -> str:
    """The line outside torch's dispatch and this file that made the call: a path in the repository (or in
    site-packages), wherever the checkout is."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.endswith(THIS) and not frame.filename.endswith(OVERRIDES):
            path = Path(frame.filename)
            name = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else \
                frame.filename.split("site-packages/")[-1]
            return f"{name}:{frame.lineno}"
    return "?"


class HostReads(TorchFunctionMode):
    """Counts the host reads of tensor values made inside it, by kind and line."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: Counter = Counter()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in READS or (name in INDEXING and _boolean_index(args)):
            self.sites[(name, _site())] += 1
        return func(*args, **(kwargs or {}))


def bench_reads(sites: Counter) -> Counter:
    """The reads bench's own code makes. A non-capturable torch optimizer keeps its step counter as a host
    tensor on every device and reads it there: that read never waits for a GPU."""
    return Counter({k: n for k, n in sites.items() if "torch/optim/" not in k[1]})


def audit_updates(monkeypatch: pytest.MonkeyPatch, methods: set[str]) -> list[Counter]:
    """Every continual update from now on runs under ``HostReads``: bench's reads of each, in order; the
    labels of the methods that made them are added to ``methods``."""
    per_update: list[Counter] = []
    real_update = continual.ContinualRun.update

    def update(self: continual.ContinualRun, u: int, batch: Any) -> None:
        with HostReads() as seen:
            real_update(self, u, batch)
        per_update.append(bench_reads(seen.sites))
        methods.add(self.method.label)

    monkeypatch.setattr(continual.ContinualRun, "update", update)
    return per_update


def test_the_mode_sees_each_kind_of_read_with_its_line() -> None:
    x, mask = torch.arange(4.0), torch.tensor([True, False, True, False])
    with HostReads() as seen:
        float(x[0]), bool(mask.any()), x[mask], x.tolist(), torch.bincount(x.long())
        x[mask] = 0.0
        torch.where(mask, x, 0.0), x[torch.tensor([0, 2])]  # chosen on the device: no read
    assert sorted(kind for kind, _ in seen.sites) == ["__bool__", "__float__", "__getitem__", "__setitem__",
                                                     "bincount", "tolist"]


def test_no_update_of_the_papers_methods_reads_a_device_value(tiny_protocol_file, results_with_joint, monkeypatch):
    from bench_stability_gap.harness.api import run

    methods: set[str] = set()
    per_update = audit_updates(monkeypatch, methods)
    settles: list[int] = []
    real_settle = continual.ContinualRun.settle

    def settle(self):
        settles.append(len(self.reads.losses))
        return real_settle(self)

    monkeypatch.setattr(continual.ContinualRun, "settle", settle)
    result = run(str(tiny_protocol_file), "vanilla+sgm", 0, results_dir=results_with_joint, mlflow=False, device="cpu")
    assert methods == {"vanilla", "vanilla+sgm"}  # vanilla is the protocol's A_best reference: trained first
    updates = len(per_update)  # this run's, and those of the A_best reference runs it trains first
    assert updates >= sum(c.total_updates for c in result.curves) > 0
    assert sum(per_update, Counter()) == Counter(), sum(per_update, Counter()).most_common(5)
    # every loss was read, in fewer reads than updates, and the curve holds them all in order
    assert sum(settles) == updates and 0 < sum(n > 0 for n in settles) < updates
    assert [len(c.loss) for c in result.curves] == [c.total_updates for c in result.curves]


def test_online_sgm_reads_the_device_only_when_a_class_first_arrives(tmp_path, bench_cache, monkeypatch):
    """Online, SGM's init writes a class's output row from its first samples: that (a forward pass and its
    scale) reads the device, once a class; the update that only trains reads nothing."""
    import yaml

    from bench_stability_gap.harness.api import run
    from bench_stability_gap.harness.tools.check_method import reduced_spec

    spec = reduced_spec("tiny_online_500")
    for data in spec["stream_data"]:
        data.update(train_per_class=3, test_per_class=2)
    spec["eval"] = {"every": 100, "dense_every": 100, "dense_until": 0, "batch_size": 256}
    spec["best_new_reference"] = ["vanilla+sgm"]  # the run is its own A_best reference: no other run first
    spec["training"].update(updates="per_sample", batch={"new": 1, "old": 8})
    path = tmp_path / "tiny_online_reduced.yaml"
    path.write_text(yaml.safe_dump(spec))
    reads = audit_updates(monkeypatch, set())
    run(str(path), "vanilla+sgm", 0, results_dir=tmp_path / "r", mlflow=False, device="cpu", cpu_kernels="stock")
    with_reads = [c for c in reads if c]
    assert len(reads) > 40 and 0 < len(with_reads) <= 20  # at most once per stream class (4 sessions x 5)
    assert {site.split(":")[0] for c in with_reads for _, site in c} <= {"methods/sgm/init.py"}


def test_the_kept_losses_read_back_as_the_floats_of_each_update() -> None:
    reads = UpdateReads()
    values = [torch.tensor(1.1), torch.tensor(2.7, dtype=torch.bfloat16), 0.5, torch.tensor(float("nan"))]
    for u, v in enumerate(values):
        reads.add(u, v)
    assert reads.due(99) is False and reads.due(100) is True
    read = reads.read()
    assert [u for u, _ in read] == [0, 1, 2, 3] and reads.losses == []
    assert read[:3] == [(0, float(values[0])), (1, float(values[1])), (2, 0.5)] and read[3][1] != read[3][1]


def test_a_read_widens_the_kept_losses_once_not_once_per_update() -> None:
    """On CUDA each widening is a kernel launch: 100 losses cost 100 of them if widened one by one."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Kernels(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    reads = UpdateReads()
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    losses = [torch.tensor(u / 7, dtype=dtypes[u % 3]) for u in range(100)]
    for u, loss in enumerate(losses):
        reads.add(u, loss)
    with Kernels() as kernels:
        read = reads.read()
    assert read == [(u, float(loss)) for u, loss in enumerate(losses)]
    computing = [n for n in kernels.names if n not in ("detach.default", "view.default")]
    assert computing == ["stack.default", "_to_copy.default"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (ci/gpu_checks.sh runs it)")
def test_on_cuda_no_update_synchronises(tiny_protocol_file, tmp_path, monkeypatch):
    """vanilla+sgm and its A_best reference run, vanilla: any synchronising call in an update raises."""
    from bench_stability_gap.harness.api import run

    real_update, methods = continual.ContinualRun.update, set()

    def update(self, u, batch):
        torch.cuda.set_sync_debug_mode("error")
        try:
            real_update(self, u, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        methods.add(self.method.label)

    monkeypatch.setattr(continual.ContinualRun, "update", update)
    result = run(str(tiny_protocol_file), "vanilla+sgm", 0, results_dir=tmp_path / "r", mlflow=False, device="cuda")
    assert methods == {"vanilla", "vanilla+sgm"} and result.status == "complete"
