"""Fair play, enforced by the harness rather than trusted: what a method is lent, and what it may keep.

A submitted method runs in the harness's process, so nothing here stops code that goes looking for
the harness's objects through the garbage collector or the file system; what it does guarantee is that
nothing a method is *lent* leads to data or randomness it may not use. The rules themselves, when each
is checked and its message, are ``referee.RULES``; this module holds the lending and the bodies of the
checks on it:

- **no test data**: a method sees the stream through ``TrainStream`` (no test split), and evaluation
  runs on a throwaway copy of the method (``eval_copy``), so nothing seen at an eval point survives;
  ``copy_changes`` and ``owner_changes`` say what a ``predict`` changed in the copy (closures included,
  in the audit), the original method, the method's class or its package's modules; what is lent takes no
  attributes, and the stream's arrays are sealed (``stream.sealed``), so it is no place to keep data or
  rewrite the protocol;
- **storage accounted**: ``LentInputs`` serves inputs only for ids in the rehearsal memory or the
  session in progress (a private list of ids replays nothing), and ``retained_finding`` counts the
  sample-shaped data a method keeps outside the memory at each session end;
- **separate random streams**: ``random_streams`` gives the harness (batches, memory eviction, head
  growth) and the method generators seeded apart; the method's are the only ones it is lent.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn, TypeAlias

import numpy as np
import torch
from torch import Tensor, nn

from ..data.inputs import InputStore
from ..data.stream import Catalog, Session, Stream
from ..errors import BenchError
from ..model.module_copy import deepcopy_with_modules
from ..spec.protocol import Protocol
from .memory import Memory

if TYPE_CHECKING:
    from ...methods.base import Method

METHOD_STREAM = 1  # SeedSequence spawn key of the method's own generators (the harness's is the run seed)

# what the lent views refuse, in the words of their rules (``referee.RULES`` lists them with the others)
TEST_SPLIT_RULE = ("the test split is the harness's alone; a method sees the train stream (sessions, train labels), "
                   "and is evaluated through predict().")
INPUTS_RULE = ("storage is the harness's memory, capped by the protocol; ids a method keeps for itself do not give "
               "access to the samples: ctx.inputs serves ids in the rehearsal memory or the session in progress "
               "(S1 during setup) only.")


# ------------------------------------------------------------------ what a method is lent


@dataclass(frozen=True, slots=True)
class TrainStream:
    """The stream as a method sees it: sessions, train catalog and labels; no test split."""

    protocol: Protocol              # the protocol spec (as ctx.protocol)
    seed: int                       # the run's seed (it chose the class order)
    train: Catalog                  # the train split: labels of every global id (read-only)
    class_names: tuple[str, ...]    # by stream label
    pretrain_ids: np.ndarray
    """S1's train ids (the deployed model's data; lent through ctx.inputs until session 2 begins)"""
    pretrain_classes: int           # K: the pre-training classes are labels 0..K-1
    sessions: tuple[Session, ...]   # the learning sessions j = 2..N, in order
    task_of_class: np.ndarray       # per label: 0 for the pre-training classes, k for those introduced in session k+1
    lent_to: str = "a method"       # the method's name, for the messages of refused requests

    def __getattr__(self, name: str) -> NoReturn:  # only for names the dataclass lacks: it always raises
        if name in ("test", "test_ids"):
            raise BenchError(f"Method {self.lent_to!r} asked ctx.stream for {name!r}. Rule: {TEST_SPLIT_RULE}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def classes_before(self, j: int) -> np.ndarray:
        """Labels seen before session ``j`` (the pre-training classes and sessions 2..j-1)."""
        parts = [np.arange(self.pretrain_classes)] + [s.classes for s in self.sessions if s.index < j]
        return np.unique(np.concatenate(parts))

    def session_ids(self, upto: int) -> np.ndarray:
        """Train ids of S1 and of sessions 2..``upto`` (what exists so far; ctx.inputs lends only some)."""
        parts = [self.pretrain_ids] + [s.train_ids for s in self.sessions if s.index <= upto]
        return np.concatenate(parts)


def train_view(stream: Stream, lent_to: str = "a method") -> TrainStream:
    """The stream without its test split. Its arrays are lent as they are: the stream sealed them when it
    was built (``stream.sealed``), so nothing lent to a method is a place to leave data for a later call."""
    return TrainStream(stream.protocol, stream.seed, stream.train, tuple(stream.class_names), stream.pretrain_ids,
                       stream.pretrain_classes, tuple(stream.sessions), stream.task_of_class, lent_to)


class MemoryView:
    """The rehearsal memory, read-only: what it holds and its cap, not its generator or ``add`` (and, by its
    slots, no attribute of a method's)."""

    __slots__ = ("_memory",)

    def __init__(self, memory: Memory) -> None:
        self._memory = memory

    @property
    def ids(self) -> tuple[int, ...]:
        """Global train ids stored now."""
        return tuple(self._memory.ids)

    @property
    def capacity(self) -> int | None:
        """The cap in samples (None: unlimited)."""
        return self._memory.capacity

    @property
    def pretrain(self) -> frozenset[int]:
        """The stored S1 samples of a split memory (``memory.pretrain_share``)."""
        return frozenset(self._memory.pretrain)

    @property
    def spec(self):
        """The protocol's memory section (policy, capacity, storage budget), after the method's own policy."""
        return self._memory.spec

    @property
    def labels(self) -> np.ndarray:
        """Labels of every global train id (index by ``ids``)."""
        return self._memory.labels

    def sample_bytes(self, gid: int) -> int:
        """Bytes one stored sample costs against the storage cap."""
        return self._memory.sample_bytes(gid)

    def recount_bytes(self) -> None:
        """Re-evaluate stored bytes once a method knows its storage format (DER++, REMIND at setup)."""
        self._memory.recount_bytes()

    def add_bytes(self, n: int) -> None:
        """Charge bytes a method adds to samples already stored (DER++'s lazily recorded logits)."""
        self._memory.add_bytes(n)

    def __len__(self) -> int:
        return len(self._memory)


@dataclass
class ServedIds:
    """The train ids of the session in progress, which ``LentInputs`` serves beside the memory's: set by
    the harness as each session opens, and never lent to a method (S1's before the first session)."""

    ids: np.ndarray


class LentInputs:
    """Train inputs by id, for ids in the rehearsal memory or the session in progress only (S1 before
    the first session: pre-training data is what a method may fit a codebook or statistics on). It takes
    no attributes of a method's (slots), so it is no place to leave data for a later call; which session
    is in progress it reads from the harness's ``ServedIds``."""

    __slots__ = ("_store", "_memory", "_method", "_served", "_mask_of", "_in_current")

    def __init__(self, store: InputStore, memory: Memory, method_name: str, served: ServedIds) -> None:
        self._store, self._memory, self._method, self._served = store, memory, method_name, served
        self._mask_of: np.ndarray | None = None  # the ids that ``_in_current`` marks
        self._in_current = np.zeros(0, dtype=bool)

    @property
    def current(self) -> np.ndarray:
        """The train ids of the session in progress (S1's before the first session begins)."""
        return self._served.ids

    def _current_mask(self) -> np.ndarray:
        """``current`` as a mask over the train ids, rebuilt when a new session's ids replace it: membership
        in O(1) per id, where ``np.isin`` against S1's ids sorts a million of them on every call."""
        if self._mask_of is not self._served.ids:
            self._in_current = np.zeros(len(self._memory.labels), dtype=bool)
            self._in_current[np.asarray(self._served.ids, dtype=np.int64)] = True
            self._mask_of = self._served.ids
        return self._in_current

    @property
    def cached(self) -> bool:
        """True when ``get`` returns trunk features (the trunk cache), False when it returns images."""
        return self._store.cached

    def get(self, ids: np.ndarray) -> Tensor:
        """Inputs of ``ids`` on the run's device, as ``batch.x`` holds them; an id outside the memory and
        the session in progress is refused (exit 2)."""
        ids = np.asarray(ids, dtype=np.int64)
        in_current = self._current_mask()
        allowed = (ids >= 0) & (ids < len(in_current))  # an id past the stream is refused, not an IndexError
        allowed[allowed] = in_current[ids[allowed]] | self._memory.holds(ids[allowed])
        if not allowed.all():
            bad = ids[~allowed][:5].tolist()
            raise BenchError(f"Method {self._method!r} asked ctx.inputs for sample id(s) {bad}, which are neither in "
                             f"the rehearsal memory nor in the session in progress. Rule: {INPUTS_RULE}")
        return self._store.get(ids)


@dataclass
class RandomStreams:
    """Independent generators: the harness's (batches, memory, head growth) and the method's own."""

    harness: np.random.Generator
    harness_torch: torch.Generator
    method: np.random.Generator
    method_torch: torch.Generator


def random_streams(seed: int) -> RandomStreams:
    """The harness keeps the run seed's streams (same batches as before the split); the method's come
    from a spawned child seed, so drawing from or rewinding them cannot move a batch."""
    child = np.random.SeedSequence([seed, METHOD_STREAM])
    torch_seed = int(child.generate_state(1, dtype=np.uint64)[0] % (2**63))
    return RandomStreams(np.random.default_rng(seed), torch.Generator().manual_seed(seed),
                         np.random.default_rng(child), torch.Generator().manual_seed(torch_seed))


# ------------------------------------------------------------------ what a method keeps


HARNESS = __name__.partition(".run.")[0] + "."  # bench's harness package: its callables hold its state


Held: TypeAlias = "types.FunctionType | types.MethodType | functools.partial[object]"
"""A callable whose closure, defaults or bound arguments the walks look into."""


def _held_by_callable(obj: Held) -> list[tuple[str, object]]:
    """What a function, bound method or partial a method keeps holds: a closure's variables, a function's
    attributes and defaults, a bound method's object, a partial's arguments. A closure is a place to keep
    data as much as an attribute is (and a way back to the original method from its eval copy). The
    harness's own callables (``ctx.planned_updates``, the FLOP meter's hooks) are its state, not the method's."""
    if isinstance(obj, functools.partial):
        return [("func", obj.func), ("args", obj.args), ("keywords", obj.keywords)]
    if isinstance(obj, types.MethodType):
        return [("__func__", obj.__func__), ("__self__", obj.__self__)]
    if (getattr(obj, "__module__", None) or "").startswith(HARNESS):
        return []
    held: list[tuple[str, object]] = []
    for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
        try:
            held.append((f"<closure {name}>", cell.cell_contents))
        except ValueError:  # a variable not bound yet
            continue
    held += [(name, value) for name, value in vars(obj).items()]
    held += [(f"<default {i}>", value) for i, value in enumerate(obj.__defaults__ or ())]
    return held + [(f"<default {k}>", value) for k, value in (obj.__kwdefaults__ or {}).items()]


def _walk(root: object, skip: set[int], visit: Callable[[str, object], bool], max_depth: int = 12,
          closures: bool = True) -> None:
    """Depth-first over containers and plain objects' attributes; ``visit`` returns False to stop
    descending. Modules contribute buffers only (parameters are the model, not storage). ``closures``:
    also into what functions, bound methods and partials hold (``_held_by_callable``), the reflective part."""
    seen: set[int] = set(skip)

    def go(path: str, obj: object, depth: int) -> None:
        if id(obj) in seen or depth > max_depth:
            return
        seen.add(id(obj))
        if not visit(path, obj):
            return
        if isinstance(obj, (Tensor, np.ndarray, str, bytes, int, float, bool, type(None), np.random.Generator,
                            torch.Generator, torch.optim.Optimizer, torch.device)):
            return
        if isinstance(obj, nn.Module):
            for name, buf in obj.named_buffers():
                go(f"{path}.{name}", buf, depth + 1)
            for name, value in vars(obj).items():
                if not name.startswith("_") and name != "training":
                    go(f"{path}.{name}", value, depth + 1)
            return
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                go(f"{path}[{k!r}]", v, depth + 1)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            for i, v in enumerate(list(obj)):
                go(f"{path}[{i}]", v, depth + 1)
        elif isinstance(obj, (types.FunctionType, types.MethodType, functools.partial)):
            for name, value in _held_by_callable(obj) if closures else ():
                go(f"{path}.{name}", value, depth + 1)
        elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType)):
            for name, value in list(vars(obj).items()):
                go(f"{path}.{name}", value, depth + 1)

    go("method", root, 0)


def sample_shape(store: InputStore) -> tuple[int, ...]:
    """The shape of one input as methods receive it (trunk features or a preprocessed image)."""
    if store.table is not None:
        return tuple(store.table.shape[1:])
    shards = getattr(store, "shards", None)
    if shards is not None:  # trunk features on disk
        return tuple(shards.shape)
    size = store.preprocess.size
    trunk = getattr(store, "trunk", None)
    if store.cached and trunk is not None:  # trunk run per batch: its output shape, from one blank image
        device = next(trunk.parameters()).device
        with torch.no_grad():
            return tuple(trunk(torch.zeros(1, 3, size, size, device=device)).shape[1:])
    return (3, size, size)


def retained_samples(method: Method, shape: tuple[int, ...], skip: list[object]) -> tuple[int, list[str]]:
    """Samples' worth of input data a method holds (tensors or arrays whose trailing dimensions are one
    input), and where; ``skip``: what the harness lent it (counted elsewhere)."""
    found: list[tuple[str, int]] = []
    storages: set[tuple[int, int]] = set()

    def visit(path: str, obj: object) -> bool:
        if isinstance(obj, (Tensor, np.ndarray)) and not isinstance(obj, nn.Parameter):
            dims = tuple(obj.shape)
            rows = 1 if dims == shape else (int(np.prod(dims[:-len(shape)])) if dims[-len(shape):] == shape
                                            and len(dims) > len(shape) else 0)
            key = (obj.data_ptr(), rows) if isinstance(obj, Tensor) else (id(obj), rows)
            if rows and key not in storages:
                storages.add(key)
                found.append((path, rows))
            return False
        return True

    _walk(method, {id(x) for x in skip}, visit)
    return sum(r for _, r in found), [f"{p} ({r})" for p, r in found]


def retained_finding(method: Method, memory: Memory, shape: tuple[int, ...], skip: Sequence[object]) -> str | None:
    """At a session end: memory + input-shaped data the method keeps <= the protocol's cap plus what
    the method declares (``Method.retained_allowance``); what it keeps beyond, in words (None: within)."""
    cap = memory.capacity
    if cap is None:
        return None
    rows, where = retained_samples(method, shape, list(skip))
    allowance = int(getattr(method, "retained_allowance", 0) or 0)
    if len(memory) + rows <= cap + allowance:
        return None
    return (f"Method {method.name!r} keeps {rows} samples' worth of input data outside the rehearsal memory "
            f"({', '.join(where[:4])}), beside {len(memory)} in the memory; the protocol's storage cap is "
            f"{cap} (+{allowance} the method declares in retained_allowance).")


# ------------------------------------------------------------------ evaluation it cannot keep


Digest: TypeAlias = "tuple[object, ...] | int | float | str | bytes | None"
"""What ``_digest`` keeps of a value: only compared for equality."""


def _digest(obj: object) -> Digest:
    """A value that changes when ``obj`` changes: tensors by identity and version counter (bumped by
    every in-place op, so no tensor is read), arrays by their bytes, everything else by value/length."""
    if isinstance(obj, Tensor):
        return ("T", id(obj), obj._version, tuple(obj.shape))
    if isinstance(obj, np.ndarray):
        return ("A", obj.shape, hashlib.blake2b(np.ascontiguousarray(obj).view(np.uint8).data,
                                                          digest_size=8).hexdigest() if obj.dtype != object else None)
    if isinstance(obj, (dict, list, tuple, set, frozenset)):
        return (type(obj).__name__, len(obj))  # their items are digested under their own paths
    if isinstance(obj, (int, float, str, bytes, bool, type(None))):
        return obj
    return type(obj).__name__


def fingerprint(root: object, skip: Sequence[object] = (), closures: bool = True) -> dict[str, Digest]:
    """Path -> digest over everything reachable from ``root`` (see ``_walk``), parameters included."""
    out: dict[str, Digest] = {}

    def visit(path: str, obj: object) -> bool:
        out[path] = _digest(obj)
        if isinstance(obj, nn.Module):
            for name, p in obj.named_parameters():
                out[f"{path}.{name}"] = _digest(p)
        return True

    _walk(root, {id(x) for x in skip}, visit, closures=closures)
    return out


def _owner_state(method: Method) -> dict[str, Digest]:
    """Mutable state a copy shares with the original: class attributes of the method's (and its modifiers')
    classes, and the module globals of every module of the packages their code comes from (a helper module
    of the plugin is as good a place to keep data as the method's own), outside bench itself."""
    out: dict[str, Digest] = {}
    classes = {c for m in [method, *getattr(method, "modifiers", [])] for c in type(m).__mro__
               if not c.__module__.startswith(("bench_stability_gap.", "builtins", "abc"))}
    for cls in classes:
        for name, value in vars(cls).items():
            if not name.startswith("__") and isinstance(value, (list, dict, set, Tensor, np.ndarray)):
                out.update({f"{cls.__name__}.{name}{k[6:]}": v for k, v in fingerprint(value).items()})
    modules = _code_modules(classes)
    for module_name in modules:
        module = sys.modules[module_name]
        for name, value in list(vars(module).items()):
            if not name.startswith("__") and _may_hold_data(value, modules):
                out.update({f"{module_name}.{name}{k[6:]}": v for k, v in fingerprint(value).items()})
    return out


def _code_modules(classes: set[type]) -> set[str]:
    """The imported modules of the code ``classes`` come from: every module of a plugin's package, or the
    single module a class is defined in (a plugin of one file, a script, a test)."""
    from ...methods.registry import code_package

    modules: set[str] = set()
    for cls in classes:
        try:
            package, is_package = code_package(cls.__module__)
        except (BenchError, ImportError, ValueError):  # __main__, or a module made at run time
            package, is_package = cls.__module__, False
        modules |= {name for name, module in list(sys.modules.items()) if module is not None and (
            name == cls.__module__ or is_package and (name == package or name.startswith(package + ".")))}
    return modules


def _may_hold_data(value: object, modules: set[str]) -> bool:
    """A module global that data could be left in: a container, tensor or array, or an object or function
    of the plugin's own code (not the modules, classes and functions it imports)."""
    if isinstance(value, (list, dict, set, Tensor, np.ndarray)):
        return True
    if isinstance(value, (type, types.ModuleType)):
        return False
    own = getattr(value, "__module__", None) if isinstance(value, types.FunctionType) else type(value).__module__
    return own in modules


def _values(root: object, skip: Sequence[object], closures: bool = True) -> dict[str, Tensor | np.ndarray]:
    """Path -> tensor or array, over everything reachable from ``root`` (``_walk``), parameters included."""
    out: dict[str, Tensor | np.ndarray] = {}

    def visit(path: str, obj: object) -> bool:
        if isinstance(obj, (Tensor, np.ndarray)):
            out[path] = obj
        if isinstance(obj, nn.Module):
            out.update({f"{path}.{name}": p for name, p in obj.named_parameters()})
        return True

    _walk(root, {id(x) for x in skip}, visit, closures=closures)
    return out


def _unequal(a: Tensor, b: Tensor) -> Tensor:
    """A 0-dim bool on the tensors' device: whether they differ anywhere (NaN equal to NaN)."""
    differ = a != b
    if a.is_floating_point() or a.is_complex():
        differ &= ~(a.isnan() & b.isnan())
    return differ.any()


def _differing(copy: dict[str, Tensor | np.ndarray], original: dict[str, Tensor | np.ndarray]) -> list[str]:
    """Paths whose value in the eval copy now differs from the original method's: the two were equal when
    the copy was made, so a difference is a change made while evaluating, to either of them. It catches
    what a version counter misses (a write through ``.data``) and a predict that reached the original, and
    reads each tensor on its device, with one host sync per device."""
    flags: dict[torch.device, list[tuple[str, Tensor]]] = {}
    found: list[str] = []
    with torch.no_grad():
        for path, a in copy.items():
            b = original.get(path)
            if b is None or b is a or type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
                continue
            if isinstance(a, np.ndarray):
                if a.dtype != object and not np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"):
                    found.append(path)
            elif a.layout != torch.strided or a.device != b.device:
                continue
            elif a.device.type == "cpu":  # no sync to save: one call, and the NaN-aware test only on a mismatch
                if not torch.equal(a, b) and bool(_unequal(a, b)):
                    found.append(path)
            else:
                flags.setdefault(a.device, []).append((path, _unequal(a, b)))
        for pairs in flags.values():
            unequal = torch.stack([flag for _, flag in pairs]).tolist()
            found += [path for (path, _), bad in zip(pairs, unequal) if bad]
    return found


def _changed(before: dict[str, Digest], after: dict[str, Digest]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k, "<absent>") != after.get(k, "<absent>"))


@dataclass
class EvalCopy:
    """A throwaway copy of a method for one eval point, and what it and the method's code held when it was
    made: the copy's fingerprint without what callables hold (``plain``) and, for the reflective audits, with
    it (``held``) and the mutable state of the method's classes and modules (``owners``)."""

    method: Method
    clone: Method
    keep: list[object]  # the lent objects, shared by identity
    plain: dict[str, Digest]
    held: dict[str, Digest] | None = None
    owners: dict[str, Digest] | None = None


def eval_copy(method: Method, shared: Sequence[object], unused: Sequence[object] = (), audit: bool = True) -> EvalCopy:
    """A copy of ``method`` to evaluate (``shared``: the harness's read-only objects, lent rather than copied,
    plus what ``method.shared_in_eval_copy()`` names; ``unused``: parts of the method nothing reads for the
    rest of the run, such as a trunk whose features are cached, shared with the copy but still checked);
    ``audit``: also the snapshots the reflective audits compare (closures, class and module state)."""
    keep = [*shared, *getattr(method, "shared_in_eval_copy", lambda: [])()]
    memo: dict[int, object] = {id(x): x for x in [*keep, *unused]}
    for value in vars(method).values():  # optimizer state is not needed to predict: not copied
        if isinstance(value, torch.optim.Optimizer) or hasattr(value, "optimizer") and hasattr(value, "step"):
            memo[id(value)] = None
    clone = deepcopy_with_modules(method, memo)
    owners = _owner_state(method) if audit else None
    return EvalCopy(method, clone, keep, fingerprint(clone, keep, closures=False),
                    fingerprint(clone, keep) if audit else None, owners)


def copy_changes(c: EvalCopy, closures: bool) -> str | None:
    """What predict changed in the copy (or, through it, in the original), in words; ``closures``: what
    callables hold included. A change the version counters miss (a write through ``.data``) shows as the
    copy's values differing from the original's."""
    before = c.held if closures else c.plain
    if before is None:
        return None
    changed = [f"its {p[7:] or 'state'}" for p in _changed(before, fingerprint(c.clone, c.keep, closures=closures))]
    if not changed:
        changed = [f"its {p[7:]}" for p in _differing(_values(c.clone, c.keep, closures),
                                                      _values(c.method, c.keep, closures))]
    return _predict_changed(c.method, changed)


def owner_changes(c: EvalCopy) -> str | None:
    """What predict changed in the method's classes or its package's modules, in words."""
    return None if c.owners is None else _predict_changed(c.method, _changed(c.owners, _owner_state(c.method)))


def _predict_changed(method: Method, changed: list[str]) -> str | None:
    if not changed:
        return None
    more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
    return f"Method {method.name!r}: predict() changed {', '.join(changed[:3])}{more} while being evaluated."


@contextmanager
def isolated_model_predict(model: torch.nn.Module, outputs: int) -> Iterator[Callable[[Tensor], Tensor]]:
    """The first ``outputs`` logits of a throwaway copy of ``model``: a stage without a method (the joint
    reference) is evaluated as a method is, so nothing an eval point does survives in the model it goes
    on training or storing. The copy keeps the model's FLOP hooks (closures, copied by reference)."""
    clone = deepcopy_with_modules(model)
    yield lambda x: clone(x)[:, :outputs]
