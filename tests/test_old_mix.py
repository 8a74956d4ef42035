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


def test_a_tiled_source_draws_each_stored_id_floor_or_ceil_times_seeded():
    """The published loaders' draw (``training.source_draw: tiled``): 13 updates of 4 pre-training and 3
    earlier samples over 10 and 7 stored ids are 52 and 39 draws, so n = 5.2 and 5.57: each pre-training id
    is drawn 5 or 6 times, the first 2 of the list (52 - 50) the sixth time; each earlier id 5 or 6 times,
    the first 4 (39 - 35) the sixth. The same seed gives the same order; another seed, another."""
    from bench_stability_gap.harness.data.old_mix import SourceTiles

    stored = np.array([103, 100, 101, 102, 104, 105, 106, 7, 3, 0, 1, 2, 4, 5, 6, 8, 9])  # storage order
    tiles = SourceTiles(stored, 100, Shares(new=9, pretrain=4, earlier=3), 13, np.random.default_rng(5))
    drawn = [tiles.take(4, 3) for _ in range(13)]
    assert all(len(b) == 7 and np.all(b[:4] < 100) and np.all(b[4:] >= 100) for b in drawn)
    counts = dict(zip(*np.unique(np.concatenate(drawn), return_counts=True)))
    assert {g: counts[g] for g in (7, 3, 0, 1, 2, 4, 5, 6, 8, 9)} == {7: 6, 3: 6, 0: 5, 1: 5, 2: 5, 4: 5, 5: 5,
                                                                      6: 5, 8: 5, 9: 5}
    assert {g: counts[g] for g in range(100, 107)} == {103: 6, 100: 6, 101: 6, 102: 6, 104: 5, 105: 5, 106: 5}
    again = SourceTiles(stored, 100, Shares(9, 4, 3), 13, np.random.default_rng(5))
    assert all(np.array_equal(a, again.take(4, 3)) for a in drawn)
    other = SourceTiles(stored, 100, Shares(9, 4, 3), 13, np.random.default_rng(6))
    assert not all(np.array_equal(a, other.take(4, 3)) for a in drawn)
    with pytest.raises(RuntimeError, match="ran out"):
        tiles.take(4, 3)


def test_source_draw_is_by_source_only_and_tiled_needs_a_count_of_updates():
    from bench_stability_gap.harness.spec.protocol import Protocol

    base = load_protocol("cil_places_std_24k").model_dump()
    assert base["training"]["source_draw"] == "tiled"
    for change, message in (({"old_mix": None}, "needs training.old_mix: by_source"),
                            ({"updates": "per_sample"}, "needs a count of updates"),
                            ({"class_balanced": True}, "not a class-balanced draw")):
        spec = {**base, "training": {**base["training"], **change}}
        with pytest.raises(Exception, match=message):
            Protocol.model_validate(spec)
    # unset is the per-batch draw: another spec, ranked apart
    plain = {**base, "training": {**base["training"], "source_draw": None}}
    assert Protocol.model_validate(plain).spec_hash != load_protocol("cil_places_std_24k").spec_hash


def _tiled_bench(small_workbench):
    """The reduced tiny workbench, by source and tiled, on a split memory of 20 pre-training and 20 stream
    samples: 12 updates of 6 new + 8 pre-training + 2 earlier samples draw 96 over 20 (n = 4.8) and, from
    the second session on, 24 over 20 (n = 1.2)."""
    import dataclasses

    from bench_stability_gap.harness.spec.protocol import Protocol

    spec = small_workbench.protocol.model_dump()
    spec["training"].update(updates=12, old_mix="by_source", source_draw="tiled")
    spec["memory"] = {"policy": "split", "capacity": 40, "pretrain_share": 0.5, "include_pretrain": True}
    spec["eval"].update(every=1000, dense_every=None, dense_until=0)
    return dataclasses.replace(small_workbench, protocol=Protocol.model_validate(spec))


class _Killed(Exception):
    pass


@pytest.mark.slow
def test_a_tiled_session_sees_each_stored_id_floor_or_ceil_times_and_resumes_to_the_bit(small_workbench, tmp_path,
                                                                                          monkeypatch):
    from bench_stability_gap.harness.run import loop
    from bench_stability_gap.harness.run.checkpoint import Checkpointer
    from bench_stability_gap.harness.run.continual import ContinualRun, run_cl
    from bench_stability_gap.harness.run.options import RunOptions
    from bench_stability_gap.methods.registry import build_method

    bench = _tiled_bench(small_workbench)
    boundary = int(bench.stream.train.offsets[1])
    options = RunOptions(results_dir=tmp_path / "results", progress=False, log=False)
    trained: dict[tuple[int, int], np.ndarray] = {}
    plain_update = ContinualRun.update

    def recorded(self, u, batch):
        trained[(self.open.pos, u)] = np.concatenate(batch).copy()
        plain_update(self, u, batch)

    monkeypatch.setattr(ContinualRun, "update", recorded)
    plain = run_cl(bench, build_method("vanilla", bench.protocol)[1], 0, options,
                   Checkpointer(tmp_path / "plain.pt", every=2))
    for pos in range(len(bench.stream.sessions)):
        old = np.concatenate([trained[(pos, u)][6 if pos else 8:] for u in range(12)])
        for part, draws in ((old[old < boundary], 96), (old[old >= boundary], 24 if pos else 0)):
            counts = np.unique(part, return_counts=True)[1]
            assert len(part) == draws and (not draws or len(counts) == 20)  # every stored id of the source drawn
            assert set(counts.tolist()) <= {draws // 20, -(-draws // 20)}  # floor(n) or ceil(n) times
    plain_trained = dict(trained)

    calls = [0]

    def die_in_the_second_session(phase: str) -> None:  # the 17th update: update 4 of the second session
        calls[0] += 1
        if calls[0] == 17:
            raise _Killed

    monkeypatch.setattr(loop, "maybe_die", die_in_the_second_session)
    saver = Checkpointer(tmp_path / "killed.pt", every=2)
    with pytest.raises(_Killed):
        run_cl(bench, build_method("vanilla", bench.protocol)[1], 0, options, saver)
    assert saver.load(mid=True)["loop"]["update"] == 4 and saver.load(mid=True)["own"]["session"]["tiles"] is not None
    monkeypatch.setattr(loop, "maybe_die", lambda phase: None)
    trained.clear()
    resumed = run_cl(bench, build_method("vanilla", bench.protocol)[1], 0, options,
                     Checkpointer(tmp_path / "killed.pt", every=2))
    assert min(trained) == (1, 4) and all(np.array_equal(ids, plain_trained[k]) for k, ids in trained.items())
    assert [c.model_dump() for c in resumed[0]] == [c.model_dump() for c in plain[0]]
