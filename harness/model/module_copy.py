"""``copy.deepcopy`` of a method or model, with its modules copied without deepcopy's per-object cost.

Every eval point evaluates a throwaway copy of the method, and every run, joint model and contract check
starts from a copy of the deployed model. ``copy.deepcopy`` of a network spends its time
on the bookkeeping every ``nn.Module`` carries (a dozen hook dicts, mostly empty, each rebuilt through
``__reduce_ex__``): about 80 ms for EfficientNet-Lite0, where cloning its tensors takes a few. The copy
made here is the one deepcopy makes (same classes, a fresh tensor for every parameter and buffer, ties
kept, hooks and other attributes deep-copied through the same memo), built directly from each module's
state; a module whose class copies or pickles itself in its own way goes through deepcopy unchanged.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, TypeVar

from torch import Tensor, nn

T = TypeVar("T")

_ATOMIC = frozenset((type(None), bool, int, float, str))  # exact types: a subclass may carry state
_EMPTIABLE = frozenset((dict, OrderedDict, set, list))
# a class defining one of these copies its own way; __getstate__/__setstate__ are called below, as deepcopy calls them
_OWN_COPY = ("__deepcopy__", "__reduce_ex__", "__reduce__")


_PLAIN: dict[type, bool] = {}


def _plain(cls: type) -> bool:
    """True when ``cls`` copies as ``nn.Module`` does: no class between it and Module defines its own copy."""
    if cls not in _PLAIN:
        _PLAIN[cls] = not any(name in vars(c) for c in cls.__mro__ if c is not nn.Module and issubclass(c, nn.Module)
                              for name in _OWN_COPY)
    return _PLAIN[cls]


def _value(value: T, memo: dict[int, Any]) -> T:
    kind = type(value)
    if kind in _ATOMIC:
        return value
    if kind is tuple and all(type(v) in _ATOMIC for v in value):  # type: ignore[attr-defined]
        return value  # a conv's kernel_size or padding: deepcopy returns such a tuple itself, and memoises nothing
    if kind in _EMPTIABLE and not value and id(value) not in memo:  # the empty hook dicts: most of a module
        # remembered, so a container two attributes share stays shared (the module holding it keeps it alive
        # while it is copied, so its id cannot be reused: no _keep_alive needed)
        memo[id(value)] = empty = kind()
        return empty
    return copy.deepcopy(value, memo)


def _buffer(tensor: Tensor | None, memo: dict[int, Any]) -> Tensor | None:
    """``copy.deepcopy`` of a buffer, its common case (a plain, dense tensor that needs no gradient and carries
    no attributes: a norm layer's running statistics) taken directly: the same new storage, shared with any
    other copied tensor viewing the original's (deepcopy's storage memo), at the same offset, size and stride."""
    if (type(tensor) is not Tensor or id(tensor) in memo or tensor.requires_grad or tensor.is_sparse
            or tensor.is_quantized or tensor.is_conj() or tensor.is_neg() or tensor.device.type not in ("cpu", "cuda")
            or tensor.grad is not None or vars(tensor)):
        return copy.deepcopy(tensor, memo)
    storages = memo.setdefault("torch", {})  # type: ignore[call-overload]  # deepcopy's key for storages
    storage = tensor.untyped_storage()
    new = storages.get(storage._cdata)
    if new is None:
        new = storages[storage._cdata] = storage.clone()
    clone = tensor.new_empty([]).set_(new, tensor.storage_offset(), tensor.size(), tensor.stride())
    memo[id(tensor)] = clone
    return clone


def _module(module: nn.Module, memo: dict[int, Any]) -> nn.Module:
    if id(module) in memo:
        return memo[id(module)]
    if not _plain(type(module)):
        return copy.deepcopy(module, memo)
    clone = type(module).__new__(type(module))
    memo[id(module)] = clone
    copy._keep_alive(module, memo)  # type: ignore[attr-defined]  # as deepcopy does: no id reused while copying
    state: dict[str, object] = {}
    for key, value in module.__getstate__().items():
        if key == "_modules":
            state[key] = type(value)((n, None if m is None else _module(m, memo)) for n, m in value.items())
        elif key == "_buffers":
            state[key] = type(value)((n, _buffer(t, memo)) for n, t in value.items())
        elif key == "_parameters":
            state[key] = type(value)((n, copy.deepcopy(t, memo)) for n, t in value.items())
        else:
            state[key] = _value(value, memo)
    clone.__setstate__(state)
    return clone


# ``memo`` is deepcopy's: the copy made of each object, by the original's id, of any type (Any, as in typeshed)
def deepcopy_with_modules(obj: T, memo: dict[int, Any] | None = None) -> T:
    """``copy.deepcopy(obj, memo)``, its modules (attributes of ``obj``, of the objects in its ``modifiers``,
    or ``obj`` itself) copied directly. Objects already in ``memo`` are shared, as deepcopy shares them."""
    memo = {} if memo is None else memo
    holders = [obj, *getattr(obj, "modifiers", [])] if not isinstance(obj, nn.Module) else []
    roots = [obj] if isinstance(obj, nn.Module) else \
        [v for h in holders for v in vars(h).values() if isinstance(v, nn.Module)]
    for root in roots:
        _module(root, memo)
    return copy.deepcopy(obj, memo)
