"""Third-party methods arrive through entry points exactly like the built-ins.

Nothing is pip-installed: as pluggy's tests do, each test writes a fake ``dist-info`` (METADATA and
entry_points.txt) into a temporary folder on ``sys.path``; the example package's own entry points are
read from its pyproject.toml, so the fake install declares exactly what a real one would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import Protocol
from bench_stability_gap.methods.registry import METHOD_GROUP, build_method, entries
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.workbench import prepare
from bench_stability_gap.harness.run.options import RunOptions
from support import install_folder, invoke, small_protocol, write_dist

EXAMPLE = Path(__file__).parent / "plugin_example"


@pytest.fixture()
def example_installed(site, monkeypatch):
    return install_folder(site, EXAMPLE, monkeypatch)


def test_plugin_is_listed_with_its_distribution_and_version(example_installed):
    found = entries(METHOD_GROUP)
    assert found["example_replay"].distribution == "bench-example-plugin"
    assert found["example_replay"].version == "0.3.1"
    out = invoke("ls", "methods")
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.strip().startswith("example_replay"))
    assert "bench-example-plugin" in line and "0.3.1" in line and "label-smoothed" in line
    assert "example_head_sgd" in out.output and "vanilla" in out.output  # built-ins stay listed


def test_plugin_runs_like_a_builtin_with_sgm_and_results_name_it(example_installed, tmp_path, bench_cache):
    protocol = small_protocol(tmp_path)
    common = ("--protocol", str(protocol), "--results-dir", str(tmp_path / "results"), "--no-mlflow", "--no-progress")
    # the joint reference on its own first (a plain `-m joint` stores it; the run below reuses it)
    assert invoke("run", "--method", "joint", *common).exit_code == 0
    out = invoke("run", "--method", "example_replay+sgm", "--set", "smoothing=0.2", *common)
    assert out.exit_code == 0, out.output
    files = [p for p in (tmp_path / "results").rglob("*.json") if "example_replay" in str(p)]
    assert len(files) == 1
    result = json.loads(files[0].read_text())
    assert result["method"]["spec"] == "example_replay+sgm"
    assert (result["method"]["distribution"], result["method"]["version"]) == ("bench-example-plugin", "0.3.1")
    assert result["method"]["modifier_distributions"]["sgm"].startswith("bench-stability-gap==")
    assert result["config"]["smoothing"] == 0.2
    assert result["budget"]["optimizer_steps"] == 2 * 3


def test_plugin_with_its_own_step_runs_alone_and_refuses_modifiers(example_installed, tmp_path, bench_cache):
    spec = yaml.safe_load(small_protocol(tmp_path).read_text())
    bench = prepare(Protocol.model_validate(spec), 0, RunOptions(results_dir=tmp_path, progress=False, log=False))
    _, method = build_method("example_head_sgd", bench.protocol.name)
    curves, budget, _ = run_cl(bench, method, 0, RunOptions(results_dir=tmp_path, progress=False, log=False))
    assert budget.optimizer_steps == 6 and len(curves) == 2
    with pytest.raises(BenchError, match="example_head_sgd.*does not use the standard training step"):
        build_method("example_head_sgd+sgm", bench.protocol.name)


def test_a_plugin_that_fails_to_import_is_listed_and_named_never_dropped(site):
    write_dist(site, "bench-broken-plugin", "2.0", {METHOD_GROUP: {"broken": "bench_no_such_module_xyz:Broken"}})
    entries.cache_clear()
    out = invoke("ls", "methods")
    assert out.exit_code == 0, out.output
    line = next(ln for ln in out.output.splitlines() if ln.strip().startswith("broken"))
    assert "bench-broken-plugin" in line and "fails to import" in line
    out = invoke("run", "--method", "broken", "--no-mlflow")
    assert out.exit_code == 2
    for needle in ("broken", "bench-broken-plugin 2.0", "bench_no_such_module_xyz", "failed to import"):
        assert needle in out.output
    assert "Traceback" not in out.output


def test_a_plugin_whose_module_raises_names_the_error(site, monkeypatch):
    pkg = site / "bench_raising_plugin.py"
    pkg.write_text("raise RuntimeError('needs CUDA 13')\n")
    write_dist(site, "bench-raising-plugin", "0.1", {METHOD_GROUP: {"raising": "bench_raising_plugin:M"}})
    entries.cache_clear()
    with pytest.raises(BenchError, match=r"raising.*bench-raising-plugin 0\.1.*RuntimeError: needs CUDA 13"):
        build_method("raising", "tiny_cil")


def test_two_packages_claiming_one_name_is_an_error_naming_both(site):
    for dist in ("bench-dup-a", "bench-dup-b"):
        write_dist(site, dist, "1.0", {METHOD_GROUP: {"twin": f"{dist.replace('-', '_')}:Twin"}})
    entries.cache_clear()
    with pytest.raises(BenchError) as err:
        entries(METHOD_GROUP)
    assert "bench-dup-a" in str(err.value) and "bench-dup-b" in str(err.value) and "'twin'" in str(err.value)
    out = invoke("ls", "methods")
    assert out.exit_code == 2 and "bench-dup-a" in out.output and "bench-dup-b" in out.output


def test_a_plugin_cannot_shadow_a_builtin(site):
    write_dist(site, "bench-shadow", "0.9", {METHOD_GROUP: {"vanilla": "bench_shadow:Vanilla"}})
    entries.cache_clear()
    out = invoke("run", "--method", "vanilla", "--no-mlflow")
    assert out.exit_code == 2
    assert "bench-shadow" in out.output and "bench-stability-gap" in out.output and "'vanilla'" in out.output


@pytest.mark.slow  # two whole check-method runs (about a minute each on a shared 2-core machine)
def test_check_method_passes_both_example_methods(example_installed, check_benches_once):
    for name in ("example_replay", "example_head_sgd"):
        out = invoke("check-method", name)
        assert out.exit_code == 0, out.output
        checks = 7 if name == "example_replay" else 6  # a method with its own step has no loss terms to check
        assert out.output.count("PASS") == checks and f"{name}: passes the contract." in out.output


def test_the_plugin_ships_its_own_defaults_chosen_by_protocol_properties(example_installed):
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.methods.registry import build_method

    assert build_method("example_replay", "tiny_cil")[1].config.lr == 2e-3  # its when rule: EfficientNet-Lite0
    renamed = load_protocol("tiny_online_500").model_copy(update={"name": "my_copy"})
    assert build_method("example_replay", renamed)[1].config.lr == 2e-3
    assert build_method("example_replay", "cil_places_lt")[1].config.lr == 1e-3  # its default
    assert build_method("example_replay", "tiny_cil", {"lr": 5e-4})[1].config.lr == 5e-4  # --set wins
