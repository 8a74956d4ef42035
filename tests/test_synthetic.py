"""The synthetic source (real sizes without the datasets) and protocol files that extend another."""

from __future__ import annotations

import numpy as np
import pytest

from bench_stability_gap.harness.data.sources import long_tail_counts, open_source
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import DataSource, LongTail, load_protocol


def _source(**synthetic) -> DataSource:
    return DataSource.model_validate({"source": "synthetic", "synthetic": {
        "classes": 3, "train_per_class": 4, "test_per_class": 2, "image_size": 24, **synthetic}})


def test_images_are_a_function_of_the_sample_and_survive_subsets():
    train, test = open_source(_source())
    assert (len(train), len(test), train.num_classes) == (12, 6, 3)
    assert train.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    a = np.asarray(train.image(5))
    assert a.shape == (24, 24, 3) and a.dtype == np.uint8
    assert np.array_equal(a, np.asarray(open_source(_source())[0].image(5)))  # same in a new opening
    assert np.array_equal(np.asarray(train.subset([7, 5]).image(1)), a)
    assert not np.array_equal(np.asarray(train.image(4)), a)  # same class, another sample
    assert not np.array_equal(np.asarray(test.image(0)), np.asarray(train.image(0)))  # test keys differ
    assert train.sample_bytes(0) == 24 * 24 * 3 // 10


def test_long_tail_hits_head_tail_and_total():
    c = long_tail_counts(365, LongTail(total=62500, largest=4980, smallest=5))
    assert (int(c.sum()), int(c.max()), int(c.min()), len(c)) == (62500, 4980, 5, 365)
    assert np.all(np.diff(c[1:]) <= 0)
    flat = long_tail_counts(4, LongTail(total=10, largest=4, smallest=2))
    assert int(flat.sum()) == 10 and flat[0] >= flat[-1] == 2
    with pytest.raises(BenchError, match="cannot sum to total 10000"):
        long_tail_counts(10, LongTail(total=10000, largest=50, smallest=5))


def test_synthetic_counts_are_required_for_and_only_for_the_synthetic_source():
    with pytest.raises(ValueError, match="synthetic"):
        DataSource.model_validate({"source": "synthetic"})
    with pytest.raises(ValueError, match="synthetic"):
        DataSource.model_validate({"source": "mnist5k", "synthetic": {"classes": 2, "train_per_class": 1,
                                                                      "test_per_class": 1}})
    with pytest.raises(BenchError, match="takes no root"):
        open_source(DataSource.model_validate({"source": "synthetic", "root": "/x", "synthetic": {
            "classes": 2, "train_per_class": 1, "test_per_class": 1}}))


def test_a_protocol_file_extends_a_shipped_one_and_overrides_only_what_it_states(tmp_path):
    path = tmp_path / "variant.yaml"
    path.write_text("extends: cil_places_lt\nname: variant\ntraining: {updates: 7}\n"
                    "stream_data:\n  - {source: synthetic, synthetic: {classes: 365, train_per_class: 2, "
                    "test_per_class: 1}}\n")
    p, base = load_protocol(str(path)), load_protocol("cil_places_lt")
    assert p.name == "variant" and p.training.updates == 7
    assert p.training.batch == base.training.batch and p.backbone == base.backbone  # merged, not replaced
    assert [s.source for s in p.stream_data] == ["synthetic"]  # a list is replaced whole
    shipped = load_protocol("cil_places_lt_synthetic")
    assert shipped.backbone.trunk == base.backbone.trunk and shipped.backbone.weights == "none:"
    assert shipped.sessions == base.sessions and shipped.classes_per_session == base.classes_per_session


def test_a_protocol_file_extends_another_file_by_a_path_relative_to_it(tmp_path):
    """A chain of the user's own files: the base is read relative to the extending file, and merged under it."""
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "mine.yaml").write_text("extends: tiny_cil\nname: mine\ntraining: {updates: 9}\n")
    path = tmp_path / "variant.yaml"
    path.write_text("extends: base/mine.yaml\nname: variant\neval: {every: 5}\n")
    p, base = load_protocol(str(path)), load_protocol("tiny_cil")
    assert (p.name, p.training.updates, p.eval.every, p.eval.dense_every) == ("variant", 9, 5, base.eval.dense_every)
    assert p.training.batch == base.training.batch and p.backbone == base.backbone


@pytest.mark.parametrize("text, needle", [
    ("extends: no_such_protocol\n", "no_such_protocol"),
    ("extends: missing.yaml\n", "does not exist"),
    ("extends: [a]\n", "extends must name"),
])
def test_bad_extends_is_named(tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(BenchError, match=needle):
        load_protocol(str(path))


def test_extends_cycle_is_refused(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(BenchError, match="cycle"):
        load_protocol(str(tmp_path / "a.yaml"))
