"""Fail fast: everything that can be checked before compute is, in about a second, with exit code 2,
one paragraph naming the field/value/path, no traceback and nothing written."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import time
from functools import partial
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from bench_stability_gap.harness import atomic
from bench_stability_gap.harness.tools import preflight
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.methods.registry import METHOD_GROUP, MODIFIER_GROUP, entries
from bench_stability_gap.methods.configs import CONFIGS
from live_servers import free_port as closed_port  # a port nothing listens on once the probe socket closes
import support
from support import invoke

refused = partial(support.refused, lines=1)  # every refusal here is one line


@pytest.fixture
def results(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "results"


@pytest.mark.parametrize("args, needles", [
    (["-m", "vanila"], ["Unknown method 'vanila'", "Did you mean: vanilla"]),
    (["-m", "vanilla + sgm"], ["'vanilla + sgm' contains whitespace"]),
    (["-m", "vanilla+sgmm"], ["Unknown modifier 'sgmm'"]),
    (["--set", "lrr=0.1"], ["lrr", "Extra inputs", "Its settings are: lr"]),
    (["--set", "lr=1e999"], ["lr: Input should be a finite number"]),
    (["--set", "lr=1.0e+308"], ["lr: Input should be less than or equal to 10", "(got 1e+308)"]),
    (["-m", "vanilla+sgm", "--set", "sgm.lora.rank=100000"], ["lora.rank", "less than or equal to 1024", "(got 100000)"]),
    (["-m", "lwf", "--set", "temperature=-1"], ["temperature", "greater than 0"]),
    (["--set", "weight_decay=[[[[[[1]]]]]]"], ["weight_decay", "(got [[[[...]]]])"]),
    (["-s", "4294967296"], ["--seed 4294967296 is outside 0..2147483647"]),
    (["-s", "-1"], ["--seed -1 is outside"]),
    (["--tracking-uri", "bogus://x"], ["unknown scheme 'bogus'"]),
    (["--tracking-uri", "http://"], ["names no host"]),
])
def test_bad_run_arguments_are_refused_before_compute(results, args, needles) -> None:
    out = invoke("run", "--results-dir", str(results), *args)
    refused(out, *needles)
    assert not list(results.rglob("*.json")), "nothing ran"


def test_a_typo_is_refused_without_importing_torch_or_mlflow(tmp_path) -> None:
    """What makes a typo cost a second, not the minute torch and MLflow take to import on a loaded machine:
    neither is imported before the method string and the settings are checked (no wall-clock bound here,
    as shared machines make one flaky)."""
    code = ("import sys; from bench_stability_gap.harness.cli import main\n"
            "main(['run', '-m', 'vanila', '--set', 'lr=0.1'], standalone_mode=False)\n"
            "print('torch' in sys.modules, 'mlflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.stdout.split() == ["False", "False"] and "Unknown method 'vanila'" in out.stderr, out.stdout + out.stderr
    bad_set = code.replace("'vanila', '--set', 'lr=0.1'", "'vanilla', '--set', 'lrr=0.1'")
    out = subprocess.run([sys.executable, "-c", bad_set], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.stdout.split() == ["False", "False"] and "lrr" in out.stderr, out.stdout + out.stderr


def test_builtin_configs_are_the_classes_configs() -> None:
    """methods.configs answers for built-ins without importing them: it must be exactly what the
    classes use, for every entry point this package ships."""
    for group in (METHOD_GROUP, MODIFIER_GROUP):
        for entry in entries(group).values():
            if entry.distribution != "bench-stability-gap":
                continue
            assert CONFIGS[entry.target] is entry.load().Config, entry.target
    shipped = {ep.value for ep in metadata.distribution("bench-stability-gap").entry_points
               if ep.group in (METHOD_GROUP, MODIFIER_GROUP)}
    assert shipped == set(CONFIGS)


def test_a_results_dir_that_is_a_file_is_refused(tmp_path) -> None:
    target = tmp_path / "taken"
    target.write_text("not a folder")
    refused(invoke("run", "--results-dir", str(target)), f"results folder {target} exists but is a file")


def test_a_read_only_results_dir_is_refused_before_anything_runs(results, monkeypatch) -> None:
    real = atomic.tempfile.mkstemp

    def mkstemp(*args, dir=None, **kw):
        if Path(dir) == results:
            raise OSError(errno.EROFS, "Read-only file system", str(results))
        return real(*args, dir=dir, **kw)

    monkeypatch.setattr(atomic.tempfile, "mkstemp", mkstemp)
    refused(invoke("run", "--results-dir", str(results)), f"results folder {results} is not writable",
            "Read-only file system", "nothing has run")


def test_full_disk_is_found_before_compute(results, monkeypatch) -> None:
    usage = atomic.shutil.disk_usage

    def nearly_full(path):
        real = usage(path)
        return type(real)(real.total, real.total - 1 << 20, 1 << 20)

    monkeypatch.setattr(atomic.shutil, "disk_usage", nearly_full)
    refused(invoke("run", "--results-dir", str(results)), f"results folder {results} has 1 MiB free",
            "at least 64 MiB")


def test_an_unwritable_cache_dir_is_refused_naming_the_variable(results, tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("BENCH_CACHE_DIR", str(blocker / "cache"))
    refused(invoke("run", "--results-dir", str(results)), f"cache folder ($BENCH_CACHE_DIR) {blocker / 'cache'}",
            "not writable")


def test_sqlite_uri_pointing_at_a_folder_or_a_non_database(results, tmp_path) -> None:
    refused(invoke("run", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{tmp_path}"),
            f"points at the folder {tmp_path}")
    junk = tmp_path / "junk.db"
    junk.write_text("this is no database " * 100)
    refused(invoke("run", "--results-dir", str(results), "--tracking-uri", f"sqlite:///{junk}"),
            f"{junk} is not an SQLite database")
    # the default store, the results folder's own mlflow.db, is checked as a given one is: before any compute
    (results / "mlflow.db").write_bytes(junk.read_bytes())
    refused(invoke("run", "--results-dir", str(results)), f"{results / 'mlflow.db'} is not an SQLite database",
            "Move it aside, pass another --tracking-uri, or --no-mlflow; nothing has run.")


def test_unreachable_tracking_server_fails_within_seconds(results) -> None:
    uri = f"http://127.0.0.1:{closed_port()}"
    t0 = time.perf_counter()
    out = invoke("run", "--results-dir", str(results), "--tracking-uri", uri)
    assert time.perf_counter() - t0 < 10
    refused(out, f"MLflow server {uri} cannot be reached", "--no-mlflow")


def test_a_server_that_never_answers_times_out(results) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        t0 = time.perf_counter()
        with pytest.raises(Exception) as err:
            preflight.check_tracking_uri(uri, timeout=1.0)
        assert time.perf_counter() - t0 < 5
    assert "cannot be reached within 1 s" in str(err.value)


def protocol_file(tmp_path: Path, **backbone) -> Path:
    spec = {**load_protocol("tiny_cil").model_dump(mode="json"), "name": "tiny_cil_backbone"}
    spec["backbone"].update(backbone)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_unknown_backbone_is_named_with_suggestions(tmp_path) -> None:
    out = invoke("validate", "--build", str(protocol_file(tmp_path, model="tf_efficientnet_lite00")))
    refused(out, "backbone.model 'tf_efficientnet_lite00'", "not a timm model", "tf_efficientnet_lite0")


def test_unknown_timm_weights_and_weight_kinds_are_named(tmp_path) -> None:
    refused(invoke("validate", "--build", str(protocol_file(tmp_path, weights="timm:convnextv2_femtoo.fcmae"))),
            "backbone.weights 'convnextv2_femtoo.fcmae'", "not a timm model")
    refused(invoke("validate", str(protocol_file(tmp_path, weights="http://x/w.pth"))),
            "backbone.weights 'http://x/w.pth' must start with package:, file:, timm: or none:")


@pytest.mark.parametrize("content, needle", [
    (None, "does not exist"),
    (b"not a torch file", "cannot be loaded as PyTorch weights"),
    ("list", "holds a list, not a state dict"),
])
def test_file_weights_that_are_not_a_state_dict(tmp_path, content, needle) -> None:
    import torch

    weights = tmp_path / "w.pth"
    if content == "list":
        torch.save([1, 2, 3], weights)
    elif content is not None:
        weights.write_bytes(content)
    # the file's presence is checked at once; what it holds, by --build, which loads it
    out = invoke("validate", *(["--build"] if content is not None else []),
                 str(protocol_file(tmp_path, weights=f"file:{weights}")))
    refused(out, f"backbone.weights file {weights}", needle)


def test_an_unknown_reference_method_is_refused_before_the_deployed_model_trains(results, tmp_path) -> None:
    """The A_best reference runs train after the deployed model and the joint reference: a typo in
    best_new_reference must not cost those first."""
    spec = {**load_protocol("tiny_cil").model_dump(mode="json"), "name": "tiny_cil_references"}
    spec["best_new_reference"] = ["vanilla", "vanila"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(spec))
    needles = ("best_new_reference names 'vanila'", "Did you mean: vanilla")
    refused(invoke("validate", str(path)), *needles)
    refused(invoke("run", "-p", str(path), "--results-dir", str(results), "--no-mlflow"), *needles)
    assert not (tmp_path / "cache").exists() and not list(results.rglob("*.json")), "nothing ran"


def test_sweep_seeds_are_checked_before_anything_runs(tmp_path) -> None:
    out = invoke("sweep", "table1_tiny_cil", "--seeds", "0,4294967296", "--results-dir", str(tmp_path))
    refused(out, "seed 4294967296 is outside")
