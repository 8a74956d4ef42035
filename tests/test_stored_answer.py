"""An identical stored run is answered from its file: the settings resolved without the methods' code equal
the built method's, and `bench run` / `api.run` of a stored run load neither torch nor MLflow (a record found
complete in the sqlite store is read with sqlite3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench_stability_gap.harness.results.store_read import has_whole_record
from bench_stability_gap.harness.run.stored import resolved_settings
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import build_method, method_settings

from support import invoke, small_protocol

METHODS = ["vanilla", "finetune", "output_only", "derpp", "er_ace", "ewc", "lwf", "gdumb", "remind", "vanilla+sgm",
           "vanilla+lora", "vanilla+soft", "vanilla+init", "vanilla+oocf", "vanilla+nmc", "derpp+sgm"]


@pytest.mark.parametrize("protocol", ["tiny_cil", "tiny_cil_quick"])
@pytest.mark.parametrize("method", METHODS)
def test_torch_free_settings_are_the_built_methods(protocol, method):
    spec = load_protocol(protocol)
    overrides = {"lr": 0.0005} if method == "vanilla" else {}
    assert resolved_settings(method, spec, overrides) == method_settings(build_method(method, spec, overrides)[1])


@pytest.mark.slow
def test_a_stored_run_is_answered_without_torch_or_mlflow(tmp_path: Path, seeded_store):
    spec = small_protocol(tmp_path)
    seeded_store(tmp_path / "r")  # the store starts migrated: what is tested is the second answer, not its creation
    env = {"BENCH_CACHE_DIR": str(tmp_path / "cache")}
    made = invoke("run", "-p", str(spec), "--results-dir", str(tmp_path / "r"), env=env)  # mirrored to MLflow
    assert made.exit_code == 0, made.output
    stored = next((tmp_path / "r" / "runs").rglob("seed0-*.json"))
    assert has_whole_record(f"sqlite:///{tmp_path / 'r' / 'mlflow.db'}", "plugin_reduced", stored.stem[6:]) is True
    assert has_whole_record(f"sqlite:///{tmp_path / 'r' / 'mlflow.db'}", "plugin_reduced", "not-a-run") is False
    assert has_whole_record("http://127.0.0.1:1", "plugin_reduced", "x") is None
    code = ("import sys\nfrom bench_stability_gap.harness.cli import main\n"
            f"sys.argv = ['bench', 'run', '-p', {str(spec)!r}, '--results-dir', {str(tmp_path / 'r')!r}]\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print('LOADED', 'torch' in sys.modules, 'mlflow' in sys.modules)\n"
            "from bench_stability_gap.harness import api\n"
            f"r = api.run({str(spec)!r}, results_dir={str(tmp_path / 'r')!r})\n"
            "print('API', r.run_id, 'torch' in sys.modules, 'mlflow' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**__import__("os").environ,
                         **env}, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Stored, nothing trained" in out.stdout and f"{stored}" in out.stdout, out.stdout
    assert "LOADED False False" in out.stdout, out.stdout
    assert f"API {stored.stem[6:]} False False" in out.stdout, out.stdout
