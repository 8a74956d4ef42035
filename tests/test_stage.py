"""Every training stage is a ``stage.Stage``: pre-training, a joint model and the continual run checkpoint in
one shape, and a stage stopped mid-training and resumed from its checkpoint ends where the uninterrupted
one does, to the bit."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from bench_stability_gap.harness.run import loop
from bench_stability_gap.harness.run.checkpoint import FORMAT, Checkpointer
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.joint import JointPart, ensure_joint_part, stored_part
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.run.pretrain import OfflineTraining
from bench_stability_gap.methods.base import MethodConfig
from bench_stability_gap.methods.registry import build_method

import support

SHAPE = {"format", "stage", "kind", "loop", "rng", "model", "own", "wall_s"}
LOOP = {"stretch", "update", "pending", "progress", "tally", "seen"}


class _Stopped(Exception):
    pass


@pytest.fixture()
def short(small_workbench, tmp_path):
    p = small_workbench.protocol
    bench = dataclasses.replace(small_workbench, protocol=p.model_copy(update={"joint": p.joint.model_copy(
        update={"updates": 6, "batch_size": 8})}))
    return bench, RunOptions(results_dir=tmp_path, progress=False, log=False)


def _pretraining(bench, options, saver: Checkpointer) -> OfflineTraining:
    config = MethodConfig(lr=0.01, weight_decay=0.0, layer_decay=1.0, trainable="head")
    generator = torch.Generator().manual_seed(3)
    return OfflineTraining(bench, copy.deepcopy(bench.deployed), config, bench.stream.pretrain_ids, 6, 8,
                           np.random.default_rng(3), generator, "pretrain test", options, saver)


def test_a_pretraining_stopped_mid_way_resumes_to_the_same_weights(short, tmp_path, monkeypatch):
    bench, options = short
    plain = _pretraining(bench, options, Checkpointer(tmp_path / "plain.ckpt", every=2))
    plain.train()
    support.stop_at(monkeypatch, "pretrain", 4, _Stopped)  # the checkpoint at update 2 is the last before the stop
    saver = Checkpointer(tmp_path / "stopped.ckpt", every=2)
    with pytest.raises(_Stopped):
        _pretraining(bench, options, saver).train()
    state = saver.load()
    assert set(state) == SHAPE and set(state["loop"]) == LOOP and state["format"] == FORMAT
    assert (state["stage"], state["kind"], state["loop"]["update"]) == ("pretrain", "mid", 2)
    monkeypatch.setattr(loop, "maybe_die", lambda phase: None)
    resumed = _pretraining(bench, options, Checkpointer(tmp_path / "stopped.ckpt", every=2))
    assert resumed.resume() and resumed.loop.update == 2
    resumed.train()
    for (name, a), (_, b) in zip(plain.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def _numbers(part: JointPart) -> dict:
    progress = {k: v for k, v in part.progress.state().items() if k != "seconds"}  # wall times differ
    return {"progress": progress, "tally": part.tally, "seen": [(ids.tolist(), n) for ids, n in part.seen]}


def test_a_joint_model_stopped_mid_way_resumes_to_the_same_part(short, tmp_path, monkeypatch):
    bench, options = short
    plain = ensure_joint_part(bench, 0, options, 0, Checkpointer(tmp_path / "plain.pt", every=2))
    support.stop_at(monkeypatch, "joint", 5, _Stopped)
    saver = Checkpointer(tmp_path / "stopped.pt", every=2)
    with pytest.raises(_Stopped):
        ensure_joint_part(bench, 0, options, 0, saver)
    state = saver.load()
    assert set(state) == SHAPE and set(state["loop"]) == LOOP
    assert (state["stage"], state["kind"], state["loop"]["update"]) == ("joint", "mid", 4)
    assert stored_part(saver) is None  # only partly trained
    monkeypatch.setattr(loop, "maybe_die", lambda phase: None)
    resumed = ensure_joint_part(bench, 0, options, 0, saver)
    assert _numbers(resumed) == _numbers(plain)
    finished = saver.load()  # the finished part: its loop state alone
    assert (finished["stage"], finished["kind"], finished["model"]) == ("joint", "finished", None)
    assert _numbers(stored_part(saver)) == _numbers(plain)


def test_a_continual_run_checkpoints_in_the_same_shape(short, tmp_path, monkeypatch):
    bench, options = short
    support.stop_at(monkeypatch, "continual", 4, _Stopped)
    saver = Checkpointer(tmp_path / "run.pt", every=2)
    with pytest.raises(_Stopped):
        run_cl(bench, build_method("vanilla", bench.protocol)[1], 0, options, saver)
    mid = saver.load(mid=True)
    assert set(mid) == SHAPE and set(mid["loop"]) == LOOP
    assert (mid["stage"], mid["kind"], mid["loop"]["stretch"], mid["loop"]["update"]) == ("continual", "mid", 0, 2)
    assert set(mid["own"]) == {"method", "memory", "counters", "session"} and mid["own"]["session"] is not None
