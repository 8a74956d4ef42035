"""The old half of a batch by source (pre-training data vs earlier sessions), on cil_places_lt_synthetic's
memory: the two readings draw what the plan declares, and the plan's numbers are hand-checkable."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bench_stability_gap.harness.data.old_mix import Shares, by_source_shares, describe_old_mix, plan_old_mix
from bench_stability_gap.harness.data.stream import build_stream
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.run.memory import Memory
from bench_stability_gap.harness.spec.protocol import load_protocol

DRAWS = 100  # batches counted per session where the shares are a proportion (a statistical check)
EXACT_DRAWS = 10  # where every batch must hold the fixed shares exactly (each batch is checked on its own)


@pytest.fixture(scope="module")
def synthetic():
    """The protocol, its stream, and the memory as the runner fills it before the first session (its 1.28M
    pre-training ids, offered one by one: seconds, so made once and copied for each test)."""
    protocol = load_protocol("cil_places_lt_synthetic")
    stream = build_stream(protocol, 0)
    memory = Memory(protocol.memory, stream.train.labels, lambda gid: 0, np.random.default_rng(7))
    memory.add(stream.pretrain_ids, pretrain=True)
    return protocol, stream, memory


def _with_mix(protocol, mix):
    return protocol.model_copy(update={"training": protocol.training.model_copy(update={"old_mix": mix})})


def _counted(protocol, stream, filled: Memory, draws: int):
    """Per session: mean new, pre-training and earlier-session samples per batch over ``draws`` batches,
    drawn as the runner draws them (continual.run_cl's ``draw``) from the memory the runner fills (a copy
    of ``filled``, the memory before the first session). Each draw converts the memory's 1.28M ids to an
    array (about 50 ms), which is what the time of these tests goes to."""
    b = protocol.training.batch
    memory = copy.deepcopy(filled)
    boundary = int(stream.train.offsets[1])
    out = []
    for pos, session in enumerate(stream.sessions):
        shares = by_source_shares(protocol, pos, b.new, b.old)
        counts = np.zeros(3)
        for _ in range(draws):
            if shares is None:
                new, old = b.new, memory.sample(b.old)
            else:
                new, old = shares.new, memory.sample_by_source(shares.pretrain, shares.earlier, boundary)
                assert (np.sum(old < boundary), np.sum(old >= boundary)) == (shares.pretrain, shares.earlier)
            assert len(old) == b.old + (b.new - new)  # the batch keeps its size
            counts += [new, np.sum(old < boundary), np.sum(old >= boundary)]
            assert np.all(stream.task_of_class[stream.train.labels[old[old >= boundary]]] < pos + 1)  # earlier only
        out.append(counts / draws)
        memory.add(session.train_ids)
    return out


@pytest.mark.slow
def test_by_source_draws_the_codes_fixed_shares_in_every_batch(synthetic):
    protocol, stream, filled = synthetic
    protocol = _with_mix(protocol, "by_source")
    plan = plan_old_mix(protocol, stream)
    measured = _counted(protocol, stream, filled, EXACT_DRAWS)
    # the code's loaders at B = 64 new + 64 old: first session 64 + 64 ImageNet; then 48 + 64 ImageNet + 16 Places
    assert [(m.shares.new, m.shares.pretrain, m.shares.earlier) for m in plan] == [(64, 64, 0)] + [(48, 64, 16)] * 4
    for got, m in zip(measured, plan):
        assert got.tolist() == [m.shares.new, m.shares.pretrain, m.shares.earlier]  # every batch, exactly
    text = describe_old_mix(plan)
    assert "session 3: 48 new + 64.00 pre-training + 16.00 earlier sessions" in text


@pytest.mark.slow
def test_pooled_draws_each_source_in_proportion_to_what_memory_holds(synthetic):
    protocol, stream, filled = synthetic
    plan = plan_old_mix(protocol, stream)  # the protocol's default: pooled
    measured = _counted(protocol, stream, filled, DRAWS)
    pre = len(stream.pretrain_ids)
    assert pre == 1_281_167
    for pos, (got, m) in enumerate(zip(measured, plan)):
        earlier = sum(len(s.train_ids) for s in stream.sessions[:pos])
        assert (m.held_pretrain, m.held_earlier) == (pre, earlier)
        assert m.shares.earlier == pytest.approx(64 * earlier / (pre + earlier))  # hand computation
        assert m.shares.new == 64 and m.shares.pretrain + m.shares.earlier == pytest.approx(64)
        sigma = np.sqrt(64 * (m.shares.earlier / 64) * (1 - m.shares.earlier / 64) / DRAWS)
        assert abs(got[2] - m.shares.earlier) <= 5 * sigma + 1e-9, (pos, got, m)
        assert got[0] == 64
    assert plan[0].shares.earlier == 0 and plan[-1].shares.earlier > 1.5  # a few of 64, and growing
    assert f"session 6: 64 new + {plan[-1].shares.pretrain:.2f} pre-training" in describe_old_mix(plan)


def test_the_plan_is_printed_and_stored_with_the_data_path():
    from bench_stability_gap.harness.data.datapath import DataPathPlan, SplitPlan
    from bench_stability_gap.harness.data.old_mix import SessionMix, Shares

    split = SplitPlan("decode", 1, 0, 0, "")
    plan = DataPathPlan(split, split, (1,), "float32", 1, 1, 1, "/c",
                        old_mix=(SessionMix(3, "by_source", Shares(48, 64, 16), 10, 20),))
    assert "session 3: 48 new + 64.00 pre-training + 16.00 earlier" in plan.describe()
    assert plan.as_dict()["old_mix"][0]["shares"] == {"new": 48, "pretrain": 64, "earlier": 16}


def test_by_source_needs_an_old_half_and_the_pretraining_data():
    base = load_protocol("cil_places_lt_norehearsal").model_dump()
    base["training"]["old_mix"] = "by_source"
    from bench_stability_gap.harness.spec.protocol import Protocol

    with pytest.raises(Exception, match="old_mix 'by_source'"):
        Protocol.model_validate(base)
    with pytest.raises(BenchError, match="training.old_mix"):
        from bench_stability_gap.harness.spec.protocol import parse_protocol
        import yaml

        parse_protocol(yaml.safe_dump({**load_protocol("tiny_cil").model_dump(mode="json"),
                                       "training": {**load_protocol("tiny_cil").model_dump(mode="json")["training"],
                                                    "old_mix": "mixed"}}), "t")


def test_the_storage_limited_places365_standard_protocols_draw_as_train_sgm_py():
    """train_sgm.py (the one configured run): new at 128 and ImageNet at 128 in the first session, then
    new at 96, ImageNet at 128 and earlier Places at 32."""
    for name in ("cil_places_std_24k", "cil_places_std_192k"):
        p = load_protocol(name)
        assert by_source_shares(p, 0, 128, 128) == Shares(128, 128, 0)
        assert by_source_shares(p, 1, 128, 128) == by_source_shares(p, 4, 128, 128) == Shares(96, 128, 32)
    for name in ("cil_places_lt", "cil_places_std_unlimited", "tiny_cil"):  # no script configures these: the text's
        assert load_protocol(name).training.old_mix is None and by_source_shares(load_protocol(name), 1, 64, 64) is None
