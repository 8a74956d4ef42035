"""Everything checkable is refused before compute with one paragraph naming the field, value or path
(exit 2): impossible accuracies in a result, a --device torch does not report, a tracking URI that is
not MLflow, a batch larger than its data, paths that are not regular files, overlong values; and a
stop by SIGTERM ends like Ctrl-C, saying that rerunning resumes."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from live_servers import mlflow_server  # noqa: F401 - the fixture
from bench_stability_gap.harness.results.schema import load_result, save_result

from support import invoke as bench, reduced_tiny, refused

FIXTURES = Path(__file__).parent / "browser" / "fixtures"


def fixture(i: int):
    """The i-th stored real result that is not a joint reference."""
    return [r for r in map(load_result, sorted(FIXTURES.glob("*.json"))) if not r.is_reference][i]


def stored_with(root: Path, value: float) -> Path:
    """A real stored result whose first recorded old-class accuracy is ``value`` (written as JSON's
    NaN / Infinity where it is one: what a hand-edited or foreign file holds)."""
    path = save_result(root, fixture(0))
    data = json.loads(path.read_text())
    data["curves"][0]["old"][0] = value
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 7.5])
def test_validate_refuses_impossible_accuracies(tmp_path, value):
    path = stored_with(tmp_path / "r", value)
    refused(bench("validate", str(path)), str(path), f"an accuracy of {value!r}", "never mirrors it")


def test_validate_still_accepts_a_real_result(tmp_path):
    path = save_result(tmp_path / "r", load_result(sorted(FIXTURES.glob("*.json"))[0]))
    out = bench("validate", str(path))
    assert out.exit_code == 0 and out.output.startswith("OK: result"), out.output


def test_sync_names_every_file_it_skips_and_never_mirrors_a_refused_run(tmp_path, seeded_store):
    from mlflow.tracking import MlflowClient

    root = seeded_store(tmp_path / "r")
    good = save_result(root, fixture(1))
    bad = stored_with(root, float("nan"))
    corrupt = good.parent / "broken.json"
    corrupt.write_text("{ not json")
    out = bench("sync", "--results", str(root))
    assert out.exit_code == 0, out.output
    assert f"skipped {bad}: refused: an accuracy of nan" in out.output
    assert f"skipped {corrupt}:" in out.output and "2 skipped" in out.output and "1 added" in out.output
    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    mirrored = [r.data.tags["bench.json"] for e in client.search_experiments()
                for r in client.search_runs([e.experiment_id])]
    assert mirrored == [str(good)]


@pytest.mark.parametrize("device", ["tpu", "", "mps", "xla", "meta", "cpu:0", "cuda:99"])
def test_a_device_torch_does_not_report_is_refused_on_run_and_sweep(tmp_path, device):
    refused(bench("run", "--device", device, "--results-dir", str(tmp_path / "r"), "--no-mlflow"),
            f"--device {device!r} is not a device", "Give one of: auto, cpu")
    refused(bench("sweep", "sgm_probes_tiny_cil", "--device", device, "--results-dir", str(tmp_path / "r"),
                  "--no-mlflow"), f"--device {device!r} is not a device")
    assert not (tmp_path / "r" / "runs").exists()


def test_a_web_server_that_is_not_mlflow_is_refused_before_compute(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    uri = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = bench("run", "--tracking-uri", uri, "--results-dir", str(tmp_path / "r"))
    finally:
        server.shutdown()
        server.server_close()
    refused(out, f"{uri} answers HTTP (404) but is not an MLflow tracking server", "nothing has run")


def test_paths_that_are_not_regular_files_say_what_they_are(tmp_path):
    refused(bench("run", "-p", str(tmp_path), "--no-mlflow"), f"Protocol file {tmp_path} is a folder, not a file")
    refused(bench("run", "-p", "/dev/zero", "--no-mlflow"), "/dev/zero exists but is a character device")
    refused(bench("validate", "/dev/zero"), "/dev/zero exists but is a character device")
    refused(bench("validate", str(tmp_path / "gone.json")), "gone.json does not exist")
    refused(bench("run", "--results-dir", "/dev/null", "--no-mlflow"),
            "results folder /dev/null exists but is a device, socket or pipe, not a folder")


def test_long_values_are_truncated_in_errors(tmp_path):
    name = "x" * 5000
    for args in (["run", "-m", name], ["run", "-m", f"vanilla+{name}"], ["run", "-p", name], ["run", "--device", name],
                 ["run", "--set", f"{name}=1"], ["run", "--results-dir", str(tmp_path / name)]):
        out = bench(*args, "--no-mlflow")
        refused(out, "characters]")
        assert len(out.output) < 1200 and "x" * 200 not in out.output, out.output


def test_an_unknown_protocol_in_the_table_is_named_without_a_typo(tmp_path):
    root = tmp_path / "r"
    save_result(root, load_result(sorted(FIXTURES.glob("*.json"))[0]))
    out = bench("leaderboard", "table", "--results", str(root), "-p", "tiny_cl")
    refused(out, "Known protocols with results: tiny_cil")
    assert "resultss" not in out.output


@pytest.mark.slow
def test_a_batch_larger_than_its_session_is_refused_before_anything_trains(tmp_path, bench_cache):
    """With no subsample in the spec, the embedded sources' counts come from the catalog: validation
    refuses the batch as the run does."""
    spec = reduced_tiny()
    for source in spec["stream_data"]:
        source["train_per_class"] = None  # the spec no longer fixes the counts: the source's own apply
    spec["training"]["batch"]["new"] = 50000
    protocol = tmp_path / "big_batch.yaml"
    protocol.write_text(yaml.safe_dump(spec))
    refused(bench("validate", str(protocol)), "training.batch.new (50000) exceeds the", "smallest")
    out = bench("run", "-p", str(protocol), "--results-dir", str(tmp_path / "r"), "--no-mlflow", "--no-progress")
    refused(out, "training.batch.new (50000) exceeds the", "smallest")
    assert "No fp32 joint reference" not in out.output and not list((tmp_path / "r").rglob("*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_ends_as_ctrl_c_does_and_both_say_rerunning_resumes(tiny_protocol_file, tmp_path, sig, code):
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    # as from a terminal: a test suite started in the background (`cmd &` in a script) has SIGINT
    # ignored, which its children inherit, and Python then installs no Ctrl-C handler at all
    proc = subprocess.Popen([sys.executable, "-m", "bench_stability_gap.harness.cli", "run", "-p", str(tiny_protocol_file),
                             "--results-dir", str(tmp_path / "r"), "--no-mlflow", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("inputs ready"):
                break
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = "".join(seen) + rest
    assert proc.returncode == code, said
    assert "Interrupted while" in said and "running the same command again" in said, said
    assert "nothing was written" not in said
    assert "Traceback" not in said


@pytest.mark.slow
def test_a_real_mlflow_server_passes_the_identity_check(mlflow_server: str) -> None:  # noqa: F811
    """The check that refuses a plain web server must accept MLflow itself (started on 127.0.0.1)."""
    from bench_stability_gap.harness.tools.preflight import check_tracking_uri

    check_tracking_uri(mlflow_server)  # raises when the server is not taken for MLflow


@pytest.mark.parametrize("name, value, flags", [
    ("BENCH_RAM_GB", "abc", ()), ("BENCH_RAM_GB", "-5", ()), ("BENCH_RAM_GB", "0", ()),
    ("BENCH_DISK_GB", "12GB", ()), ("BENCH_DISK_GB", "inf", ()),
    ("BENCH_LOADER_WORKERS", "abc", ()), ("BENCH_LOADER_WORKERS", "1.5", ()), ("BENCH_LOADER_WORKERS", "-1", ()),
    ("BENCH_PROGRESS_EVERY_S", "abc", ()), ("BENCH_PROGRESS_EVERY_S", "nan", ()),
    ("BENCH_IMAGE_CACHE_GB", "abc", ("--no-trunk-cache",)), ("BENCH_IMAGE_CACHE_GB", "-1", ("--no-trunk-cache",)),
])
def test_a_malformed_number_in_a_bench_variable_is_refused_naming_it_before_compute(tmp_path, monkeypatch, name,
                                                                                      value, flags):
    """A typo in a BENCH_* number was a ValueError traceback from deep in a run (or, for the progress
    interval, at import); a negative budget was reported as "the budget is -5.00 GB"."""
    from bench_stability_gap.harness.run import pipeline

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared despite a malformed setting")

    monkeypatch.setattr(pipeline, "prepare", prepared)
    out = bench("run", "--results-dir", str(tmp_path / "r"), "--no-mlflow", *flags, env={name: value})
    refused(out, f"{name}={value!r}", "unset it for the default", lines=2)


@pytest.mark.parametrize("form", ["file", "path"])
def test_a_file_store_this_mlflow_refuses_is_refused_before_compute(tmp_path, monkeypatch, form):
    """MLflow 3 writes a file store (file:... or a folder path) only with MLFLOW_ALLOW_FILE_STORE=true: the
    run trained, then failed to mirror its result, and the `bench sync` it suggested failed the same way."""
    from bench_stability_gap.harness.run import pipeline
    from bench_stability_gap.harness.tools.preflight import check_tracking_uri

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared despite an unusable tracking store")

    monkeypatch.setattr(pipeline, "prepare", prepared)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "store").as_uri() if form == "file" else str(tmp_path / "store")
    out = bench("run", "--results-dir", str(tmp_path / "r"), "--tracking-uri", uri)
    refused(out, f"Tracking URI {uri!r}: MLflow", "MLFLOW_ALLOW_FILE_STORE=true", "sqlite:///", lines=3)
    assert not (tmp_path / "store").exists()  # "nothing has run", and nothing was made
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    check_tracking_uri(uri)  # allowed: MLflow writes it


@pytest.mark.parametrize("value", ["continual", "continual:x", "train:3", "continual:-1"])
def test_a_malformed_fault_injection_setting_is_refused_before_compute(tmp_path, monkeypatch, value):
    """BENCH_KILL_AT was parsed with a bare int() at the first update: a ValueError traceback after the set-up,
    or, for an unknown phase, silently no fault at all (a resume test that tests nothing)."""
    from bench_stability_gap.harness.run import pipeline

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared despite a malformed setting")

    monkeypatch.setattr(pipeline, "prepare", prepared)
    out = bench("run", "--results-dir", str(tmp_path / "r"), "--no-mlflow", env={"BENCH_KILL_AT": value})
    refused(out, f"BENCH_KILL_AT={value!r}", "PHASE:N", lines=2)


def test_the_readers_of_bench_variables_refuse_what_the_preflight_refuses(monkeypatch):
    """Each reader applies the same rule where the value is used (a sweep's Ray task, check-method)."""
    from bench_stability_gap.harness.data.datapath import disk_budget_bytes, ram_budget_bytes
    from bench_stability_gap.harness.data.inputs import image_cache_bytes, loader_workers
    from bench_stability_gap.harness.errors import BenchError
    from bench_stability_gap.harness.progress_bar import PlainBar

    for name, read in (("BENCH_RAM_GB", ram_budget_bytes), ("BENCH_DISK_GB", lambda: disk_budget_bytes(Path("/"))),
                       ("BENCH_IMAGE_CACHE_GB", image_cache_bytes), ("BENCH_LOADER_WORKERS", loader_workers),
                       ("BENCH_PROGRESS_EVERY_S", PlainBar)):
        monkeypatch.setenv(name, "-2")
        with pytest.raises(BenchError, match=f"{name}='-2' is not"):
            read()
        monkeypatch.setenv(name, "3")
        read()
    assert (ram_budget_bytes(), loader_workers(), PlainBar().every) == (3 * 2**30, 3, 3.0)
    monkeypatch.setenv("BENCH_LOADER_WORKERS", "0")  # no worker processes: decoding in the main process
    assert loader_workers() == 0


@pytest.mark.parametrize("seed", ["-1", "9999999999"])
def test_check_method_refuses_a_seed_out_of_range_before_training(monkeypatch, seed):
    from bench_stability_gap.harness.tools import check_method

    def prepared(*args, **kwargs):
        raise AssertionError("a workbench was prepared for a seed numpy cannot take")

    monkeypatch.setattr(check_method, "prepare", prepared)
    refused(bench("check-method", "vanilla", "-s", seed), f"--seed {seed} is outside 0..", lines=1)


def test_a_batch_larger_than_the_opened_data_is_refused_before_training():
    """Where only the data knows its counts (a folder source), the check runs on the opened stream."""
    from types import SimpleNamespace

    import numpy as np

    from bench_stability_gap.harness.data.stream import check_batch_sizes
    from bench_stability_gap.harness.errors import BenchError
    from bench_stability_gap.harness.spec.protocol import Protocol

    protocol = Protocol.model_validate(reduced_tiny())
    protocol = protocol.model_copy(update={"training": protocol.training.model_copy(
        update={"batch": protocol.training.batch.model_copy(update={"new": 41})})})
    sessions = [SimpleNamespace(index=i, train_ids=np.arange(n)) for i, n in ((1, 50), (2, 40))]
    stream = SimpleNamespace(protocol=protocol, pretrain_ids=np.arange(600), sessions=sessions, seed=3)
    with pytest.raises(BenchError, match=r"training.batch.new \(41\) exceeds the 40 training samples of session 2, "
                                         r"the smallest.*seed 3\). Lower the batch size; nothing has trained"):
        check_batch_sizes(stream)
    stream.sessions = sessions[:1]
    check_batch_sizes(stream)
