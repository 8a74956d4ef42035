"""The eval copy's fast deepcopy (harness/model/module_copy.py) makes the object graph ``copy.deepcopy`` makes:
same classes, same values, the same sharing, nothing of the original reachable from the copy."""

from __future__ import annotations

import copy
import types
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from bench_stability_gap.harness.model.module_copy import deepcopy_with_modules


def same_graph(a: Any, b: Any) -> None:
    """``a`` and ``b`` are isomorphic object graphs: a bijection of ids, equal types, equal tensors and leaves."""
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}

    def go(x: Any, y: Any, path: str) -> None:
        assert type(x) is type(y), path
        if isinstance(x, types.MethodType):  # deepcopy rebinds a bound method to the copy of its object
            assert x.__func__ is y.__func__, path
            go(x.__self__, y.__self__, f"{path}.__self__")
            return
        if type(x) in (type(None), bool, int, float, str, bytes) or callable(x) and not isinstance(x, nn.Module):
            assert x == y or x is y, path
            return
        if id(x) in pairs or id(y) in back:
            assert pairs.get(id(x)) == id(y) and back.get(id(y)) == id(x), f"{path}: sharing differs"
            return
        pairs[id(x)], back[id(y)] = id(y), id(x)
        if isinstance(x, Tensor):
            assert torch.equal(x, y) and x.requires_grad == y.requires_grad and x.dtype == y.dtype, path
            return
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y), path
            return
        if isinstance(x, dict):
            assert list(x) == list(y), path
            for k in x:
                go(x[k], y[k], f"{path}[{k!r}]")
        elif isinstance(x, (list, tuple)):
            assert len(x) == len(y), path
            for i, (u, v) in enumerate(zip(x, y)):
                go(u, v, f"{path}[{i}]")
        elif isinstance(x, set):
            assert x == y, path
        elif hasattr(x, "__dict__"):
            go(vars(x), vars(y), path)

    go(a, b, "obj")


class OwnCopy(nn.Linear):
    """A module that copies itself its own way (the fast path must hand it to deepcopy)."""

    def __deepcopy__(self, memo):
        clone = nn.Linear.__new__(OwnCopy)
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        clone.copied_by_itself = True
        return clone


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight  # tied
        self.conv = nn.Conv2d(2, 2, 3)  # _ConvNd: its own __setstate__
        self.own = OwnCopy(4, 2)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scratch", torch.arange(3.0), persistent=False)
        self.register_buffer("tail", self.scratch[1:])  # a buffer viewing another's storage, at an offset
        self.register_buffer("cols", torch.arange(6.0).view(2, 3).t())  # not contiguous: its strides kept
        self.register_buffer("tagged", torch.zeros(2))
        self.tagged.note = "kept"  # a tensor carrying attributes: deepcopy's own path
        self.shared_list: list = []
        self.a.notes = self.shared_list  # one list, two attributes
        self.view = self.bn.running_mean[:2]  # a view: shares its storage with a buffer
        self.empty = nn.Sequential()
        self.calls: list[int] = []
        self.a.register_forward_hook(self._count)  # a bound-method hook: rebound to the copy by deepcopy

    def _count(self, *_args) -> None:
        self.calls.append(1)

    def forward(self, x: Tensor) -> Tensor:
        return self.own(self.b(self.a(x)))


class Holder:
    """A method-like object: a model, a modifier holding the same model, harness objects lent to it."""

    def __init__(self, lent: Any) -> None:
        self.model = Net()
        self.lent = lent
        self.modifiers = [type("Mod", (), {})()]
        self.modifiers[0].model = self.model
        self.modifiers[0].teacher = nn.Linear(4, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)


def test_the_fast_copy_is_the_graph_deepcopy_makes_sharing_what_memo_shares():
    lent = {"harness": np.arange(5)}
    h = Holder(lent)
    h.model(torch.ones(1, 4))
    slow = copy.deepcopy(h, {id(lent): lent})
    fast = deepcopy_with_modules(h, {id(lent): lent})
    same_graph(slow, fast)
    originals = {id(o) for o in gc_reachable(h)}
    shared = {id(o) for o in gc_reachable(fast)} & originals  # what the copy reaches of the original:
    assert shared == {id(o) for o in gc_reachable(slow)} & originals  # what deepcopy's does (lent, immutables)
    assert not [o for o in gc_reachable(fast) if id(o) in shared and isinstance(o, (list, Tensor, nn.Module))]
    assert fast.lent is lent and fast.model.b.weight is fast.model.a.weight and fast.model.a.notes is fast.model.shared_list
    assert fast.model.own.copied_by_itself and fast.modifiers[0].model is fast.model
    assert fast.model.view.untyped_storage().data_ptr() == fast.model.bn.running_mean.untyped_storage().data_ptr()
    m = fast.model
    assert m.tail.untyped_storage().data_ptr() == m.scratch.untyped_storage().data_ptr() != \
        h.model.scratch.untyped_storage().data_ptr() and m.tail.storage_offset() == 1
    assert m.cols.stride() == h.model.cols.stride() == slow.model.cols.stride() and m.tagged.note == "kept"
    fast.model(torch.ones(1, 4))
    assert fast.model.calls == [1, 1] and h.model.calls == [1]  # the hook is the copy's own
    with torch.no_grad():
        fast.model.a.weight.add_(1.0)
    assert not torch.equal(fast.model.a.weight, h.model.a.weight)


def test_a_module_alone_copies_as_deepcopy_copies_it():
    net = Net()
    same_graph(copy.deepcopy(net), deepcopy_with_modules(net))


def gc_reachable(root: Any) -> list[Any]:
    """Everything reachable from ``root`` through containers and instance dicts."""
    seen: dict[int, Any] = {}
    todo = [root]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen[id(x)] = x
        if isinstance(x, dict):
            todo += [*x.keys(), *x.values()]
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo += list(x)
        elif hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x) or isinstance(x, nn.Module):
            todo.append(vars(x))
    return list(seen.values())
