"""The numbers do not depend on the machine's thread count: on the CPU a run computes with the harness's
fixed intra-op count, records it, and reuses only what was made with it (caches, references, rows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from bench_stability_gap.harness.results.comparability import CPU_KERNELS, CPU_THREADS, cpu_problem, select_runs
from bench_stability_gap.harness.model.machine import numerics_label

from support import reduced_tiny
from results_factory import joint_run, two_session_run

# One process = one machine: OMP_NUM_THREADS is its default thread count. It prepares the workbench (trunk
# features, deployed model: trained, or loaded from the cache) and reports what it computed with.
PROBE = """
import hashlib, json, sys
import torch
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.harness.run.workbench import RunOptions, prepare
default = torch.get_num_threads()
bench = prepare(load_protocol(sys.argv[1]), 0, RunOptions(results_dir=sys.argv[2], progress=False))
state = bench.deployed.state_dict()
digest = hashlib.sha256(b"".join(state[k].cpu().numpy().tobytes() for k in sorted(state))).hexdigest()
features = bench.test_inputs.get(list(range(8)))
print(json.dumps({"default": default, "threads": torch.get_num_threads(), "deployed": digest,
                  "features": hashlib.sha256(features.cpu().numpy().tobytes()).hexdigest()}))
"""


def _probe(protocol: Path, cache: Path, results: Path, threads: int) -> tuple[dict, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "BENCH_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", PROBE, str(protocol), str(results)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr + done.stdout


@pytest.mark.slow  # three processes, each pre-training a reduced tiny_cil
def test_the_deployed_model_and_trunk_features_are_the_same_under_1_and_2_default_threads(tmp_path):
    protocol = tmp_path / "tiny_cil_reduced.yaml"
    spec = reduced_tiny()  # fewer images and updates: what is compared is bit-equality, not learning
    spec["pretrain_data"].update(train_per_class=20, test_per_class=4)
    for source in spec["stream_data"]:
        source.update(train_per_class=10, test_per_class=4)
    spec["pretrain"].update(updates=6)
    protocol.write_text(yaml.safe_dump(spec))
    one, log_one = _probe(protocol, tmp_path / "cache-1", tmp_path / "r", 1)
    two, log_two = _probe(protocol, tmp_path / "cache-2", tmp_path / "r", 2)
    assert (one["default"], two["default"]) == (1, 2)  # the machines differ...
    assert one["threads"] == two["threads"] == CPU_THREADS  # ...the run computes with the harness's count
    assert "Training the deployed model" in log_one and "Training the deployed model" in log_two
    assert one["deployed"] == two["deployed"]  # trained apart, bit-identical
    assert one["features"] == two["features"]
    deployed = sorted(p.name for p in (tmp_path / "cache-1" / "deployed").glob("*.pt"))
    assert len(deployed) == 1 and deployed[0].endswith(
        f"-cpu-threads{CPU_THREADS}-{CPU_KERNELS}-{numerics_label(torch.device('cpu'))}.pt"), deployed

    # a 2-thread machine that finds the 1-thread machine's cache loads it, and computes as that one did
    cached, log = _probe(protocol, tmp_path / "cache-1", tmp_path / "r", 2)
    assert "Training the deployed model" not in log
    assert cached["deployed"] == one["deployed"] and cached["threads"] == CPU_THREADS


def _on(run, device: str, threads: int | None, kernels: str | None = CPU_KERNELS):
    run.options = {"device": device, **({"torch_threads": threads} if threads is not None else {}),
                   **({"cpu_kernels": kernels} if kernels is not None else {})}
    return run


def test_runs_made_on_the_cpu_with_another_thread_count_are_never_references_or_rows():
    other = CPU_THREADS + 1
    runs = [_on(joint_run("j-other", seed=0), "cpu", other), _on(joint_run("j-ok", seed=1), "cpu", CPU_THREADS),
            _on(two_session_run("r-other"), "cpu", other), _on(two_session_run("r-gpu", seed=1), "cuda", 16),
            _on(two_session_run("r-old", seed=2), "cpu", None)]
    sel = select_runs(runs, "h" * 16, ["vanilla"])
    assert {s: r.run_id for s, r in sel.joints.items()} == {1: "j-ok"}
    assert sorted(r.run_id for r in sel.runs.values()) == ["r-gpu", "r-old"]  # CUDA: the GPU decides the numbers
    apart = {r.run_id: why for r, why in sel.apart}
    assert set(apart) == {"j-other", "r-other"}
    assert f"with {other} intra-op threads" in apart["r-other"]
    assert cpu_problem({"device": "cpu", "torch_threads": CPU_THREADS, "cpu_kernels": CPU_KERNELS}) is None


def test_cpu_runs_made_with_other_kernels_or_before_kernels_were_recorded_are_never_references_or_rows():
    runs = [_on(joint_run("j-before", seed=0), "cpu", CPU_THREADS, None),
            _on(joint_run("j-ok", seed=1), "cpu", CPU_THREADS),
            _on(two_session_run("r-other"), "cpu", CPU_THREADS, "onednn"),
            _on(two_session_run("r-ok", seed=1), "cpu", CPU_THREADS),
            _on(two_session_run("r-gpu", seed=2), "cuda", 16, None)]  # CUDA runs record no CPU kernels
    sel = select_runs(runs, "h" * 16, ["vanilla"])
    assert {s: r.run_id for s, r in sel.joints.items()} == {1: "j-ok"}
    assert sorted(r.run_id for r in sel.runs.values()) == ["r-gpu", "r-ok"]
    apart = {r.run_id: why for r, why in sel.apart}
    assert set(apart) == {"j-before", "r-other"}
    assert "oneDNN's convolution for the body's 1x1 layers" in apart["j-before"]
    assert "with CPU kernels 'onednn'" in apart["r-other"] and repr(CPU_KERNELS) in apart["r-other"]


def test_a_cpu_run_keeps_freed_memory_for_reuse_and_a_cuda_run_leaves_the_allocator_alone():
    from bench_stability_gap.harness.model.cpu import keep_freed_memory

    assert keep_freed_memory(torch.device("cuda")) is False
    if sys.platform.startswith("linux"):  # glibc takes the settings; elsewhere nothing changes
        assert keep_freed_memory(torch.device("cpu")) is True
