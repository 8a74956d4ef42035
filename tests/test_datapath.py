"""The data path at paper size: a plan before any compute, features sharded on disk, streaming
through the trunk when storing does not fit, and a clear exit 2 (never an allocator traceback)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.data import features as FS
from bench_stability_gap.harness.model.backbone import create_network, split_network
from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.data.datapath import GB, plan_data_path
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import Protocol, load_protocol
from bench_stability_gap.harness.run.workbench import prepare
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.data.stream import build_stream
from support import reduced_tiny


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shards_round_trip_rows_in_any_order_across_shard_boundaries(tmp_path, monkeypatch, dtype):
    monkeypatch.setattr(FS, "SHARD_BYTES", 3 * 2 * 4 * 4)  # 3 rows of 2x4 float32 (6 of bf16) per shard
    feats = torch.randn(20, 2, 4).to(dtype)
    store = FS.write_shards(tmp_path / "f", 20, (feats[i : i + 7] for i in range(0, 20, 7)))
    assert FS.FeatureShards.complete(tmp_path / "f") and store.dtype == str(dtype).split(".")[1]
    assert len(list((tmp_path / "f").glob("shard_*.bin"))) == -(-20 // store.rows_per_shard) > 2
    rows = np.array([19, 0, 7, 3, 3, 12])
    assert torch.equal(store.read(rows), feats.float()[torch.from_numpy(rows)])
    assert torch.equal(store.load_all(), feats.float())
    assert store.nbytes == feats.numel() * feats.element_size()


def test_an_interrupted_pass_leaves_no_cache(tmp_path):
    def batches():
        yield torch.zeros(4, 3)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        FS.write_shards(tmp_path / "f", 8, batches())
    assert not FS.FeatureShards.complete(tmp_path / "f") and list(tmp_path.iterdir()) == []


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_pass(tmp_path):
    stale = tmp_path / "f.tmp999999"  # what SIGKILL leaves: no finally ran
    (stale / "x").mkdir(parents=True)
    said: list[str] = []
    store = FS.open_verified(tmp_path / "f", 4, lambda: iter([torch.ones(4, 2)]), said.append)
    assert torch.equal(store.load_all(), torch.ones(4, 2))
    assert not stale.exists() and said == [f"Removing {stale}, left by an interrupted trunk pass."]


@pytest.fixture(scope="module")
def paper():
    """cil_places_lt's counts (synthetic): 1.34 M training, 57,300 eval images; no image is generated."""
    protocol = load_protocol("cil_places_lt_synthetic")
    torch.manual_seed(0)
    model = split_network(create_network(protocol.backbone), protocol.backbone, None)
    return protocol, build_stream(protocol, 0), model.trunk


def test_paper_size_plan_keeps_the_eval_features_on_disk_and_streams_training(paper, tmp_path, monkeypatch):
    protocol, stream, trunk = paper
    assert len(stream.train) == 1_343_667 and int((stream.test.labels >= 0).sum()) == 57_300
    monkeypatch.setenv("BENCH_RAM_GB", "6")
    monkeypatch.setenv("BENCH_DISK_GB", "100")
    plan = plan_data_path(protocol, stream, trunk, torch.device("cpu"), False, tmp_path, {})
    row = 192 * 14 * 14 * 4  # the frozen part ends after stages.2.downsample (docs/fidelity.md)
    assert plan.feature_shape == (192, 14, 14) and plan.feature_dtype == "float32"
    assert (plan.test.mode, plan.test.disk_bytes, plan.test.ram_bytes) == ("trunk-disk", 57_300 * row, 0)
    assert plan.train.mode == "trunk-stream"  # 25,600 fetches do not pay for a 1.34 M-image pass
    assert plan.resident_bytes < 6 * GB and "trunk-disk" in plan.describe()
    assert plan.as_dict()["test"]["mode"] == "trunk-disk"
    monkeypatch.setenv("BENCH_DISK_GB", "5")  # 8.6 GB of eval features do not fit: stream them too
    assert plan_data_path(protocol, stream, trunk, torch.device("cpu"), False, tmp_path, {}).test.mode == "trunk-stream"


def test_paper_size_catalog_over_the_ram_budget_is_refused_before_compute(paper, tmp_path, monkeypatch):
    protocol, stream, trunk = paper
    monkeypatch.setenv("BENCH_RAM_GB", "0.05")
    with pytest.raises(BenchError, match=r"does not fit the RAM budget.*Nothing was computed.*BENCH_RAM_GB >= "):
        plan_data_path(protocol, stream, trunk, torch.device("cpu"), False, tmp_path, {})
    monkeypatch.setenv("BENCH_RAM_GB", "6")
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "ram")  # 8.6 GB of features pinned to RAM
    with pytest.raises(BenchError, match=r"pins trunk-ram.*eval split.*What would fit: BENCH_TRUNK_CACHE=disk"):
        plan_data_path(protocol, stream, trunk, torch.device("cpu"), False, tmp_path, {})


def test_cli_says_exit_2_before_any_trunk_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BENCH_RAM_GB", "0.05")
    out = CliRunner().invoke(main, ["run", "-p", "cil_places_lt_synthetic", "--no-mlflow", "--no-progress",
                                    "--results-dir", str(tmp_path / "results")], catch_exceptions=False)
    assert out.exit_code == 2 and "does not fit the RAM budget" in out.output
    assert "Traceback" not in out.output and not any((tmp_path / "cache" / "trunk").iterdir())


def _small(bench_cache) -> Protocol:
    spec = reduced_tiny()
    spec["name"] = "datapath_small"
    spec["sessions"] = 2
    return Protocol.model_validate(spec)


def test_streaming_gives_the_features_and_curves_of_the_disk_cache(bench_cache, tmp_path, monkeypatch):
    from bench_stability_gap.methods.registry import build_method
    from bench_stability_gap.harness.run.continual import run_cl

    protocol = _small(bench_cache)
    opts = RunOptions(results_dir=tmp_path, progress=False, log=False)
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "disk")
    disk = prepare(protocol, 0, opts)
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "stream")
    streamed = prepare(protocol, 0, opts)
    assert (disk.test_inputs.kind, disk.train_inputs.kind) == ("trunk-disk", "trunk-disk")
    assert (streamed.test_inputs.kind, streamed.train_inputs.kind) == ("trunk-stream", "trunk-stream")
    ids = np.flatnonzero(disk.stream.test.labels >= 0)[::7]
    # the same trunk in another batch shape: on one intra-op thread oneDNN's reductions differ in the last
    # bits (measured: 3 of 9,280 values off by up to 1.8e-5), so the features agree to float noise
    torch.testing.assert_close(streamed.test_inputs.get(ids), disk.test_inputs.get(ids), rtol=1e-4, atol=1e-4)
    curves = []
    for bench in (disk, streamed):
        _, method = build_method("vanilla", protocol.name)
        c, budget, _ = run_cl(bench, method, 0, opts)
        curves.append(c)
    for a, b in zip(*curves):
        np.testing.assert_allclose(a.all, b.all, atol=0.05)
    # a streaming trunk runs at every fetch: executed trunk passes are fetches, not distinct images
    assert streamed.train_inputs.distinct_seen() == streamed.train_inputs.fetched > disk.train_inputs.distinct_seen()


@pytest.mark.parametrize("augment, mode", [(False, "trunk-ram"), (True, "trunk-stream")])
def test_small_training_sets_stay_in_ram_and_augmentation_streams(bench_cache, tmp_path, augment, mode):
    spec = reduced_tiny(augment=augment)
    protocol = Protocol.model_validate(spec)
    bench = prepare(protocol, 0, RunOptions(results_dir=tmp_path, progress=False, log=False))
    assert bench.data_path.train.mode == bench.train_inputs.kind == mode
    assert bench.data_path.test.mode == "trunk-ram"
    x = bench.train_inputs.get(bench.stream.sessions[0].train_ids[:4])
    assert x.shape[1:] == tuple(bench.data_path.feature_shape)  # the body's input either way


def test_protocols_sharing_sources_but_not_classes_keep_separate_shards(bench_cache, tmp_path, monkeypatch):
    """The shards hold labelled samples only; which those are depends on the classes the stream uses."""
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "disk")
    opts = RunOptions(results_dir=tmp_path, progress=False, log=False)
    two, four = prepare(_small(bench_cache), 0, opts), prepare(Protocol.model_validate(reduced_tiny()), 0, opts)
    assert two.test_inputs.shards.folder != four.test_inputs.shards.folder
    for bench in (two, four):
        ids = np.flatnonzero(bench.stream.test.labels >= 0)
        assert bench.test_inputs.shards.rows == len(ids) and bench.test_inputs.get(ids[-3:]).shape[0] == 3


def test_cpu_forwards_in_chunks_equal_the_whole_batch():
    """The CPU trunk pass runs 16 rows at a time (eval: a chunk sized from the model); a ConvNeXtV2 gives the
    outputs of one forward of the whole batch to float rounding (oneDNN's kernels depend on the batch
    size), and the same predictions."""
    import timm

    from bench_stability_gap.harness.model.cpu import CPU_FORWARD_CHUNK, in_cpu_chunks

    torch.manual_seed(0)
    net = timm.create_model("convnextv2_atto", pretrained=False, num_classes=10).eval()
    x = torch.randn(2 * CPU_FORWARD_CHUNK + 5, 3, 32, 32)
    calls: list[int] = []

    def forward(batch):
        calls.append(len(batch))
        return net(batch)

    with torch.no_grad():
        chunked, whole = in_cpu_chunks(forward, x, CPU_FORWARD_CHUNK), net(x)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
    assert torch.equal(chunked.argmax(1), whole.argmax(1))
    assert calls == [CPU_FORWARD_CHUNK, CPU_FORWARD_CHUNK, 5]


def _synthetic_small(bench_cache) -> Protocol:
    """The reduced tiny protocol on generated images (decoded per fetch, like image files)."""
    spec = reduced_tiny()
    spec.update(name="datapath_synthetic", sessions=2)
    spec["pretrain_data"] = {"source": "synthetic", "synthetic": {
        "classes": 5, "train_per_class": 24, "test_per_class": 4, "image_size": 40}}
    spec["stream_data"] = [{"source": "synthetic", "synthetic": {
        "classes": 10, "train_per_class": 12, "test_per_class": 4, "image_size": 40}}]
    return Protocol.model_validate(spec)


def test_planned_batches_decoded_ahead_by_workers_give_the_same_run(bench_cache, tmp_path, monkeypatch):
    """DataLoader workers decode a session's planned batches ahead; the run is the one decoded in step."""
    from bench_stability_gap.harness.run.continual import run_cl
    from bench_stability_gap.methods.registry import build_method

    protocol = _synthetic_small(bench_cache)
    opts = RunOptions(results_dir=tmp_path, progress=False, log=False)
    monkeypatch.setenv("BENCH_TRUNK_CACHE", "stream")
    runs = []
    for workers in ("0", "1"):
        monkeypatch.setenv("BENCH_LOADER_WORKERS", workers)
        bench = prepare(protocol, 0, opts)
        assert bench.train_inputs.kind == "trunk-stream"
        _, method = build_method("vanilla", protocol.name)
        curves, budget, _ = run_cl(bench, method, 0, opts)
        runs.append(([c.model_dump() for c in curves], budget.samples_trained, bench.train_inputs.prefetched))
    (in_step, samples, none), (ahead, samples_ahead, prefetched) = runs
    assert in_step == ahead and samples == samples_ahead
    assert none == 0 and prefetched == sum(c["total_updates"] for c in ahead) > 0  # every batch, from the workers
