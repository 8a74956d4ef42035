"""What a command says must be what is so, in few words: an impossible number anywhere in a result (its
``before`` points too) is refused and said wherever a result is read, a repeated sync repairs nothing, a
long value is cut where it is echoed, a dry run names the checkpoint a run resumes from, a finished study
leaves its tuned entry as it is, and messages are grammatical."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import support
import yaml
from results_factory import two_session_run
from support import invoke

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.results.schema import save_result


def _nan_before(root: Path) -> Path:
    """A stored result whose first session's ``before`` point records NaN on the old classes."""
    r = two_session_run("nanbefore")
    curve = r.curves[0]
    r.curves[0] = curve.model_copy(update={"before": curve.before.model_copy(update={"old": math.nan})})
    return save_result(root, r)


def test_a_nan_before_point_is_refused_by_validate_and_never_mirrored(tmp_path, seeded_store) -> None:
    from bench_stability_gap.harness.sweep.mirror import sync

    path = _nan_before(seeded_store(tmp_path / "results"))
    assert json.loads(path.read_text())["curves"][0]["before"]["old"] != json.loads(path.read_text())["curves"][0][
        "before"]["old"]  # NaN, as stored
    support.refused(invoke("validate", str(path)), f"Result file {path} is refused", "nan")
    report = sync(tmp_path / "results")
    assert report.added == [] and [p for p, _ in report.skipped] == [path], report


def test_a_stored_result_with_impossible_numbers_is_said_when_a_run_passes_it_over(tmp_path, capsys) -> None:
    """A run that finds its stored result refused trains it again: it says why, as for a truncated file."""
    from bench_stability_gap.harness.results.comparability import stored_selection
    from bench_stability_gap.harness.results.schema import load_result

    fixtures = Path(__file__).parent / "browser" / "fixtures"
    r = next(x for x in map(load_result, sorted(fixtures.glob("*.json"))) if x.metrics is not None)
    path = save_result(tmp_path, r.model_copy(update={"metrics": r.metrics.model_copy(update={"S_delta": math.nan})}))
    sel = stored_selection(tmp_path, r.protocol.name, r.protocol.hash, ["vanilla"])
    assert [x[0] for x, _ in sel.apart] == [path]
    said = capsys.readouterr().err
    assert f"skipped {path}: refused: metrics.S_delta is nan" in said, said


def test_a_second_sync_of_an_unchanged_folder_repairs_nothing(tmp_path, seeded_store) -> None:
    """A second file with a run id already read (a copy) is skipped, naming the first, on every sync: it
    was left out of the first sync (its run logged a file earlier) and then 'repaired' into the record."""
    from bench_stability_gap.harness.sweep.mirror import sync

    results = seeded_store(tmp_path / "results")
    path = save_result(results, two_session_run("dup"))
    copy = path.with_name("zz-copy.json")  # read after the original (files are read sorted)
    shutil.copy(path, copy)
    first = sync(results)
    assert len(first.added) == 1 and first.repaired == [], first
    assert [(p, "duplicate" in why) for p, why in first.skipped] == [(copy, True)], first.skipped
    again = invoke("sync", "--results-dir", str(results))
    assert again.exit_code == 0 and "repaired" not in again.output, again.output
    assert f"skipped {copy}: duplicate of run dup already read from {path}" in again.output, again.output


def test_a_long_value_is_cut_where_it_is_echoed(tmp_path) -> None:
    """A 5,000-character method string (with spaces, so no single word is long) is echoed cut, its length
    said: by the CLI and by the Python API's refusal alike."""
    from bench_stability_gap.harness import api

    method = "a " * 2500
    out = invoke("run", "-m", method, "--results-dir", str(tmp_path / "r"), "--no-mlflow")
    support.refused(out, "[5,000 characters]", "contains whitespace")
    error = next(line for line in out.output.splitlines() if line.startswith("Error:"))
    assert len(error) < 600, error
    with pytest.raises(BenchError) as err:
        api.run("tiny_cil", method, results_dir=tmp_path / "r", mlflow=False)
    assert len(str(err.value)) < 600 and "[5,000 characters]" in str(err.value), str(err.value)


def test_a_dry_run_names_the_checkpoint_a_run_resumes_from(tmp_path, monkeypatch) -> None:
    from bench_stability_gap.harness.api import run_options
    from bench_stability_gap.harness.run.pipeline import _run_checkpointer
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.methods.registry import build_method, method_settings

    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))
    results = tmp_path / "r"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "resume", "seeds": [0],
                                     "runs": [{"protocol": "tiny_cil", "methods": ["vanilla", "lwf"]}]}))
    protocol = load_protocol("tiny_cil")
    options = run_options(results, "cpu")
    config = method_settings(build_method("vanilla", protocol, {})[1])
    saver = _run_checkpointer(options, options.identity(protocol, "vanilla", 0, config, {}), restart=False)
    saver.mid_path.parent.mkdir(parents=True)
    saver.mid_path.write_bytes(b"a checkpoint a stop left")  # the dry run reads no checkpoint: it names it
    out = invoke("sweep", str(sweep), "--dry-run", "--device", "cpu", "--results-dir", str(results))
    assert out.exit_code == 0, out.output
    lines = {line.split("] ")[1].split(":")[0]: line for line in out.output.splitlines() if "] tiny_cil" in line}
    assert f"resumes from its checkpoint {saver.mid_path}" in lines["tiny_cil vanilla seed 0"], out.output
    assert lines["tiny_cil lwf seed 0"].endswith(": to run"), out.output


def test_a_finished_study_leaves_its_tuned_entry_untouched(tmp_path) -> None:
    from test_tuning_trials_board import TUNED

    from bench_stability_gap.harness.results.tuned import TunedEntry, save_entry

    entry = TunedEntry.model_validate(TUNED)
    path, kept = save_entry(tmp_path, entry)
    os.utime(path, ns=(1, 1))
    before = path.stat()
    assert save_entry(tmp_path, entry) == (path, None)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_the_claim_of_the_a_best_reference_set_reads_as_a_sentence(tmp_path, monkeypatch) -> None:
    """The claim's text is the subject of "... is being computed by ...": singular."""
    from types import SimpleNamespace

    from bench_stability_gap.harness.run import pipeline
    from bench_stability_gap.harness.run.options import RunOptions
    from bench_stability_gap.harness.spec.protocol import load_protocol

    said: list[str] = []

    def claim(lock, what, wait, say):
        said.append(f"{what} is being computed by another process")
        raise StopIteration

    monkeypatch.setattr(pipeline, "claim", claim)
    monkeypatch.setattr(pipeline, "selection", lambda *args: SimpleNamespace(runs={}))
    with pytest.raises(StopIteration):
        pipeline._best_new_references(load_protocol("tiny_cil"), SimpleNamespace(weights=None), 0, None, None,
                                      RunOptions(results_dir=tmp_path))
    assert said and " runs of " not in said[0], said
