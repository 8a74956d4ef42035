from __future__ import annotations

import numpy as np

from bench_stability_gap.harness.run.memory import Memory
from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec


def _memory(policy: str, capacity: int | None, labels, seed: int = 0) -> Memory:
    return Memory(MemorySpec(policy=policy, capacity=capacity), np.asarray(labels),
                  lambda gid: 10 + gid, np.random.default_rng(seed))


def test_unlimited_keeps_everything_and_counts_bytes():
    m = _memory("unlimited", None, [0, 0, 1, 1])
    m.add([0, 1, 2, 3])
    assert m.ids == [0, 1, 2, 3]
    assert m.bytes == 10 + 11 + 12 + 13 and m.peak_bytes == m.bytes and m.peak_samples == 4


def test_reservoir_respects_the_cap_and_is_seeded():
    labels = np.zeros(1000, dtype=int)
    a, b = _memory("reservoir", 50, labels), _memory("reservoir", 50, labels)
    a.add(range(1000))
    b.add(range(1000))
    assert len(a) == 50 and a.ids == b.ids
    assert a.bytes == sum(10 + g for g in a.ids)
    assert max(a.ids) > 500  # late samples do get in


def test_class_balanced_evicts_from_the_largest_class():
    # cap 4: after 0,1,2 (class 0) and 3 (class 1) the memory is full: {c0: 3, c1: 1}.
    labels = [0, 0, 0, 1, 1, 0]
    m = _memory("class_balanced", 4, labels)
    m.add([0, 1, 2, 3])
    m.add([4])  # class 1 sample: a class-0 sample is evicted -> {c0: 2, c1: 2}
    stored = np.asarray(labels)[m.ids]
    assert sorted(stored.tolist()) == [0, 0, 1, 1] and 4 in m.ids
    m.add([5])  # class 0 is (jointly) the largest: the sample is not taken
    assert 5 not in m.ids and len(m) == 4


def test_none_policy_stores_nothing_and_sampling_is_empty():
    m = _memory("none", None, [0, 1])
    m.add([0, 1])
    assert len(m) == 0 and len(m.sample(8)) == 0


def test_a_memory_state_dict_round_trips_ids_bytes_and_seen_count():
    m = _memory("reservoir", 3, np.zeros(10, dtype=int))
    m.add(range(10))
    n = _memory("reservoir", 3, np.zeros(10, dtype=int))
    n.load_state_dict(m.state_dict())
    assert n.ids == m.ids and n.bytes == m.bytes and n.seen == 10


def test_by_class_arrival_offers_a_session_in_the_datas_order_and_changes_what_survives():
    """A split memory (the published code's update_buffer): 4 S1 samples kept, 6 stream slots, a session of
    12 samples of 3 classes offered shuffled or in id order (class by class, as an unshuffled loader)."""
    labels = np.array([0] * 4 + [1] * 4 + [2] * 4 + [3] * 4)
    shuffled_ids = np.random.default_rng(3).permutation(np.arange(4, 16))

    def run(arrival, offered):
        spec = MemorySpec(policy="split", capacity=10, pretrain_share=0.4, arrival=arrival)
        m = Memory(spec, labels, lambda gid: 1, np.random.default_rng(0))
        m.add(range(4), pretrain=True)
        m.add(offered)
        return sorted(m.ids)

    by_class = run("by_class", shuffled_ids)
    assert by_class == run(None, np.sort(shuffled_ids))  # the same as offering the sorted ids
    assert by_class != run(None, shuffled_ids)  # the order changes which samples survive eviction
    assert by_class[:4] == [0, 1, 2, 3] and len(by_class) == 10


def test_the_id_array_and_membership_follow_every_eviction_and_a_reload():
    """The array and the per-id counts a draw and ``ctx.inputs.get`` read are kept beside ``ids``, not rebuilt
    from it: after reservoir evictions and a state_dict round trip they still say what ``ids`` says."""
    labels = np.zeros(3000, dtype=int)
    m = _memory("reservoir", 40, labels)
    m.add(range(2500))
    assert m.id_array().tolist() == m.ids
    assert m.holds(np.arange(3000)).tolist() == [g in set(m.ids) for g in range(3000)]
    back = _memory("reservoir", 40, labels, seed=1)
    back.load_state_dict(m.state_dict())
    assert back.id_array().tolist() == m.ids
    assert back.holds(np.arange(3000)).tolist() == m.holds(np.arange(3000)).tolist()
