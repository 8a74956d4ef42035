"""The sweep's stage graph, the progress board and the shared-storage check: unit tests, no training."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.methods.configs import joint_settings
from bench_stability_gap.harness.results.schema import ProtocolStamp, save_result
from bench_stability_gap.harness.sweep.shared_storage import (probe_problems, remove_probes, shared_storage_error,
                                                        write_probes)
from bench_stability_gap.harness.sweep.plan import Sweep, SweepGroup, plan
from bench_stability_gap.harness.sweep.progress import ProgressBoard, eta_seconds, overall_line, running_lines
from bench_stability_gap.harness.sweep.stages import split_joint, stage_graph
from bench_stability_gap.harness.run.options import RunOptions
from results_factory import joint_run, two_session_run


def _graph(protocol_file: Path, results: Path, methods: list[str], seeds: list[int]):
    sweep = Sweep(name="g", seeds=seeds, runs=[SweepGroup(protocol=str(protocol_file), methods=methods)])
    return stage_graph(plan(sweep, results), results)


def test_each_shared_prerequisite_is_one_stage_that_the_stages_needing_it_wait_for(tiny_protocol_file, tmp_path):
    graph = _graph(tiny_protocol_file, tmp_path, ["finetune", "vanilla", "vanilla+oocf"], [0, 1])
    h = graph[0].protocol.spec_hash
    spec = f"tiny_cil_reduced@{h}"
    assert [s.key for s in graph] == [
        f"deployed:{spec}",
        f"joint:{spec}:0", f"references:{spec}:0", f"run:{spec}:0:finetune", f"run:{spec}:0:vanilla+oocf",
        f"joint:{spec}:1", f"references:{spec}:1", f"run:{spec}:1:finetune", f"run:{spec}:1:vanilla+oocf",
    ]  # the vanilla row is the A_best reference run: the references stage makes it, once
    needs = {s.key: s.needs for s in graph}
    assert needs[f"joint:{spec}:0"] == needs[f"joint:{spec}:1"] == (f"deployed:{spec}",)
    assert needs[f"references:{spec}:1"] == (f"joint:{spec}:1",)
    assert needs[f"run:{spec}:1:finetune"] == needs[f"run:{spec}:1:vanilla+oocf"] == (f"references:{spec}:1",)
    assert graph[3].label == "tiny_cil_reduced finetune seed 0"



def test_a_cluster_trains_each_joint_model_as_a_stage_and_the_joint_stage_combines_them(tiny_protocol_file, tmp_path):
    graph = _graph(tiny_protocol_file, tmp_path, ["finetune"], [0])
    split = split_joint(graph)
    spec = f"tiny_cil_reduced@{graph[0].protocol.spec_hash}"
    parts = [f"joint-part:{spec}:0:{i}" for i in range(4)]  # one per session model: 4 sessions
    assert [s.key for s in split] == [f"deployed:{spec}", *parts, f"joint:{spec}:0", f"references:{spec}:0",
                                      f"run:{spec}:0:finetune"]
    by_key = {s.key: s for s in split}
    assert all(by_key[k].needs == (f"deployed:{spec}",) and by_key[k].part == i for i, k in enumerate(parts))
    assert by_key[f"joint:{spec}:0"].needs == tuple(parts)
    assert [by_key[k].label for k in parts[:2]] == ["tiny_cil_reduced joint model 1 seed 0",
                                                    "tiny_cil_reduced joint model 2 seed 0"]
    # joint.mode final trains one model: nothing to split
    final = [dataclasses.replace(s, protocol=s.protocol.model_copy(update={"joint": s.protocol.joint.model_copy(
        update={"mode": "final"})})) for s in graph]
    assert [s.kind for s in split_joint(final)] == [s.kind for s in graph]

def test_stored_prerequisites_are_left_out_and_the_next_stage_waits_for_the_one_before(tiny_protocol, tiny_protocol_file,
                                                                                    tmp_path):
    stamp = ProtocolStamp(name=tiny_protocol.name, version=tiny_protocol.version, hash=tiny_protocol.spec_hash)
    here = {"numerics": RunOptions(results_dir=tmp_path, device="cpu").numerics}  # made on this machine
    save_result(tmp_path, joint_run("j0", seed=0).model_copy(update={"protocol": stamp, "options": here,
                                                                     "config": joint_settings(tiny_protocol)}))
    graph = _graph(tiny_protocol_file, tmp_path, ["finetune"], [0])
    spec = f"tiny_cil_reduced@{tiny_protocol.spec_hash}"
    assert [(s.key, s.needs) for s in graph] == [
        (f"deployed:{spec}", ()),
        (f"references:{spec}:0", (f"deployed:{spec}",)),  # the joint of seed 0 is stored: no stage for it
        (f"run:{spec}:0:finetune", (f"references:{spec}:0",)),
    ]
    # a stored A_best run made with other settings serves as the reference, but its own row is run again
    save_result(tmp_path, two_session_run("v0", "vanilla").model_copy(update={"protocol": stamp, "config": {"lr": 1},
                                                                             "options": here}))
    graph = _graph(tiny_protocol_file, tmp_path, ["finetune", "vanilla"], [0])
    assert [(s.key, s.needs) for s in graph] == [
        (f"deployed:{spec}", ()),
        (f"run:{spec}:0:finetune", (f"deployed:{spec}",)),
        (f"run:{spec}:0:vanilla", (f"deployed:{spec}",)),
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_board_counts_retries_and_estimates_the_time_left():
    clock = Clock()
    board = ProgressBoard({"a": "p vanilla seed 0", "b": "p vanilla seed 1", "c": "p sgm seed 0", "d": "p sgm seed 1"},
                          clock)
    board.started("a", "n1")
    clock.now = 5.0
    assert board.started("b", "n2") == 1
    board.at("b", "session 2", 1, 600)
    board.at("b", "session 3", 120, 600)
    clock.now = 10.0
    board.finished("a", "done")
    assert board.started("b", "n1") == 2  # b's worker died: Ray started it again
    clock.now = 12.0
    states = board.snapshot()
    # one finished task took 10 s: 2 pending (10 s each) and b, running for 2 s (8 s to go), 1 at a time
    assert eta_seconds(states) == pytest.approx(28.0)
    assert overall_line(states, clock.now) == "tasks: 1/4 done, 1 running, 0 failed, 1 retried, elapsed 0m12s, ETA 0m28s"
    clock.now = 15.0  # no task ended meanwhile: the estimate counts down all the same
    assert eta_seconds(board.snapshot()) == pytest.approx(25.0)
    clock.now = 12.0
    assert running_lines(states) == ["  p vanilla seed 1: preparing (node n1, attempt 2)"]
    board.at("b", "session 3", 101, 600)  # resumed from a checkpoint at update 100
    board.at("b", "session 3", 140, 600)
    assert running_lines(board.snapshot()) == ["  p vanilla seed 1: session 3, update 140/600 (node n1, attempt 2)"]
    assert board.snapshot()["b"].went_on_from == "session 3, update 101"
    board.finished("c", "failed", "boom")
    board.finished("d", "skipped", "needs c")
    assert overall_line(board.snapshot(), 3725.0).startswith("tasks: 1/4 done, 1 running, 1 failed, 1 skipped")
    assert overall_line(board.snapshot(), 3725.0).endswith("elapsed 1h02m, ETA 0m08s")


def test_shared_storage_probe_sees_the_same_folder_and_names_what_a_node_cannot_see(tmp_path):
    folders = {"results folder": tmp_path / "results", "cache folder": tmp_path / "cache"}
    token = write_probes(folders)
    assert probe_problems(folders, token) == []  # a node that mounts the same storage
    private = {"results folder": tmp_path / "elsewhere", "cache folder": tmp_path / "cache"}
    (tmp_path / "elsewhere").mkdir()
    problems = probe_problems(private, token)  # a node whose results folder is its own disk
    assert len(problems) == 1 and problems[0].startswith(f"results folder {tmp_path / 'elsewhere'}: the driver's probe")
    assert probe_problems(folders, "another-token")[0].endswith("is not visible here (No such file or directory)")
    remove_probes(folders, token)
    assert not any(p.name.startswith(".bench-shared-probe") for f in folders.values() for p in f.iterdir())
    err = shared_storage_error({"10.0.0.7 (abc)": problems})
    assert "node 10.0.0.7 (abc): results folder" in str(err) and "--results-dir" in str(err)
    assert "$BENCH_CACHE_DIR" in str(err) and "Nothing was trained" in str(err) and err.exit_code == 2


@pytest.mark.parametrize("args, message", [
    (["--address", "127.0.0.1:6379"], "--address applies to --executor ray only (without it, this sweep runs locally)"),
    (["--cpus-per-run", "2", "--max-retries", "1"], "--cpus-per-run and --max-retries apply to --executor ray only"),
    (["--executor", "ray", "--device", "cuda"], "needs --gpus-per-run"),
    (["--executor", "ray", "--gpus-per-run", "0.5", "--device", "cpu"],
     "--gpus-per-run 0.5 reserves GPUs, but --device is cpu"),
    (["--executor", "ray", "--cpus-per-run", "0"], "--cpus-per-run must be > 0"),
])
def test_ray_settings_are_checked_before_anything_runs(args, message, tmp_path):
    out = CliRunner().invoke(main, ["sweep", "table1_tiny_cil", "--results-dir", str(tmp_path), *args])
    assert out.exit_code == 2 and message in out.output, out.output
    assert not (tmp_path / "runs").exists()
