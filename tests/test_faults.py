"""Storage faults are a state, not a crash: a full disk or a read-only folder at a checkpoint, result or
MLflow write ends the run with one paragraph and a documented exit code, the last good checkpoint stays
readable, and rerunning the same command once the fault is gone resumes to the uninterrupted numbers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from bench_stability_gap.harness import atomic
from bench_stability_gap.harness.atomic import STORAGE_EXIT
from bench_stability_gap.harness.results.schema import iter_results

from result_compare import differences
from support import invoke as bench

pytestmark = pytest.mark.slow

METHOD = "vanilla"  # its own A_best reference: joint, then this run; two results, two checkpointed phases


def run_args(protocol: Path, results: Path, *extra: str) -> list[str]:
    return ["run", "-p", str(protocol), "-m", METHOD, "--results-dir", str(results), "--no-progress",
            "--checkpoint-every", "2", *extra]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, bench_cache) -> tuple[Path, Path]:
    """The protocol file and the results of one run that met no fault (the numbers to reach)."""
    import yaml

    from support import reduced_tiny

    root = tmp_path_factory.mktemp("plain")
    protocol = root / "tiny_cil_reduced.yaml"
    protocol.write_text(yaml.safe_dump(reduced_tiny()))
    done = bench(*run_args(protocol, root / "results", "--no-mlflow"))
    assert done.exit_code == 0, done.output
    return protocol, root / "results"


def fail_writes(monkeypatch, code: int, hit, after: int = 0) -> list[Path]:
    """Make the atomic write of every path ``hit`` accepts, past the first ``after`` of them, fail with
    ``code`` half-way through its bytes (as a disk that fills mid-file does). Returns the paths that failed."""
    real = atomic._write_replace
    seen: list[Path] = []
    failed: list[Path] = []

    def write_replace(path: Path, write, durable: bool) -> None:
        if not hit(path):
            return real(path, write, durable)
        seen.append(path)
        if len(seen) <= after:
            return real(path, write, durable)
        failed.append(path)

        def torn(fh) -> None:
            fh.write(b"partial bytes")
            raise OSError(code, os.strerror(code))

        return real(path, torn, durable)

    monkeypatch.setattr(atomic, "_write_replace", write_replace)
    return failed


def assert_one_paragraph(output: str, *needles: str) -> None:
    assert "Traceback" not in output, output
    for needle in needles:
        assert needle in output, (needle, output)


def assert_checkpoints_readable(results: Path) -> list[Path]:
    saved = sorted((results / "checkpoints").glob("*.pt"))
    for path in saved:
        assert torch.load(path, map_location="cpu", weights_only=False)["format"] >= 1
    assert not list((results / "checkpoints").glob(".*.tmp")), "a torn temporary file was left behind"
    return saved


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_failed_checkpoint_write_keeps_the_last_one_and_the_rerun_resumes(uninterrupted, tmp_path, monkeypatch,
                                                                              code):
    protocol, plain = uninterrupted
    results = tmp_path / "results"
    with monkeypatch.context() as patch:
        failed = fail_writes(patch, code, lambda p: p.parent.name == "checkpoints" and p.name.startswith("run-"),
                             after=3)
        broken = bench(*run_args(protocol, results, "--no-mlflow"))
    assert failed, "the fault was never injected"
    assert broken.exit_code == STORAGE_EXIT, broken.output
    assert_one_paragraph(broken.output, f"Could not write the", str(failed[0]), os.strerror(code),
                         "The last good checkpoint is intact", "run the same command")
    assert assert_checkpoints_readable(results), "the checkpoints written before the fault are gone"
    assert [r.label for _, r in iter_results(results)] == ["joint"]  # stored before the fault, kept

    resumed = bench(*run_args(protocol, results, "--no-mlflow"))
    assert resumed.exit_code == 0, resumed.output
    assert "Resuming" in resumed.output
    assert differences(plain, results) == []
    assert not list((results / "checkpoints").glob("*.pt"))


def test_a_failed_result_write_keeps_the_checkpoint_and_a_copy_and_the_rerun_writes_it(uninterrupted, tmp_path,
                                                                                     monkeypatch):
    protocol, plain = uninterrupted
    results, rescue = tmp_path / "results", tmp_path / "rescue"
    monkeypatch.setattr(atomic, "rescue_folder", lambda: rescue)
    with monkeypatch.context() as patch:  # the joint reference is stored; the run's own result is not
        failed = fail_writes(patch, errno.ENOSPC, lambda p: "runs" in p.parts and p.parent.name == METHOD)
        broken = bench(*run_args(protocol, results, "--no-mlflow"))
    assert failed and broken.exit_code == STORAGE_EXIT, broken.output
    assert_one_paragraph(broken.output, str(failed[0]), "No space left on device", str(rescue / failed[0].name),
                         "last checkpoint is kept", "not both")
    assert (rescue / failed[0].name).is_file()
    assert assert_checkpoints_readable(results)

    resumed = bench(*run_args(protocol, results, "--no-mlflow"))
    assert resumed.exit_code == 0, resumed.output
    assert "Resuming" in resumed.output
    assert differences(plain, results) == []


def test_a_failed_mlflow_write_warns_once_keeps_the_result_and_sync_mirrors_it(uninterrupted, tmp_path, monkeypatch,
                                                                              seeded_store):
    from mlflow.tracking import MlflowClient

    protocol, plain = uninterrupted
    results = seeded_store(tmp_path / "results")
    calls = []
    real = MlflowClient.log_batch

    def log_batch(self, run_id, metrics=(), *args, **kwargs):
        if any(m.key.startswith("acc_") for m in metrics):  # the live accuracy points, during training
            calls.append(run_id)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, run_id, metrics, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(MlflowClient, "log_batch", log_batch)
        broken = bench(*run_args(protocol, results))
    assert calls, "the fault was never injected"
    assert broken.exit_code == 2, broken.output
    assert_one_paragraph(broken.output, "No space left on device", "bench sync --results")
    assert broken.output.count("Warning: MLflow tracking store") == 1  # once, not per eval point
    assert differences(plain, results) == []  # the run itself went on to the end

    synced = bench("sync", "--results", str(results))
    assert synced.exit_code == 0, synced.output
    assert "1 added" in synced.output or "2 added" in synced.output


def test_a_storage_fault_outside_the_atomic_path_is_one_paragraph_too(tmp_path, monkeypatch):
    """A write that is not a checkpoint or result (here: the table file of a sweep's output) still gets
    the paragraph and the exit code, never a traceback."""
    from bench_stability_gap.harness import cli

    def explode(*args, **kwargs):
        raise RuntimeError("writer failed") from OSError(errno.EIO, os.strerror(errno.EIO), str(tmp_path / "x"))

    monkeypatch.setattr(cli, "print_summary", explode)
    monkeypatch.setattr("bench_stability_gap.harness.run.pipeline.execute", lambda *a, **k: (None, tmp_path / "x"))
    out = bench("run", "-p", "tiny_cil", "--results-dir", str(tmp_path / "r"), "--no-mlflow")
    assert out.exit_code == STORAGE_EXIT, out.output
    assert_one_paragraph(out.output, "Input/output error", str(tmp_path / "x"), "run the same command")


def test_a_full_disk_at_the_predictions_keeps_the_result_and_closes_the_mlflow_run(uninterrupted, tmp_path,
                                                                                   monkeypatch, seeded_store):
    """The npz goes through the atomic path: no torn file, a message naming it and what it held, the
    result and its MLflow run (closed, never left RUNNING) kept, and no claim that a rerun resumes."""
    from mlflow.tracking import MlflowClient

    protocol, plain = uninterrupted
    results = seeded_store(tmp_path / "results")
    with monkeypatch.context() as patch:
        failed = fail_writes(patch, errno.ENOSPC, lambda p: p.name.endswith(".predictions.npz"))
        broken = bench(*run_args(protocol, results, "--save-predictions"))
    assert failed and broken.exit_code == STORAGE_EXIT, broken.output
    assert_one_paragraph(broken.output, "No space left on device", str(failed[0]), "per-sample predictions of",
                         "result is stored in", "trains a new run")
    assert "it resumes" not in broken.output
    assert not list(results.rglob("*.predictions.npz")) and not list(results.rglob(".*.tmp"))
    assert differences(plain, results) == []  # the result itself is stored whole
    client = MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert runs and all(r.info.status == "FINISHED" for r in runs), [r.info.status for r in runs]
