"""The data stream of a protocol: class order, sessions S1..SN and the eval sets, from a seed.

Labels are renumbered in order of introduction (pre-training classes first), so the head's first
K units are always exactly the K classes seen so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import BenchError
from ..spec.class_order import ordered_classes
from ..spec.protocol import Protocol
from .sources import Split, draw_per_class, open_source


def sealed(values: np.ndarray) -> np.ndarray:
    """A read-only copy of ``values`` that nothing can make writeable again: its memory is an immutable
    bytes object, so numpy refuses ``writeable = True`` on it and on every view of it. The stream's arrays
    are lent to methods and shared by every run of a sweep; a write to one would change the protocol for
    the runs after it, so none is possible."""
    values = np.ascontiguousarray(values)
    return np.frombuffer(values.tobytes(), dtype=values.dtype).reshape(values.shape)


@dataclass(frozen=True)
class Catalog:
    """Several splits seen as one: global sample ids 0..n-1 over the concatenation."""

    splits: tuple[Split, ...]  # the data sources' splits, in order
    labels: np.ndarray  # stream labels (introduction order) per global id

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", sealed(self.labels))

    @cached_property
    def offsets(self) -> np.ndarray:
        """The first global id of each split (and the total at the end)."""
        return sealed(np.cumsum([0] + [len(s) for s in self.splits]))

    def locate(self, gid: int) -> tuple[Split, int]:
        """The split a global id lies in, and its index there."""
        k = int(np.searchsorted(self.offsets, gid, side="right") - 1)
        return self.splits[k], int(gid - self.offsets[k])

    def sample_bytes(self, gid: int) -> int:
        """Bytes the sample takes as stored (what a memory of raw samples is charged)."""
        split, local = self.locate(gid)
        return split.sample_bytes(local)

    def __len__(self) -> int:
        return int(self.offsets[-1])


@dataclass(frozen=True)
class Session:
    """One learning session j >= 2: its training samples and the classes it brings (read-only arrays)."""

    index: int                      # j
    train_ids: np.ndarray           # global train ids, in arrival order
    classes: np.ndarray             # stream labels present in S_j
    new_classes: np.ndarray         # labels first introduced in S_j (the head grows by these)
    seen_classes: int               # number of classes seen once S_j has arrived

    def __post_init__(self) -> None:
        for name in ("train_ids", "classes", "new_classes"):
            object.__setattr__(self, name, sealed(getattr(self, name)))


@dataclass(frozen=True)
class Stream:
    protocol: Protocol
    seed: int
    train: Catalog
    test: Catalog
    class_names: list[str]          # by stream label
    pretrain_ids: np.ndarray        # S1 training ids
    pretrain_classes: int           # K: labels 0..K-1
    sessions: list[Session]
    task_of_class: np.ndarray = field(repr=False)  # 0 = pre-training classes, k = introduced in session k+1

    def __post_init__(self) -> None:
        object.__setattr__(self, "pretrain_ids", sealed(self.pretrain_ids))
        object.__setattr__(self, "task_of_class", sealed(self.task_of_class))

    def classes_before(self, j: int) -> np.ndarray:
        """Labels of S_1..S_{j-1}: the 'old' classes of session j."""
        parts = [np.arange(self.pretrain_classes)] + [s.classes for s in self.sessions if s.index < j]
        return np.unique(np.concatenate(parts))

    def test_ids(self, classes: np.ndarray) -> np.ndarray:
        return np.flatnonzero(np.isin(self.test.labels, classes))

    def session_ids(self, upto: int) -> np.ndarray:
        """Training ids of S_1..S_upto (joint training data)."""
        parts = [self.pretrain_ids] + [s.train_ids for s in self.sessions if s.index <= upto]
        return np.concatenate(parts)


def check_batch_sizes(stream: Stream) -> None:
    """No batch asks for more samples than the opened data holds. The protocol checks this at validation
    where its spec fixes the counts; otherwise the counts are known only now, before any training (a
    batch larger than its session would cycle the same few samples for every update)."""
    p = stream.protocol
    first = len(stream.pretrain_ids)
    smallest = min(stream.sessions, key=lambda s: len(s.train_ids), default=None)
    problems = []
    if p.pretrain.mode == "train" and p.pretrain.batch_size > first:
        problems.append(f"pretrain.batch_size ({p.pretrain.batch_size}) exceeds the {first:,} pre-training samples")
    if smallest is not None and p.training.batch.new > len(smallest.train_ids):
        problems.append(f"training.batch.new ({p.training.batch.new}) exceeds the {len(smallest.train_ids):,} "
                        f"training samples of session {smallest.index}, the smallest")
    if stream.sessions and p.joint.batch_size > first + len(stream.sessions[0].train_ids):
        problems.append(f"joint.batch_size ({p.joint.batch_size}) exceeds the "
                        f"{first + len(stream.sessions[0].train_ids):,} samples the first joint model trains on")
    if problems:
        raise BenchError(f"Protocol {p.name}: {'; '.join(problems)} (counted in the opened data, seed "
                         f"{stream.seed}). Lower the batch size; nothing has trained.")


def _cil_sessions(protocol: Protocol, seed: int, rng: np.random.Generator, stream_train: np.ndarray,
                  raw_train: np.ndarray, k: int, n_stream: int,
                  names: list[list[str]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Class-incremental sessions: the stream's classes in the protocol's order (``class_order``),
    ``classes_per_session`` at a time; each session's train ids (raw class ids) in a seeded arrival
    order, and the raw classes in order of introduction."""
    per = protocol.classes_per_session
    if per is None:  # the protocol requires it of class-incremental orderings
        raise ValueError(f"Protocol {protocol.name}: class-incremental sessions need classes_per_session")
    need = per * protocol.sessions
    if need > n_stream:
        raise BenchError(
            f"Protocol {protocol.name}: sessions ({protocol.sessions}) x classes_per_session ({per}) = "
            f"{need} classes, but the stream sources hold only {n_stream}."
        )
    if protocol.class_order in (None, "seeded"):
        order = k + rng.permutation(n_stream)[:need]
    else:  # a fixed order, checked against the opened data's class names before anything computes
        order = k + np.asarray(ordered_classes(protocol.class_order, seed, names), dtype=np.int64)[:need]
    chunks = [order[i * per : (i + 1) * per] for i in range(protocol.sessions)]
    sessions = [rng.permutation(stream_train[np.isin(raw_train[stream_train], chunk)]) for chunk in chunks]
    return sessions, np.concatenate(chunks)


def _iid_sessions(protocol: Protocol, rng: np.random.Generator, stream_train: np.ndarray, raw_train: np.ndarray,
                  k: int, offset: int) -> tuple[list[np.ndarray], np.ndarray]:
    """IID sessions: the stream's samples shuffled and cut into equal sessions; classes are introduced
    in the order they first appear (the rest after them)."""
    sessions = np.array_split(rng.permutation(stream_train), protocol.sessions)
    seen: list[int] = []
    for part in sessions:
        for c in np.unique(raw_train[part]):
            if c not in seen:
                seen.append(int(c))
    return sessions, np.array(seen + [c for c in range(k, offset) if c not in seen], dtype=np.int64)


def build_stream(protocol: Protocol, seed: int) -> Stream:
    """Open the protocol's sources and lay out the sessions for this seed (CIL or IID order)."""
    pre_train, pre_test = open_source(protocol.pretrain_data, field="pretrain_data.root")
    opened = [open_source(src, field=f"stream_data[{i}].root") for i, src in enumerate(protocol.stream_data)]
    k = len(pre_train.class_names)

    # Raw class ids: pretrain 0..K-1, then each stream source shifted past the previous ones.
    raw_train, raw_test, names, offset = [pre_train.labels], [pre_test.labels], list(pre_train.class_names), k
    for tr, te in opened:
        raw_train.append(tr.labels + offset)
        raw_test.append(te.labels + offset)
        names.extend(tr.class_names)
        offset += len(tr.class_names)
    raw_train_all, raw_test_all = np.concatenate(raw_train), np.concatenate(raw_test)
    n_stream = offset - k
    trains = (pre_train, *[tr for tr, _ in opened])
    held = held_out(protocol, trains)  # global train ids of the validation split (tuning view only)
    trainable = np.ones(len(raw_train_all), dtype=bool)
    trainable[held] = False

    rng = np.random.default_rng(seed)
    stream_train = np.arange(len(pre_train), len(raw_train_all))
    stream_train = stream_train[trainable[stream_train]]
    if protocol.ordering == "cil":
        session_raw_ids, intro = _cil_sessions(protocol, seed, rng, stream_train, raw_train_all, k, n_stream,
                                               [list(tr.class_names) for tr, _ in opened])
    else:
        session_raw_ids, intro = _iid_sessions(protocol, rng, stream_train, raw_train_all, k, offset)

    # Renumber: pretrain classes keep 0..K-1; stream classes by introduction order.
    relabel = np.full(offset, -1, dtype=np.int64)
    relabel[:k] = np.arange(k)
    relabel[intro] = np.arange(k, k + len(intro))
    train_labels, test_labels = relabel[raw_train_all], relabel[raw_test_all]
    used = len(intro) + k
    stream_names = [""] * used
    for raw, label in enumerate(relabel):
        if label >= 0:
            stream_names[label] = names[raw]

    task_of_class = np.zeros(used, dtype=np.int64)
    sessions, seen_count = [], k
    for j, ids in enumerate(session_raw_ids, start=2):
        classes = np.unique(train_labels[ids])
        new = classes[classes >= seen_count]
        task_of_class[new] = j - 1
        seen_count += len(new)
        sessions.append(Session(j, ids, classes, new, seen_count))

    # Test samples of classes that never enter the stream are dropped (label -1).
    keep_test = test_labels >= 0
    test = Catalog((pre_test, *[te for _, te in opened]), np.where(keep_test, test_labels, -1))
    train = Catalog(trains, train_labels)
    if protocol.scored_on == "validation":  # the held-out samples are what the harness scores on
        test = validation_catalog(train, held)
    return Stream(
        protocol=protocol,
        seed=seed,
        train=train,
        test=test,
        class_names=stream_names,
        pretrain_ids=np.flatnonzero(trainable[: len(pre_train)]),
        pretrain_classes=k,
        sessions=sessions,
        task_of_class=task_of_class,
    )


def held_out(protocol: Protocol, trains: tuple[Split, ...]) -> np.ndarray:
    """Global train ids (over ``trains`` concatenated) of the validation split in the tuning view: a fixed
    ``validation.per_class`` samples of every class of every source; empty in a test run. A class with
    no more samples than that is a BenchError naming the field (nothing would be left to train on)."""
    v = protocol.validation
    if protocol.scored_on != "validation" or v is None:
        return np.zeros(0, dtype=np.int64)
    parts, offset = [], 0
    for where, split in zip(["pretrain_data", *(f"stream_data[{i}]" for i in range(len(trains) - 1))], trains):
        counts = np.bincount(split.labels, minlength=split.num_classes)
        if counts.size and counts.min() <= v.per_class:
            c = int(counts.argmin())
            raise BenchError(
                f"Protocol {protocol.name}: validation.per_class ({v.per_class}) is not smaller than the "
                f"{int(counts[c])} training samples of class {split.class_names[c]!r} of {where}: nothing would be "
                f"left to train on. "
                f"Hold out fewer samples per class.")
        parts.append(offset + draw_per_class(split.labels, split.num_classes, v.per_class, v.seed))
        offset += len(split)
    return np.concatenate(parts).astype(np.int64)


def validation_catalog(train: Catalog, held: np.ndarray) -> Catalog:
    """The held-out train samples as the catalog the harness evaluates on (in place of the test split)."""
    splits, labels = [], []
    for k, split in enumerate(train.splits):
        local = held[(held >= train.offsets[k]) & (held < train.offsets[k + 1])] - train.offsets[k]
        splits.append(split.subset(local))
        labels.append(train.labels[train.offsets[k] + local])
    return Catalog(tuple(splits), np.concatenate(labels))


class Cycler:
    """Draws ids without replacement, reshuffling after each pass (epochs over a session)."""

    def __init__(self, ids: np.ndarray, rng: np.random.Generator, shuffle: bool = True) -> None:
        self.ids, self.rng, self.shuffle = ids, rng, shuffle
        self.order, self.pos = self._new_order(), 0

    def _new_order(self) -> np.ndarray:
        return self.rng.permutation(self.ids) if self.shuffle else self.ids

    def take(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            if self.pos == len(self.order):
                self.order, self.pos = self._new_order(), 0
            k = min(n, len(self.order) - self.pos)
            out.append(self.order[self.pos : self.pos + k])
            self.pos, n = self.pos + k, n - k
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)
