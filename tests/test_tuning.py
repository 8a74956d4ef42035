"""Equal tuning: the validation split a tuning run is scored on (never the test split), and ``bench tune``
under a protocol's tuning ruleset, on the reduced embedded protocol (a few trials, seconds each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness import stream as stream_module
from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.data.sources import Split
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.isolation import train_view
from bench_stability_gap.harness.protocol import load_protocol, parse_protocol
from bench_stability_gap.harness.stream import build_stream
from bench_stability_gap.harness.workbench import RunOptions
from tests.conftest import reduced_tiny


def run_cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def with_validation(per_class: int = 5, **extra) -> dict:
    spec = reduced_tiny()
    spec["validation"] = {"per_class": per_class}
    spec.update(extra)
    return spec


@pytest.fixture()
def tunable(tmp_path, bench_cache) -> Path:
    path = tmp_path / "tiny_cil_reduced.yaml"
    path.write_text(yaml.safe_dump(with_validation(tuning={"trials": 2, "objective": "CK_delta"})))
    return path


class SealedSplit(Split):
    """A test split whose images may not be read: any read is an error (labels stay, as opening a
    source loads them)."""

    def __init__(self, inner: Split) -> None:
        self.labels, self.class_names, self.source = inner.labels, inner.class_names, inner.source

    @property
    def array(self):
        raise AssertionError(f"the test split of {self.source} was read")

    def image(self, index):
        raise AssertionError(f"the test split of {self.source} was read")

    def sample_bytes(self, index):
        raise AssertionError(f"the test split of {self.source} was read")

    def subset(self, indices):
        raise AssertionError(f"the test split of {self.source} was subset")


@pytest.fixture()
def sealed_test_split(monkeypatch):
    opener = stream_module.open_source
    monkeypatch.setattr(stream_module, "open_source",
                        lambda spec, field: (lambda tr, te: (tr, SealedSplit(te)))(*opener(spec, field=field)))


# ------------------------------------------------------------------ the validation split


def test_validation_is_held_out_of_training_and_scored_in_place_of_the_test_split(bench_cache):
    spec = parse_protocol(yaml.safe_dump(with_validation(5)), "reduced")
    test_run, tuning = build_stream(spec, 0), build_stream(spec.tuning_view(), 0)
    # a test run is what it was: every training sample, the test split, the same spec hash
    assert spec.spec_hash == parse_protocol(yaml.safe_dump(reduced_tiny()), "reduced").spec_hash
    assert len(test_run.pretrain_ids) == 10 * 60 and [len(s.train_ids) for s in test_run.sessions] == [200] * 4
    # the tuning view: 5 of every class's samples held out of S1 and each session, and evaluated on instead
    assert spec.tuning_view().spec_hash != spec.spec_hash
    assert len(tuning.pretrain_ids) == 10 * 55 and [len(s.train_ids) for s in tuning.sessions] == [175] * 4
    trained = set(tuning.session_ids(5).tolist())
    assert len(tuning.test) == 30 * 5 and np.array_equal(np.bincount(tuning.test.labels), [5] * 30)
    assert all(split.source for split in tuning.test.splits)
    held = set(range(len(tuning.train))) - trained
    assert len(held) == 150
    # the same images: the validation catalog is the held-out train samples, labels kept
    for gid in sorted(held)[:: 37]:
        pos = sorted(held).index(gid)
        assert tuning.test.labels[pos] == tuning.train.labels[gid]
    # the same held-out samples for every run seed (trials at other seeds see the same split)
    other = build_stream(spec.tuning_view(), 1)
    assert set(other.session_ids(5).tolist()) == trained


def test_a_method_asking_for_the_test_split_in_a_tuning_run_fails_as_in_any_run(bench_cache):
    spec = parse_protocol(yaml.safe_dump(with_validation(5)), "reduced").tuning_view()
    with pytest.raises(BenchError, match="test split is the harness's alone"):
        train_view(build_stream(spec, 0), "peeker").test


def test_a_tuning_run_never_reads_the_test_split(tunable, tmp_path, sealed_test_split):
    from bench_stability_gap.harness.pipeline import execute

    spec = load_protocol(str(tunable))
    options = RunOptions(results_dir=tmp_path / "r", progress=False, log=False)
    # the seal bites: a test run reads the test split at once
    with pytest.raises(AssertionError, match="test split of .* was read"):
        execute(spec, "vanilla", 0, options)
    # a tuning run (its joint and A_best references included) is scored on validation alone
    result, _ = execute(spec.tuning_view(), "vanilla", 0, options)
    assert result.status == "complete" and result.metrics is not None
    assert result.protocol.hash == spec.tuning_view().spec_hash


def test_a_validation_split_larger_than_a_class_is_refused_naming_the_field(tmp_path, bench_cache):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(with_validation(40)))  # the stream sources hold 40 per class
    out = run_cli("validate", str(path))
    assert out.exit_code == 2 and "validation.per_class (40)" in out.output and "stream_data[0]" in out.output
    # counts the spec does not fix are checked when the data opens, before any training
    data = load_protocol("tiny_cil").model_dump(mode="json")
    data["stream_data"][1]["train_per_class"] = None
    spec = parse_protocol(yaml.safe_dump({**data, "validation": {"per_class": 420}}), "big")
    with pytest.raises(BenchError, match=r"validation\.per_class \(420\) is not smaller than the 400 training "
                                         r"samples of class .* of stream_data\[0\]"):
        build_stream(spec.tuning_view(), 0)
    with pytest.raises(BenchError, match="declares no validation split"):
        load_protocol("tiny_cil").tuning_view()
