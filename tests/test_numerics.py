"""The machine arithmetic a run computes with: the CPU pins, their label, and that runs of two labels never
share a selection, a board or a stored-run answer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from results_factory import joint_run, two_session_run

from bench_stability_gap.harness import numerics
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.comparability import select_runs
from bench_stability_gap.leaderboard.aggregate import Entry, summarize


def test_pin_sets_are_named_and_others_are_not():
    assert numerics.pin_set(dict(numerics.AVX2_PINS)) == "avx2"
    assert numerics.pin_set({**numerics.AVX2_PINS, "MKL_CBWR": "compatible"}) == "avx2-portable"
    assert numerics.pin_set({**numerics.AVX2_PINS, "ATEN_CPU_CAPABILITY": "avx512"}) is None
    assert numerics.pin_set({}) is None


def test_a_malformed_setting_is_one_paragraph(monkeypatch):
    monkeypatch.setenv("BENCH_CPU_PINS", "sometimes")
    with pytest.raises(BenchError, match="BENCH_CPU_PINS='sometimes' must be on"):
        numerics.pin_mode()


@pytest.mark.parametrize("mode, capability", [("on", "AVX2"), ("off", None)])
def test_the_package_sets_the_pins_before_torch_loads(mode, capability):
    """A fresh process: importing bench first pins ATen to AVX2 (this machine has AVX2), and the label says
    so; with the pins off torch keeps the machine's own choice and the label names the CPU."""
    if numerics.native_isa() not in ("avx2", "avx512"):
        pytest.skip("the pins apply to x86-64 machines with AVX2")
    code = ("import bench_stability_gap.harness, torch; from bench_stability_gap.harness.model.machine import "
            "numerics_label, cpu_capability; print(cpu_capability(), numerics_label(torch.device('cpu')))")
    env = {k: v for k, v in os.environ.items() if k not in numerics.PIN_NAMES} | {"BENCH_CPU_PINS": mode}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    found, label = out.split()
    if capability:
        assert found == capability and label == f"cpu-x86-avx2-{numerics.cpu_vendor()}"
    else:
        assert label.startswith(f"cpu-native-{found.lower()}-")


def test_torch_loaded_first_is_not_vouched_for():
    code = ("import torch, bench_stability_gap.harness as h; from bench_stability_gap.harness import numerics; "
            "print(numerics.pins_in_force() == {}, numerics.cpu_label('AVX512').startswith('cpu-native-avx512-'))")
    env = {k: v for k, v in os.environ.items() if k not in numerics.PIN_NAMES}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["True", "True"]


def test_torch_loaded_first_under_the_pins_is_pinned():
    """A process that imports torch before bench, with the pins already in its environment (a subprocess of a
    bench process, a worker), computes pinned: ATen reports AVX2 and the label says so."""
    if numerics.native_isa() not in ("avx2", "avx512"):
        pytest.skip("the pins apply to x86-64 machines with AVX2")
    code = ("import torch, bench_stability_gap.harness; from bench_stability_gap.harness.model.machine import "
            "numerics_label; print(numerics_label(torch.device('cpu')))")
    env = {**os.environ, **numerics.AVX2_PINS}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip() == f"cpu-x86-avx2-{numerics.cpu_vendor()}"


def _run(label: str, seed: int = 0, joint: bool = False):
    r = joint_run(f"j{label}{seed}", seed) if joint else two_session_run(f"r{label}{seed}", seed=seed)
    r.options["numerics"] = label
    return r


def test_another_machine_arithmetic_is_set_apart_from_a_selection():
    here, there = _run("cpu-x86-avx2-amd"), _run("cpu-native-avx512-Other-CPU")
    sel = select_runs([here, there], here.protocol.hash, ["vanilla"], numerics="cpu-x86-avx2-amd")
    assert list(sel.runs.values()) == [here]
    assert [why for _, why in sel.apart] and "other machine arithmetic" in sel.apart[0][1]
    sel = select_runs([there], here.protocol.hash, ["vanilla"], numerics="cpu-x86-avx2-amd")
    assert not sel.runs  # the stored-run answer for this machine: nothing stored


def test_two_machines_never_share_a_board_row():
    runs = [_run(label, seed, joint) for label in ("cpu-x86-avx2-amd", "cpu-x86-avx2-intel") for seed in (0, 1)
            for joint in (False, True)]
    boards = summarize([Entry(r, f"{r.run_id}.json") for r in runs])
    assert sorted(b.numerics for b in boards) == ["cpu-x86-avx2-amd", "cpu-x86-avx2-intel"]
    for b in boards:
        assert b.rows and {e.result.options["numerics"] for row in b.rows for e in row.runs} == {b.numerics}
        assert {e.result.options["numerics"] for e in b.joints.values()} == {b.numerics}
