"""Unit tests of what a method is lent and what it may keep (harness/run/isolation.py), on tiny objects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.run.isolation import (LentInputs, MemoryView, ServedIds, random_streams,
                                                    retained_samples, train_view)
from bench_stability_gap.harness.run.memory import Memory
from bench_stability_gap.harness.run.referee import check_retained_samples, isolated_predict
from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec

SHAPE = (4, 2, 2)


def memory(capacity: int | None = 4, ids=(0, 1)) -> Memory:
    spec = MemorySpec(policy="reservoir", capacity=capacity) if capacity else MemorySpec(policy="unlimited")
    m = Memory(spec, np.arange(100) % 5, lambda g: 10,
               np.random.default_rng(0))
    m.add(ids)
    return m


class FakeStore:
    cached = True

    def __init__(self) -> None:
        self.asked: list[list[int]] = []

    def get(self, ids):
        self.asked.append(list(ids))
        return torch.zeros(len(ids), *SHAPE)


def test_lent_inputs_serve_the_memory_and_the_session_in_progress_only():
    store, mem = FakeStore(), memory()
    served = ServedIds(np.array([10, 11, 12]))
    lent = LentInputs(store, mem, "cheater", served)
    assert lent.get(np.array([0, 11])).shape == (2, *SHAPE)
    with pytest.raises(BenchError, match=r"'cheater'.*\[13\].*neither in the rehearsal memory nor in the session"):
        lent.get(np.array([0, 13]))
    assert store.asked == [[0, 11]]  # the refused request never reached the store
    served.ids = np.array([13])
    assert lent.get(np.array([13])).shape[0] == 1


def test_memory_view_is_read_only_and_hides_the_harness_generator():
    mem = memory()
    view = MemoryView(mem)
    assert view.ids == (0, 1) and len(view) == 2 and view.capacity == 4
    assert not hasattr(view, "rng") and not hasattr(view, "add")
    mem.add([2])
    assert view.ids == (0, 1, 2)  # a live view, not a snapshot


def test_train_view_has_no_test_split_and_refuses_writes(tiny_protocol):
    from bench_stability_gap.harness.data.stream import build_stream

    stream = build_stream(tiny_protocol, 0)
    view = train_view(stream, "peeker")
    with pytest.raises(BenchError, match=r"'peeker'.*'test'.*test split is the harness's alone"):
        view.test
    with pytest.raises(BenchError, match="test_ids"):
        view.test_ids(np.arange(3))
    with pytest.raises(ValueError):
        view.train.labels[0] = 3
    assert np.array_equal(view.train.labels, stream.train.labels) and len(view.sessions) == len(stream.sessions)


def test_the_streams_arrays_are_sealed_for_whoever_holds_them(tiny_protocol):
    """A method rewrote a future session's ids in begin_session (and read that session's inputs), relabelled
    train samples through ctx.memory.labels, and changed which classes count as new for P_delta; in a sweep,
    the runs after it were scored on the changed stream. Read-only views could be made writeable again."""
    from bench_stability_gap.harness.data.stream import build_stream

    stream = build_stream(tiny_protocol, 0)
    view = train_view(stream, "rewriter")
    arrays = [stream.train.labels, stream.test.labels, stream.pretrain_ids, stream.task_of_class,
              stream.train.offsets, view.train.labels]
    for session in view.sessions:
        arrays += [session.train_ids, session.classes, session.new_classes]
    for values in arrays:
        with pytest.raises(ValueError, match="read-only"):
            values[:1] = 0
        for target in (values, values.base, values[1:]):
            if isinstance(target, np.ndarray):
                with pytest.raises(ValueError, match="cannot set WRITEABLE flag"):
                    target.flags.writeable = True
    assert view.sessions[0] is stream.sessions[0]  # lent as they are: nothing to copy, nothing to write


def test_what_a_method_is_lent_takes_no_attributes_and_the_served_session_is_the_harness_s(tiny_protocol):
    """ctx.inputs took any attribute (a place to keep test inputs past an eval point, or samples past the
    storage cap), and its `current` ids could be set by the method to every id of the stream."""
    from bench_stability_gap.harness.data.stream import build_stream

    served = ServedIds(np.array([10, 11]))
    lent = [LentInputs(FakeStore(), memory(), "hoarder", served), MemoryView(memory()),
            train_view(build_stream(tiny_protocol, 0), "hoarder")]
    for obj in lent:
        with pytest.raises((AttributeError, TypeError)):
            obj.kept = [torch.ones(2)]
        assert not hasattr(obj, "__dict__"), type(obj)
    with pytest.raises(AttributeError):
        lent[0].current = np.arange(100)
    with pytest.raises(BenchError, match=r"\[50\]"):
        lent[0].get(np.array([50]))
    served.ids = np.array([50])  # the harness opens the next session
    assert lent[0].get(np.array([50])).shape[0] == 1 and lent[0].current.tolist() == [50]


def test_random_streams_keep_the_harness_stream_and_give_the_method_an_independent_one():
    s = random_streams(7)
    assert np.array_equal(s.harness.integers(0, 1000, 5), np.random.default_rng(7).integers(0, 1000, 5))
    assert torch.equal(torch.rand(3, generator=s.harness_torch), torch.rand(3, generator=torch.Generator().manual_seed(7)))
    assert np.array_equal(random_streams(7).method.integers(0, 1 << 30, 5), random_streams(7).method.integers(0, 1 << 30, 5))
    assert not np.array_equal(random_streams(7).method.integers(0, 1 << 30, 5), np.random.default_rng(7).integers(0, 1 << 30, 5))
    assert random_streams(7).method_torch.initial_seed() != 7
    # drawing from, or rewinding, the method's streams leaves the harness's where they were
    t = random_streams(7)
    t.method.integers(0, 10, 1000)
    t.method.bit_generator.state = random_streams(7).method.bit_generator.state
    torch.rand(100, generator=t.method_torch)
    assert np.array_equal(t.harness.integers(0, 1000, 5), np.random.default_rng(7).integers(0, 1000, 5))
    assert torch.equal(torch.rand(3, generator=t.harness_torch), torch.rand(3, generator=torch.Generator().manual_seed(7)))


class Holder:
    name = "hoarder"

    def __init__(self) -> None:
        self.model = nn.Linear(16, 16)          # parameters are the model, never counted
        self.model.register_buffer("stash", torch.zeros(3, *SHAPE))  # a buffer holding samples is
        self.kept = {"batch": torch.zeros(5, *SHAPE), "one": np.zeros(SHAPE), "logits": torch.zeros(5, 10)}
        self.alias = self.kept["batch"]         # the same storage twice counts once


def test_retained_samples_counts_input_shaped_rows_once_wherever_they_are():
    rows, where = retained_samples(Holder(), SHAPE, skip=[])
    assert rows == 3 + 5 + 1
    assert any("stash" in w for w in where) and any("'batch'" in w for w in where)


def test_storage_cap_counts_memory_plus_retained_rows_and_the_declared_allowance():
    h = Holder()
    mem = memory(capacity=12, ids=(0, 1, 2, 3))          # 4 stored + 9 retained = 13 > 12
    with pytest.raises(BenchError, match=r"'hoarder' keeps 9 samples.*beside 4 in the memory.*cap is 12"):
        check_retained_samples(h, mem, SHAPE, skip=[])
    h.retained_allowance = 1
    check_retained_samples(h, mem, SHAPE, skip=[])       # 13 <= 12 + 1
    check_retained_samples(Holder(), memory(capacity=None), SHAPE, skip=[])  # unlimited storage: nothing to check


class Predictor:
    name = "predictor"

    def __init__(self, keep: bool = False) -> None:
        self.model = nn.Linear(4, 3)
        self.seen: list[torch.Tensor] = []
        self.keep = keep

    def predict(self, x):
        if self.keep:
            self.seen.append(x)
        return self.model(x)


def test_isolated_predict_runs_a_copy_and_leaves_the_method_as_it_was():
    m = Predictor()
    weight = m.model.weight.detach().clone()
    with isolated_predict(m, shared=[]) as predict:
        out = predict(torch.ones(2, 4))
    assert out.shape == (2, 3) and torch.equal(m.model.weight, weight) and m.seen == []


def test_a_predict_that_keeps_its_inputs_is_caught():
    m = Predictor(keep=True)
    with pytest.raises(BenchError, match=r"'predictor': predict\(\) changed its seen.*evaluation teaches a method nothing"):
        with isolated_predict(m, shared=[]) as predict:
            predict(torch.ones(2, 4))
    assert m.seen == []  # the original never saw them


def test_a_predict_that_trains_in_place_is_caught():
    class InPlace(Predictor):
        def predict(self, x):
            with torch.no_grad():
                self.model.bias.add_(1.0)
            return self.model(x)

    with pytest.raises(BenchError, match="changed its model.bias"):
        with isolated_predict(InPlace(), shared=[]) as predict:
            predict(torch.ones(1, 4))


def test_a_predict_that_writes_through_data_is_caught():
    """A write through ``.data`` bumps no version counter: the copy's digest stayed the same."""
    class Quiet(Predictor):
        def predict(self, x):
            self.model.bias.data.add_(x.mean())
            return self.model(x)

    with pytest.raises(BenchError, match="changed its model.bias"):
        with isolated_predict(Quiet(), shared=[]) as predict:
            predict(torch.ones(1, 4))


def test_a_predict_that_reaches_the_original_through_a_closure_and_trains_it_is_caught():
    """deepcopy copies a function by reference, so a closure over ``self`` leads the eval copy back to the
    original method: its predict trained the model the run goes on with, and nothing was reported."""
    class Backdoor(Predictor):
        def __init__(self) -> None:
            super().__init__()
            self.original = (lambda me: lambda: me)(self)

        def predict(self, x):
            target = self.original()
            for grad in (True, False):
                with torch.no_grad():
                    (target.model.weight if grad else target.model.bias).data.add_(0.5)
            return self.model(x)

    m = Backdoor()
    with pytest.raises(BenchError, match=r"predict\(\) changed its model\.(weight|bias)"):
        with isolated_predict(m, shared=[]) as predict:
            predict(torch.ones(1, 4))


@pytest.mark.parametrize("holder", ["closure", "function attribute", "partial", "callable object"])
def test_a_predict_that_keeps_inputs_in_a_callable_is_caught(holder):
    """Callables were not walked: a list in a closure, on a function, in a partial or on an object with
    __call__ kept test inputs past the eval point (and samples past the storage cap) unseen."""
    import functools

    def keeper():
        kept: list = []
        if holder == "closure":
            return (lambda v: kept.append(v)), kept
        if holder == "function attribute":
            def f(v): f.kept.append(v)
            f.kept = kept
            return f, kept
        if holder == "partial":
            return functools.partial(lambda box, v: box.append(v), kept), kept

        class Keeper:
            def __init__(self): self.kept = kept
            def __call__(self, v): self.kept.append(v)
        return Keeper(), kept

    class Stasher(Predictor):
        def __init__(self) -> None:
            super().__init__()
            self.keep_it, self.box = keeper()
            del self.box  # reachable through the callable only

        def predict(self, x):
            self.keep_it(x)
            return self.model(x)

    with pytest.raises(BenchError, match=r"predict\(\) changed its keep_it"):
        with isolated_predict(Stasher(), shared=[]) as predict:
            predict(torch.ones(1, 4))
    rows, where = retained_samples(Stasher(), SHAPE, [])  # and counted against the storage cap
    assert rows == 0
    hoarder = Stasher()
    hoarder.keep_it(torch.zeros(3, *SHAPE))
    rows, where = retained_samples(hoarder, SHAPE, [])
    assert rows == 3 and where[0].startswith("method.keep_it"), where


def test_a_part_shared_as_unused_is_not_copied_but_a_predict_that_changes_it_is_caught():
    class Trunked(Predictor):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Linear(4, 4)  # as a cached trunk: nothing reads it again

        def predict(self, x):
            with torch.no_grad():
                self.trunk.weight.mul_(2.0)
            return self.model(x)

    m = Trunked()
    with isolated_predict(Predictor(), shared=[], unused=[m.trunk]):
        pass
    with pytest.raises(BenchError, match="changed its trunk.weight"):
        with isolated_predict(m, shared=[], unused=[m.trunk]) as predict:
            assert predict.__self__.trunk is m.trunk and predict.__self__.model is not m.model
            predict(torch.ones(1, 4))


STASH: list = []


def test_a_predict_that_stashes_in_a_module_global_is_caught():
    class Global(Predictor):
        def predict(self, x):
            STASH.append(x)
            return self.model(x)

    with pytest.raises(BenchError, match=r"test_isolation\.STASH"):
        with isolated_predict(Global(), shared=[]) as predict:
            predict(torch.ones(1, 4))
    STASH.clear()
