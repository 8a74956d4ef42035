"""What lets conftest.py share one prepared workbench across test modules: a run reads the workbench it is
given and changes nothing of it (the deployed model's weights and buffers, the protocol, the stream)."""

from __future__ import annotations

import copy

import numpy as np

from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.tools.state_compare import same_state
from bench_stability_gap.methods.registry import build_method


def test_a_run_with_adapters_and_a_memory_leaves_the_shared_workbench_as_it_found_it(capped_workbench, tmp_path):
    bench = capped_workbench
    deployed = copy.deepcopy(bench.deployed.state_dict())
    modules = [type(m) for m in bench.deployed.modules()]
    protocol = bench.protocol.model_dump()
    sessions = [(s.train_ids.copy(), s.classes.copy()) for s in bench.stream.sessions]
    _, method = build_method("vanilla+sgm", bench.protocol)  # LoRA adapters, head init and freezing, rehearsal
    run_cl(bench, method, 0, RunOptions(results_dir=tmp_path, progress=False, log=False))
    assert same_state(deployed, bench.deployed.state_dict())
    assert [type(m) for m in bench.deployed.modules()] == modules  # no adapter was injected into it
    assert bench.protocol.model_dump() == protocol
    assert all(np.array_equal(s.train_ids, ids) and np.array_equal(s.classes, classes)
               for s, (ids, classes) in zip(bench.stream.sessions, sessions))
