from __future__ import annotations

import numpy as np
import yaml

from bench_stability_gap.harness.spec.protocol import parse_protocol
from bench_stability_gap.harness.data.stream import build_stream
from support import reduced_tiny


def _stream(seed: int, ordering: str = "cil"):
    spec = reduced_tiny("tiny_cil" if ordering == "cil" else "tiny_iid")
    return build_stream(parse_protocol(yaml.safe_dump(spec), "t"), seed)


def test_cil_sessions_bring_disjoint_classes_in_introduction_order():
    s = _stream(0)
    assert s.pretrain_classes == 10 and len(s.sessions) == 4
    for k, session in enumerate(s.sessions):
        expected = np.arange(10 + 5 * k, 15 + 5 * k)  # labels renumbered by introduction
        assert np.array_equal(session.classes, expected)
        assert np.array_equal(session.new_classes, expected)
        assert session.seen_classes == 15 + 5 * k
        assert set(s.train.labels[session.train_ids]) == set(expected)
        assert len(session.train_ids) == 5 * 40
    assert np.array_equal(s.classes_before(3), np.arange(15))
    assert s.task_of_class.tolist() == [0] * 10 + sum(([k] * 5 for k in range(1, 5)), [])


def test_class_order_follows_the_seed():
    a, b, c = _stream(0), _stream(0), _stream(1)
    names = lambda s: [s.class_names[i] for i in range(10, 30)]  # noqa: E731
    assert names(a) == names(b)
    assert names(a) != names(c)
    assert np.array_equal(a.sessions[0].train_ids, b.sessions[0].train_ids)


def test_iid_sessions_mix_classes_and_split_samples_evenly():
    s = _stream(0, "iid")
    sizes = [len(x.train_ids) for x in s.sessions]
    assert sum(sizes) == 20 * 40 and max(sizes) - min(sizes) <= 1
    assert len(s.sessions[0].classes) > 10  # random samples of the 20 stream classes
    all_ids = np.concatenate([x.train_ids for x in s.sessions])
    assert len(np.unique(all_ids)) == len(all_ids)


def test_the_eval_set_holds_5_test_images_of_every_class():
    s = _stream(0)
    ids = s.test_ids(np.arange(30))
    counts = np.bincount(s.test.labels[ids], minlength=30)
    assert (counts == 5).all()
