"""How Ω weights a session's eval points (docs/fidelity.md): bench's interval weights, and the two
readings offered as ``compute_metrics`` options, each pinned on a hand-computed curve."""

from __future__ import annotations

import pytest

from bench_stability_gap.harness.results.curves import ReferenceSession
from bench_stability_gap.harness.results.metrics import compute_metrics, omega
from bench_stability_gap.harness.spec.protocol import load_protocol
from results_factory import curve

# one session, dense start: points at updates 0, 10, 20, 100
UPDATES, NEW = [0, 10, 20, 100], [0.2, 0.4, 0.6, 0.8]


@pytest.mark.parametrize(("weighting", "expected"), [
    ("interval", (10 * 0.4 + 10 * 0.6 + 80 * 0.8) / 100),   # 0.74: each point for the updates since the last
    ("points", (0.4 + 0.6 + 0.8) / 3),                       # 0.6: the points after update 0
    ("points_with_start", (0.2 + 0.4 + 0.6 + 0.8) / 4),      # 0.5: every point, update 0 included
])
def test_omega_weights_the_eval_points_as_named(weighting, expected):
    assert omega(UPDATES, NEW, 1.0, weighting) == pytest.approx(expected)
    assert omega(UPDATES, NEW, 0.5, weighting) == pytest.approx(2 * expected)


def test_compute_metrics_passes_the_weighting_to_every_gap():
    c = curve(2, 100, UPDATES, old=[0.9, 0.5, 0.7, 0.9], new=NEW, all_=[0.5, 0.5, 0.5, 0.5])
    joint = [ReferenceSession(session=2, old=1.0, new=1.0, all=1.0, tasks=[1.0, 1.0])]
    got = {w: compute_metrics([c], joint, {2: 1.0}, eval_weighting=w)
           for w in ("interval", "points", "points_with_start")}
    assert got["interval"].P_delta == pytest.approx(1 - 0.74)
    assert got["points"].P_delta == pytest.approx(1 - 0.6)
    assert got["points_with_start"].P_delta == pytest.approx(1 - 0.5)
    # S_Δ: interval (10 * .5 + 10 * .7 + 80 * .9) / 100 = .84; points (.5 + .7 + .9) / 3 = .7; with start 0.75
    assert [got[w].S_delta for w in ("interval", "points", "points_with_start")] == pytest.approx([0.16, 0.3, 0.25])
    # evenly spaced points: interval and points agree; counting update 0 does not
    even = curve(2, 30, [0, 10, 20, 30], old=[1, 1, 1, 1], new=[0.0, 0.3, 0.6, 0.9], all_=[1, 1, 1, 1])
    assert compute_metrics([even], joint, {2: 1.0}).P_delta == pytest.approx(
        compute_metrics([even], joint, {2: 1.0}, eval_weighting="points").P_delta)
    assert compute_metrics([even], joint, {2: 1.0}, eval_weighting="points_with_start").P_delta == pytest.approx(1 - 0.45)


def test_unknown_weighting_is_an_error():
    with pytest.raises(ValueError, match="unknown eval-point weighting"):
        omega(UPDATES, NEW, 1.0, "median")  # type: ignore[arg-type]


def test_the_texts_eval_cadence_has_a_protocol():
    # the paper's §5.1: "every 50 training iterations"; the code's vf = 100 is cil_places_lt's
    base, text = load_protocol("cil_places_lt"), load_protocol("cil_places_lt_every50")
    assert (base.eval.every, text.eval.every) == (100, 50)
    assert text.model_dump(exclude={"name", "version", "description", "paper_ref", "eval"}) == \
        base.model_dump(exclude={"name", "version", "description", "paper_ref", "eval"})


def test_compute_weighting_counts_each_point_for_the_training_flops_since_the_last():
    """Under a FLOP budget a point stands for the compute since the previous one: cumulative training
    FLOPs 5, 10, 30, 50 at the points (update 0 at 5 after begin_session's work) give weights 5, 20, 20."""
    flops = [5.0, 10.0, 30.0, 50.0]
    expected = (5 * 0.4 + 20 * 0.6 + 20 * 0.8) / 45  # 0.6667, where the update weighting gives 0.74
    assert omega(UPDATES, NEW, 1.0, "compute", flops) == pytest.approx(expected)
    with pytest.raises(ValueError, match="needs the training FLOPs"):
        omega(UPDATES, NEW, 1.0, "compute")
    with pytest.raises(ValueError, match="must grow"):
        omega(UPDATES, NEW, 1.0, "compute", [5.0, 10.0, 10.0, 50.0])
    c = curve(2, 100, UPDATES, old=[0.9, 0.5, 0.7, 0.9], new=NEW, all_=[0.5, 0.5, 0.5, 0.5])
    c.train_flops = flops
    joint = [ReferenceSession(session=2, old=1.0, new=1.0, all=1.0, tasks=[1.0, 1.0])]
    m = compute_metrics([c], joint, {2: 1.0}, eval_weighting="compute")
    assert m.S_delta == pytest.approx(1 - (5 * 0.5 + 20 * 0.7 + 20 * 0.9) / 45)
    assert m.P_delta == pytest.approx(1 - expected)
