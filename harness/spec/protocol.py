"""Protocol specs: the data stream, budget, storage cap and eval cadence of one benchmark setting.

A protocol is a versioned YAML file validated by pydantic (``extra="forbid"``); its content hash is
stamped on every result so that results from different specs are never compared.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from ..errors import BenchError, did_you_mean
from .class_order import read_order_file
from .sources import SOURCES
from .specfile import builtin_names, is_path, load_spec, parse_spec

# Sane bounds: far past any real protocol, near enough that a typo (an extra zero, a sign) is caught
# before compute instead of as an out-of-memory crash hours in. One place for each bound.
MAX_SEED = 2**31 - 1          # numpy's legacy seeding takes < 2**32; joint runs add the session index
MAX_UPDATES = 10_000_000
MAX_BATCH = 65_536
MAX_INPUT_SIZE = 1_024
MAX_CLASSES = 100_000
MAX_LR = 10.0
MAX_TFLOPS = 100_000.0  # training TFLOPs of one session: over 300x the largest built-in budget, days of compute
MAX_EVAL_POINTS = 100_000  # eval points of one session, as a compute schedule places them
# a protocol's name is a folder of results and part of cache lock names: 100 leaves room for NAME@Kx and
# for what the harness adds within a file name's 255 bytes (built-in names have at most 25 characters)
MAX_NAME = 100
Seed = Annotated[int, Field(ge=0, le=MAX_SEED, description="0..2**31-1")]
Updates = Annotated[int, Field(gt=0, le=MAX_UPDATES)]
BatchSize = Annotated[int, Field(gt=0, le=MAX_BATCH)]
LearningRate = Annotated[float, Field(gt=0, le=MAX_LR, allow_inf_nan=False)]
Decay = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class Spec(BaseModel):
    """Base for every spec model: unknown fields are errors, values are immutable, and a count or rate is
    never a boolean (pydantic reads YAML's true as 1, so ``sessions: true`` would run one session)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: object, info: ValidationInfo) -> object:
        if info.field_name is not None and _holds_bool(value) and _takes_number_not_bool(cls, info.field_name):
            raise ValueError("a number, not true/false")
        return value


def _holds_bool(value: object) -> bool:
    """A boolean, or a list or tuple holding one (``mean: [true, 0.5, 0.5]``)."""
    return isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value))


@functools.cache
def _takes_number_not_bool(model: type[BaseModel], field: str) -> bool:
    """Whether the field's annotation has int or float among its types (unions, Annotated and containers
    unpacked) and bool nowhere: the fields a boolean could only reach as a miscounted number."""
    kinds: list[object] = []
    todo: list[object] = [model.model_fields[field].annotation]
    while todo:
        kinds.append(kind := todo.pop())
        todo.extend(get_args(kind))
    return any(k is int or k is float for k in kinds) and not any(k is bool for k in kinds)


if TYPE_CHECKING:  # a type checker cannot expand the catalog's names: any string, to it
    SourceName = str
else:
    SourceName = Literal[tuple(SOURCES)]  # the catalog's names


class LongTail(Spec):
    """Per-class image counts falling from ``largest`` to ``smallest`` and summing to ``total``
    (a real set's head, tail and size, e.g. Places365-LT: 4980, 5, 62500)."""

    total: int = Field(gt=0)
    largest: int = Field(gt=0)
    smallest: int = Field(gt=0)


class Synthetic(Spec):
    """A data set generated from the sample index (no files): a real set's shape without the set."""

    classes: int = Field(gt=0)
    train_per_class: int | LongTail = Field(description="images per class, or a long-tailed profile")
    test_per_class: int = Field(gt=0)
    image_size: int = Field(256, gt=0, description="side of the generated (square) RGB images")


class DataSource(Spec):
    """One dataset the stream draws from. ``root`` may use ``${ENV}`` / ``~``; embedded sets need none."""

    source: SourceName
    root: str | None = None
    train_per_class: int | None = Field(None, gt=0, le=10_000_000, description="subsample training images per class")
    test_per_class: int | None = Field(None, gt=0, le=10_000_000, description="subsample test images per class")
    classes: int | None = Field(None, gt=0, le=MAX_CLASSES, description="use only the first N classes of the source")

    synthetic: Synthetic | None = Field(None, description="source 'synthetic' only: its class and image counts")

    @model_validator(mode="after")
    def _synthetic_counts(self) -> DataSource:
        if (self.source == "synthetic") != (self.synthetic is not None):
            raise ValueError("synthetic (the counts) is required for source 'synthetic' and only for it")
        return self

    @model_validator(mode="after")
    def _subsample_within_source(self) -> DataSource:
        """A subsample larger than the source would be clamped silently, under a hash of its own: refused
        wherever the catalog (or the synthetic counts) fixes what the source holds."""
        syn, info = self.synthetic, SOURCES[self.source]
        held: tuple[int | None, int | None, int | None] = (info.classes, info.train_per_class, info.test_per_class)
        if syn is not None:
            tail = syn.train_per_class
            held = (syn.classes, tail if isinstance(tail, int) else tail.largest, syn.test_per_class)
        counts = zip(("classes", "train_per_class", "test_per_class"),
                     (self.classes, self.train_per_class, self.test_per_class), held,
                     ("classes", "training images a class", "test images a class"))
        too_many = [f"{field} ({asked:,}) exceeds the {has:,} {what} source {self.source!r} holds"
                    for field, asked, has, what in counts if asked is not None and has is not None and asked > has]
        if too_many:
            raise ValueError("; ".join(too_many))
        return self

    @property
    def num_classes(self) -> int | None:
        """Classes this source contributes, when known without opening it."""
        known = self.synthetic.classes if self.synthetic is not None else SOURCES[self.source].classes
        return self.classes if known is None else min(known, self.classes or known)

    @property
    def train_images_per_class(self) -> int | None:
        """Training images of every class, when the spec's subsample or the catalog fixes one count for all."""
        if self.train_per_class is not None:
            return self.train_per_class
        if self.synthetic is not None:
            per = self.synthetic.train_per_class
            return per if isinstance(per, int) else None
        return SOURCES[self.source].train_per_class


class Backbone(Spec):
    """The timm model, where its weights come from, and how it splits into trunk | body | head."""

    model: str
    weights: str = Field(
        description="package:<module> (weights shipped in a pip package), file:<path>, or timm:<name.tag>"
    )
    input_size: int = Field(gt=0, le=MAX_INPUT_SIZE)
    in_chans: int = Field(3, gt=0, le=16)
    mean: tuple[Finite, Finite, Finite] = (0.485, 0.456, 0.406)
    std: tuple[PositiveFinite, PositiveFinite, PositiveFinite] = (0.229, 0.224, 0.225)
    trunk: list[str] = Field(min_length=1, description="module paths frozen for the whole run")
    body: list[str] = Field(min_length=1, description="module paths that stay plastic")
    head: str = Field(description="module path of the pretrained classifier (replaced by a growing head)")
    lora_targets: list[str] = Field(default_factory=list, description="names of the body's 1x1 convs")
    head_units: Literal["grown", "full"] | None = Field(
        None, description="grown (unset): the head gains the session's classes' units as they arrive; full: the "
                          "published model's head, every class's unit from the first learning session (unseen "
                          "rows at nn.Linear's init, trained by the loss and scored in the argmax)")
    registered_first: list[str] | None = Field(
        None, description="body entries the published model registers before the others (its ConvNeXt keeps "
                          "every downsample layer in one list ahead of the stages), so a per-tensor lr decay "
                          "that walks registration order reaches them last; unset: the body's own order")

    @model_validator(mode="after")
    def _parts_apart(self) -> Backbone:
        """Each module in one part only, once: a repeated or nested entry would run twice (a repeated
        trunk entry fails in the trunk pass, a body entry inside the trunk fails on shapes mid-training)."""
        entries = [*(("trunk", m) for m in self.trunk), *(("body", m) for m in self.body), ("head", self.head)]
        for i, (part, module) in enumerate(entries):
            for other_part, other in entries[:i]:
                if module == other or module.startswith(other + ".") or other.startswith(module + "."):
                    how = "repeats" if module == other else "overlaps"
                    raise ValueError(f"backbone.{part} entry {module!r} {how} backbone.{other_part} entry {other!r}: "
                                     f"every module belongs to one of trunk, body and head, once")
        repeated = sorted({t for t in self.lora_targets if self.lora_targets.count(t) > 1})
        if repeated:
            raise ValueError(f"backbone.lora_targets repeats {', '.join(map(repr, repeated))}")
        return self

    @model_validator(mode="after")
    def _registered_first_in_body(self) -> Backbone:
        unknown = [m for m in self.registered_first or [] if m not in self.body]
        if unknown:
            raise ValueError(f"backbone.registered_first names {', '.join(unknown)}, not entries of backbone.body")
        return self

    def registration_order(self) -> list[int]:
        """Indices of the body entries in the published model's registration order."""
        first = [self.body.index(m) for m in self.registered_first or []]
        return first + [i for i in range(len(self.body)) if i not in first]


class Pretrain(Spec):
    """How the deployed model (session 1) comes about."""

    mode: Literal["weights", "train"] = Field(
        description="weights: the public model's own head covers S1 (ImageNet); train: fit on S1 once, cached"
    )
    updates: int = Field(0, ge=0, le=MAX_UPDATES)
    batch_size: BatchSize = 128
    lr: LearningRate = 1e-3
    weight_decay: Decay = 0.05
    trainable: Literal["head", "body+head"] = "body+head"
    seed: Seed = Field(0, description="fixed: every run of the protocol starts from the same deployed model")


class Batch(Spec):
    """Composition of one update's minibatch; the harness draws it, the method only consumes it."""

    new: int = Field(gt=0, le=MAX_BATCH, description="samples from the current session")
    old: int = Field(0, ge=0, le=MAX_BATCH, description="samples from memory (rehearsal methods only)")

    @property
    def size(self) -> int:
        return self.new + self.old


class ComputeBudget(Spec):
    """A session's training compute, counted as the FLOP meter reports it (harness/model/flops.py: fvcore
    MACs x 2, backward by trainability, the trunk uncached-equivalent, begin_session's work included)."""

    tflops: PositiveFinite = Field(description="training TFLOPs per session", le=MAX_TFLOPS)


class Training(Spec):
    updates: Updates | Literal["per_sample"] | None = Field(
        None, description="U, optimizer updates per session; per_sample = online, one update per arriving sample; "
                          "exactly one of updates and budget")
    budget: ComputeBudget | None = Field(
        None, description="instead of updates: each session trains while its next update fits this many "
                          "training TFLOPs (offline); the method's per-update cost sets how many updates it makes")
    batch: Batch
    augment: bool = Field(False, description="random crop + flip on training images (disables train cache)")
    class_balanced: bool = Field(False, description="draw old samples class-balanced instead of uniformly")
    old_mix: Literal["pooled", "by_source"] | None = Field(
        None, description="where the old half comes from. pooled (unset): batch.old drawn from the whole memory "
                          "(the text: 50 % from earlier batches and ImageNet); by_source: the published code's "
                          "loaders, batch.old from the pre-training data in every session and, from the second "
                          "learning session on, a quarter of batch.new given to earlier sessions' samples")
    source_draw: Literal["per_batch", "tiled"] | None = Field(
        None, description="by_source only: how a session draws each source's stored samples. tiled: as the published "
                          "loaders, the source's stored ids tiled to the session's draws, shuffled once (seeded) and "
                          "read in order, so each is drawn floor(n) or ceil(n) times (n = draws per stored id); "
                          "per_batch (unset): each batch drawn afresh, uniformly within its source")

    @model_validator(mode="after")
    def _one_budget(self) -> Training:
        if (self.updates is None) == (self.budget is None):
            raise ValueError("training needs exactly one of updates (a count per session) and budget "
                             "(training TFLOPs per session, e.g. budget: {tflops: 0.5})"
                             + (", not both" if self.updates is not None else ""))
        return self

    @model_validator(mode="after")
    def _mix_has_sources(self) -> Training:
        if self.old_mix == "by_source" and not self.batch.old:
            raise ValueError("training.old_mix 'by_source' splits the old half by source: batch.old must be > 0")
        if self.source_draw is not None and self.old_mix != "by_source":
            raise ValueError("training.source_draw says how each source of a by_source batch is drawn: it needs "
                             "training.old_mix: by_source")
        if self.source_draw == "tiled" and not isinstance(self.updates, int):
            # a session's list is fixed at its start, tiled to its draws: online, the memory changes within the
            # session (a listed id may be evicted); under a FLOP budget the number of draws is not known
            raise ValueError("training.source_draw 'tiled' fixes each session's list of draws at its start: it needs "
                             "a count of updates (not per_sample, not a FLOP budget); use per_batch")
        if self.source_draw == "tiled" and self.class_balanced:
            raise ValueError("training.source_draw 'tiled' draws every stored id about equally often, which is not a "
                             "class-balanced draw: drop one of the two")
        return self

    @property
    def online(self) -> bool:
        return self.updates == "per_sample"

    def session_updates(self, session_samples: int) -> int | None:
        """Updates of a session with ``session_samples`` training samples: the protocol's count, one per
        sample online, None under a FLOP budget (the method's per-update cost decides, during the run)."""
        if self.budget is not None:
            return None
        return self.updates if isinstance(self.updates, int) else session_samples


class Memory(Spec):
    policy: Literal["unlimited", "reservoir", "class_balanced", "split", "none"] = Field(
        "unlimited", description="split: a fixed subset of S1 (pretrain_share of the cap) beside a class-balanced "
                                 "buffer of the stream (the rest), as the paper's storage-limited Places365 runs")
    capacity: int | None = Field(None, gt=0, le=10**9, description="max stored samples; required unless unlimited/none")
    include_pretrain: bool = Field(True, description="S1 data is stored and rehearsed too")
    pretrain_share: float | None = Field(None, gt=0, lt=1, description="split only: the cap's fraction kept for S1")
    arrival: Literal["shuffled", "by_class"] | None = Field(
        None, description="the order a session's samples are offered to a capped memory in: shuffled (unset), as "
                          "they arrived; by_class: in the data's own order (the catalog's ids: class by class where "
                          "the source lists its samples by class, as Places365-Standard's train list and ImageFolder "
                          "do), as the published code's update_buffer reads an unshuffled loader; changes what "
                          "survives eviction")

    @model_validator(mode="after")
    def _capacity_matches_policy(self) -> Memory:
        if self.policy in ("reservoir", "class_balanced", "split") and self.capacity is None:
            raise ValueError(f"memory.capacity is required for policy {self.policy!r}")
        if self.policy in ("unlimited", "none") and self.capacity is not None:
            raise ValueError(f"memory.capacity must be empty for policy {self.policy!r}")
        if (self.policy == "split") != (self.pretrain_share is not None):
            raise ValueError("memory.pretrain_share is required for policy 'split' and only for it")
        if self.policy == "split" and not self.include_pretrain:
            raise ValueError("memory.policy 'split' keeps a share of S1: include_pretrain must be true")
        return self

    def split_caps(self) -> tuple[int, int]:
        """The split policy's two caps: the pre-training part (``pretrain_share`` of the capacity) and
        the stream's part (the rest)."""
        if self.capacity is None or self.pretrain_share is None:
            raise ValueError(f"memory policy {self.policy!r} is not split: it has no pre-training part")
        pretrain = round(self.pretrain_share * self.capacity)
        return pretrain, self.capacity - pretrain


class ComputeSchedule(Spec):
    """Eval points by a session's training compute (a FLOP-budgeted protocol): every ``every`` TFLOPs, and
    every ``dense_every`` until ``dense_until``, counted as the budget counts them (begin_session's work
    included). Updates are discrete, so a point is taken at the first update boundary at or past it: every
    method is evaluated within one of its own updates of the same compute."""

    every: PositiveFinite = Field(description="training TFLOPs of the session between eval points")
    dense_every: PositiveFinite | None = Field(None, description="TFLOPs between points until dense_until")
    dense_until: float = Field(0.0, ge=0, allow_inf_nan=False, description="TFLOPs into the session")

    def marks(self, tflops: float) -> int:
        """How many schedule points lie at or below ``tflops`` (a point shared by both grids counts twice,
        which does not matter: a point is due when this count grows)."""
        dense = math.floor(min(tflops, self.dense_until) / self.dense_every) if self.dense_every else 0
        return math.floor(tflops / self.every) + dense

    def due(self, before: float, after: float) -> bool:
        """Whether a schedule point lies in (before, after]: the update that went from one to the other
        crossed it, so the harness evaluates after it."""
        return self.marks(after) > self.marks(before)

    def scaled(self, factor: float) -> ComputeSchedule:
        return ComputeSchedule(every=self.every * factor, dense_every=self.dense_every and self.dense_every * factor,
                               dense_until=self.dense_until * factor)


class Evaluation(Spec):
    """Eval schedule: at update 0, every ``every`` updates, and every ``dense_every`` until ``dense_until``;
    under a FLOP budget, by compute instead (``tflops``), so that methods whose updates cost different
    FLOPs are compared at the same compute."""

    every: int | None = Field(None, gt=0, le=MAX_UPDATES, description="updates between eval points (update budgets)")
    dense_every: int | None = Field(None, gt=0, le=MAX_UPDATES)
    dense_until: int = Field(0, ge=0, le=MAX_UPDATES)
    tflops: ComputeSchedule | None = Field(None, description="eval points by training TFLOPs (FLOP budgets)")
    batch_size: BatchSize = 256

    @model_validator(mode="after")
    def _one_schedule(self) -> Evaluation:
        if (self.every is None) == (self.tflops is None):
            raise ValueError("eval needs exactly one schedule: every (updates, for training.updates) or tflops "
                             "(e.g. tflops: {every: 0.05}, for training.budget)")
        if self.tflops is not None and (self.dense_every is not None or self.dense_until):
            raise ValueError("eval.dense_every and eval.dense_until count updates; under eval.tflops give "
                             "tflops.dense_every and tflops.dense_until")
        return self

    def due(self, update: int) -> bool:
        """Whether the update schedule evaluates after ``update`` updates (a session's last update is added
        by the run: ``points`` when the count is fixed)."""
        if self.every is None:
            raise ValueError("this protocol evaluates by compute (eval.tflops), not by update count")
        return update % self.every == 0 or bool(
            self.dense_every and update <= self.dense_until and update % self.dense_every == 0)

    def points(self, total_updates: int) -> list[int]:
        """Sorted update counts after which the harness evaluates; always includes 0 and the last update."""
        return [u for u in range(total_updates + 1) if u == total_updates or self.due(u)]


class JointReference(Spec):
    """The upper bound A_joint: a model trained on S1..Sj (per session) or once on everything (final)."""

    mode: Literal["per_session", "final"] = "per_session"
    updates: Updates
    batch_size: BatchSize
    lr: LearningRate
    weight_decay: Decay = 0.05


# Tuning objectives: a Metrics field and whether lower is better (the gaps) or higher (accuracies).
OBJECTIVES: dict[str, Literal["minimize", "maximize"]] = {
    "CK_delta": "minimize", "S_delta": "minimize", "P_delta": "minimize",
    "alpha": "maximize", "mu": "maximize", "sigma": "maximize", "min_acc": "maximize", "wc_acc": "maximize",
}
MAX_TRIALS = 10_000


class Validation(Spec):
    """Training samples held out of every class (S1 and each session) to score runs made for tuning:
    never trained on, never stored in the memory; a tuning run reads them instead of the test split."""

    per_class: int = Field(gt=0, le=10_000_000, description="samples of every class held out of its training data")
    seed: Seed = Field(0, description="which samples are held out (fixed: the same for every run seed and trial)")


class TuningRules(Spec):
    """The tuning ruleset: every method tuned on this protocol gets the same number of trials, scored on
    the validation split by the same objective, so tuned rows compare only under the same ruleset."""

    trials: int = Field(gt=0, le=MAX_TRIALS, description="Optuna trials per method")
    objective: str = Field("CK_delta", description=f"metric a trial is scored by: {', '.join(OBJECTIVES)}")

    @model_validator(mode="after")
    def _known_objective(self) -> TuningRules:
        check_objective(self.objective, "tuning.objective")
        return self


def check_objective(objective: str, field: str) -> None:
    """An objective is a metric the harness computes on every run; anything else is refused by name."""
    if objective not in OBJECTIVES:
        raise ValueError(f"{field} {objective!r} is not a metric tuning can score; one of {', '.join(OBJECTIVES)}")


class Protocol(Spec):
    name: str = Field(pattern=r"^[a-z0-9_]+(@[0-9.]+x)?$", max_length=MAX_NAME,
                      description="lower-case; NAME@Kx is NAME with its FLOP budget scaled by K (load_protocol)")
    version: int = Field(ge=1)
    description: str
    superseded_by: str | None = Field(None, description="the built-in protocol (or protocol file) replacing this one")
    paper_ref: str | None = Field(None, description="section / table of the paper this protocol reproduces")
    embedded: bool = Field(False, description="runs offline with data that installs with the project")
    pretrain_data: DataSource
    stream_data: Annotated[list[DataSource], Field(min_length=1)]
    ordering: Literal["cil", "iid"]
    sessions: int = Field(gt=0, le=10_000, description="N - 1: learning sessions after the deployed model")
    classes_per_session: int | None = Field(None, gt=0, le=MAX_CLASSES, description="CIL: new classes per session")
    class_order: str | None = Field(
        None, description="CIL: the order classes arrive in. seeded (unset): a permutation drawn from the run seed; "
                          "published: the paper's Places365 orders, run seed i taking the i-th of the seeds "
                          "1993, 1, 74, 1444, 1883, 2023; file:PATH: the class names in a file, one per line (PATH "
                          "relative to the working directory)")
    backbone: Backbone
    pretrain: Pretrain
    training: Training
    memory: Memory = Memory()
    eval: Evaluation
    joint: JointReference
    best_new_reference: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.+-]+$")]] = Field(
        default_factory=lambda: ["vanilla"], min_length=1,
        description="method strings whose runs (default settings, same seed) set A_best(E_j) for P_Δ, with "
                    "the scored run itself; the harness runs any that are missing first")
    validation: Validation | None = Field(None, description="held-out training samples that runs made for tuning "
                                                            "are scored on")
    tuning: TuningRules | None = Field(None, description="the tuning ruleset every method tuned here follows")
    hook_time_limit: PositiveFinite | None = Field(
        None, description="seconds one call into a method (observe, predict, a session hook...) may take before "
                          "the run is stopped as the method's fault (exit 2, its checkpoint kept); unset: "
                          "derived from the run, max(300 s, 100 x its slowest update so far). --hook-time-limit "
                          "overrides it. It changes no number, so it is not part of the spec hash")
    scored_on: Literal["test", "validation"] = Field(
        "test", description="validation: this spec is the tuning view (held-out samples replace the test split); "
                            "set by the harness (Protocol.tuning_view), not written in protocol files")

    _reference: Protocol | None = PrivateAttr(None)  # NAME@Kx: NAME, whose references it shares
    _source: str | None = PrivateAttr(None)  # the YAML file it was loaded from (None: a built-in)

    @property
    def source_file(self) -> str | None:
        """The absolute path of the protocol file it came from (its NAME@Kx too); None for a built-in.
        Results record it, so a message about a family of one's own can name a command that works."""
        return self._source

    @property
    def reference(self) -> Protocol:
        """The protocol whose deployed model and joint reference this one uses: itself, or for NAME@Kx the
        protocol NAME, as scaling the FLOP budget and its eval schedule changes neither (both are trained
        and stored once, under NAME's hash, for every budget)."""
        return self._reference or self

    @model_validator(mode="after")
    def _ordering_fields(self) -> Protocol:
        if self.ordering == "cil" and self.classes_per_session is None:
            raise ValueError("classes_per_session is required for ordering 'cil'")
        if self.ordering != "cil" and self.classes_per_session is not None:
            raise ValueError(f"classes_per_session ({self.classes_per_session}) sets the classes of CIL sessions; "
                             f"ordering {self.ordering!r} draws sessions regardless of class: remove it")
        if self.training.old_mix == "by_source" and not self.memory.include_pretrain:
            raise ValueError("training.old_mix 'by_source' draws batch.old from the stored pre-training data: "
                             "memory.include_pretrain must be true")
        if self.memory.policy == "none" and self.training.batch.old:
            raise ValueError("training.batch.old must be 0 when memory.policy is 'none'")
        if self.training.budget is not None and self.eval.tflops is None:
            raise ValueError("eval.tflops is required under training.budget: a FLOP-budgeted protocol places its "
                             "eval points by compute (e.g. eval: {tflops: {every: 0.05}}), not eval.every")
        if self.training.budget is None and self.eval.tflops is not None:
            raise ValueError("eval.tflops places eval points by compute, which needs training.budget; with "
                             "training.updates give eval.every")
        if self.training.budget is not None and self.eval.tflops is not None:
            points = self.eval.tflops.marks(self.training.budget.tflops)
            if points > MAX_EVAL_POINTS:
                raise ValueError(f"eval.tflops places {points:,} eval points in a session of training.budget.tflops "
                                 f"{self.training.budget.tflops:g}, more than {MAX_EVAL_POINTS:,}; raise "
                                 f"eval.tflops.every (and dense_every)")
        return self

    @model_validator(mode="after")
    def _known_class_order(self) -> Protocol:
        value = self.class_order
        if value is None or value in ("seeded", "published"):
            pass
        elif value.startswith("file:"):
            read_order_file(value)  # a missing file or a repeated name, before any data opens
        else:
            raise ValueError(f"class_order {value!r} is not an order: seeded, published or file:PATH")
        if value not in (None, "seeded") and self.ordering != "cil":
            raise ValueError(f"class_order {value!r} orders CIL sessions; ordering {self.ordering!r} has none")
        return self

    @model_validator(mode="after")
    def _distinct_stream_sources(self) -> Protocol:
        """Two entries reading the same data (``classes`` always keeps the first classes, subsamples draw
        with one fixed rng) would show the same images under two labels."""
        seen: dict[tuple[str, str | None, Synthetic | None], int] = {}
        for i, src in enumerate(self.stream_data):
            first = seen.setdefault((src.source, src.root, src.synthetic), i)
            if first != i:
                raise ValueError(f"stream_data[{i}] reads the same data as stream_data[{first}] (source "
                                 f"{src.source!r}): its images would arrive again under new labels; list each "
                                 f"source once (stream_data[{first}].classes sets how many of its classes)")
        return self

    @field_validator("superseded_by")
    @classmethod
    def _superseded_by_exists(cls, ref: str | None) -> str | None:
        if ref is not None and ref not in builtin_names() and not (is_path(ref) and Path(ref).expanduser().is_file()):
            raise ValueError(str(did_you_mean(ref, builtin_names(), "protocol")).rstrip(".") + ", and no protocol file")
        return ref

    @model_validator(mode="after")
    def _sizes_fit_the_data(self) -> Protocol:
        """Cross-field checks that need only the spec: every stream class is used (none silently
        dropped), and no batch asks for more samples than its data holds (sizes known only when the
        spec subsamples per class; other cases are checked when the data opens)."""
        problems = _size_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def tuning_view(self) -> Protocol:
        """This protocol as a tuning run sees it: the validation split held out of training and scored in
        place of the test split (``stream.build_stream``), which the run never opens."""
        if self.validation is None:
            raise BenchError(
                f"Protocol {self.name} declares no validation split, and runs made for tuning never read the "
                f"test split: add `validation: {{per_class: N}}` to the protocol (N training samples of every "
                f"class held out for scoring).")
        return self.model_copy(update={"scored_on": "validation"})

    @property
    def spec_hash(self) -> str:
        """Content hash of the validated spec (defaults included), stamped on every result. A field
        added after specs were hashed (HASHED_WHEN_SET) counts only once set, so adding it leaves the
        hash, and the caches and results keyed by it, of every spec that does not use it unchanged."""
        data = self.model_dump(mode="json")
        for section, field in HASHED_WHEN_SET:
            if data[section].get(field) is None:
                data[section].pop(field, None)
        if data.get("class_order") is None:  # added after specs were hashed: counts once set
            data.pop("class_order", None)
        elif data["class_order"].startswith("file:"):  # the order, not only where it lies
            try:
                data["class_order"] = read_order_file(data["class_order"])
            except ValueError as exc:  # the file changed since the spec was validated
                raise BenchError(f"Protocol {self.name}: {exc}.") from None
        # a test run is the same whatever the tuning ruleset and validation split: only the tuning view
        # (scored on the held-out samples, trained without them) is a different spec
        data.pop("tuning")
        data.pop("hook_time_limit")  # how long a call may take before it is stopped: a run that ends is the same
        if data.pop("scored_on") == "test":
            data.pop("validation")
        blob = json.dumps(data, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _samples(source: DataSource, classes: int | None) -> int | None:
    """Training samples ``classes`` classes of ``source`` hold, when the spec (or the catalog) fixes it."""
    per = source.train_images_per_class
    return None if classes is None or per is None else classes * per


def _size_problems(p: Protocol) -> list[str]:
    problems: list[str] = []
    counts = [s.num_classes for s in p.stream_data]
    n_stream = None if None in counts else sum(c for c in counts if c is not None)
    if p.ordering == "cil" and p.classes_per_session and n_stream is not None:
        per, need = p.classes_per_session, p.sessions * p.classes_per_session
        if n_stream % per:
            problems.append(
                f"classes_per_session ({per}) does not divide the {n_stream} stream classes: "
                f"{n_stream % per} class(es) could never be drawn; pick a divisor or narrow a source with "
                f"stream_data[i].classes")
        elif need > n_stream:
            problems.append(
                f"sessions ({p.sessions}) x classes_per_session ({per}) = {need} classes, but the stream "
                f"sources hold only {n_stream}")
    pre = _samples(p.pretrain_data, p.pretrain_data.num_classes)
    if p.pretrain.mode == "train" and pre is not None and p.pretrain.batch_size > pre:
        problems.append(f"pretrain.batch_size ({p.pretrain.batch_size}) exceeds the {pre} pre-training samples")
    if p.validation is not None:
        for where, src in [("pretrain_data", p.pretrain_data),
                           *((f"stream_data[{i}]", s) for i, s in enumerate(p.stream_data))]:
            if src.train_per_class is not None and p.validation.per_class >= src.train_per_class:
                problems.append(
                    f"validation.per_class ({p.validation.per_class}) holds out every training sample of "
                    f"{where} ({src.train_per_class} per class): nothing would be left to train on")
    sizes = [_samples(s, s.num_classes) for s in p.stream_data]
    total = None if None in sizes else sum(n for n in sizes if n is not None)
    if total is not None:
        per_class = min(s.train_images_per_class or 0 for s in p.stream_data)  # all known where total is
        smallest = (p.classes_per_session * per_class if p.ordering == "cil" and p.classes_per_session
                    else total // p.sessions)
        if not smallest:
            problems.append(f"sessions ({p.sessions:,}) over the {total:,} stream training samples leave none for "
                            f"a session: give fewer sessions than samples")
        elif p.training.batch.new > smallest:
            problems.append(f"training.batch.new ({p.training.batch.new}) exceeds the {smallest} training samples "
                            f"of the smallest session")
        if pre is not None and p.joint.batch_size > pre + smallest:
            problems.append(f"joint.batch_size ({p.joint.batch_size}) exceeds the {pre + smallest} samples the "
                            f"first joint model trains on")
    return problems + _old_batch_problems(p, pre, total)


def _old_batch_problems(p: Protocol, pre: int | None, stream: int | None) -> list[str]:
    """batch.old against the most samples the memory it is drawn from can ever hold, where the spec fixes
    that. The memory draws with replacement only while it fills; past this bound every update would draw
    each stored sample several times over, for the whole run."""
    old, mem = p.training.batch.old, p.memory
    bounds: list[tuple[int | None, str]]
    if p.training.old_mix == "by_source":  # batch.old comes from the stored pre-training data alone
        bounds = [(pre, "pre-training samples it is drawn from (training.old_mix 'by_source')"),
                  (mem.split_caps()[0] if mem.policy == "split" else mem.capacity,
                   "pre-training samples the memory keeps" if mem.policy == "split" else "samples of memory.capacity")]
    else:
        stored_pre = (pre if mem.include_pretrain else 0)
        everything = None if stream is None or stored_pre is None else stream + stored_pre
        bounds = [(mem.capacity, "samples of memory.capacity"),
                  (everything, "training samples the memory could ever store (pre-training and stream)")]
    known = [(n, what) for n, what in bounds if n is not None]
    if not old or not known:
        return []
    limit, what = min(known)
    return [] if old <= limit else [f"training.batch.old ({old:,}) exceeds the {limit:,} {what}: every update "
                                    f"would draw the same stored samples several times over; lower batch.old"]


HASHED_WHEN_SET: tuple[tuple[str, str], ...] = (("memory", "pretrain_share"), ("backbone", "registered_first"),
                                                ("training", "budget"), ("eval", "tflops"),
                                                ("training", "old_mix"), ("backbone", "head_units"),
                                                ("memory", "arrival"), ("training", "source_draw"))


def parse_protocol(text: str, origin: str) -> Protocol:
    """Validate YAML text as a protocol; every problem becomes a BenchError naming the field."""
    return parse_spec(Protocol, text, "protocol", origin)


DEFAULT_PROTOCOL = "tiny_cil"  # what `bench run` runs unless told otherwise; the leaderboard lists it first


def builtin_protocol_names() -> list[str]:
    return builtin_names()


# any number after the @, NaN, infinities and signs included, so that a factor the rule refuses is named as one
BUDGET_SCALE = re.compile(r"^(?P<base>.+)@(?P<factor>[-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|(?i:nan|inf)))x$")
MIN_BUDGET_SCALE = 1e-4  # a smaller K is a typo, not a budget family


def _not_a_changed_builtin(spec: Protocol) -> None:
    """A file may restate a built-in protocol, but not change it under the same name: results are filed
    and listed by name, so a changed copy's would land beside the built-in's as if they were stale."""
    match = BUDGET_SCALE.match(spec.name)  # NAME@Kx: a member of a built-in's budget family is built in too
    base = spec.name if match is None else match["base"]
    if base not in builtin_names():
        return
    try:
        builtin = load_protocol(spec.name).spec_hash
    except BenchError as err:
        raise BenchError(f"Protocol file {spec.source_file} is named {spec.name!r}, a name of the built-in protocol "
                         f"{base}'s budget family, which has no such member ({err}) Give it a name of its own, "
                         f"e.g. name: {base}_mine.") from None
    if spec.spec_hash != builtin:
        raise BenchError(
            f"Protocol file {spec.source_file} is named {spec.name!r}, as the built-in protocol, but differs from it "
            f"(spec hash {spec.spec_hash}, the built-in's {builtin}): its results would be filed as the built-in's. "
            f"Give it a name of its own, e.g. name: {base}_mine.")


def load_protocol(name_or_path: str) -> Protocol:
    """A built-in protocol by name, or a YAML file by path; ``NAME@Kx`` is NAME's FLOP budget scaled by K
    (its eval schedule too, so every budget is scored on as many points), named so, with its own hash."""
    match = BUDGET_SCALE.match(name_or_path)
    target = name_or_path if match is None else match["base"]
    base = load_spec(Protocol, target, "protocol")
    if Path(target).expanduser().is_file():  # a file of one's own (load_spec reads a path before a name)
        base._source = str(Path(target).expanduser().resolve())
        _not_a_changed_builtin(base)
    if match is None:
        return base
    factor = float(match["factor"])
    given = base.training.budget
    plain = re.fullmatch(r"[0-9]*\.?[0-9]+", match["factor"]) is not None  # one spelling, one family member
    if given is None or base.eval.tflops is None or not (
            plain and factor >= MIN_BUDGET_SCALE and given.tflops * factor <= MAX_TFLOPS):
        why = (f"{match['base']} has no FLOP budget (training.budget) to scale" if base.training.budget is None
               else f"K must be a plain decimal (e.g. 0.5) of at least {MIN_BUDGET_SCALE:g} that keeps the budget "
                    f"within {MAX_TFLOPS:g} TFLOPs a session")
        raise BenchError(f"Protocol {name_or_path!r}: NAME@Kx scales a FLOP-budgeted protocol's "
                         f"training.budget.tflops by K, and {why}.")
    budget = ComputeBudget(tflops=given.tflops * factor)
    scaled = base.model_copy(update={
        "name": f"{base.name}@{factor:g}x",
        "training": base.training.model_copy(update={"budget": budget}),
        "eval": base.eval.model_copy(update={"tflops": base.eval.tflops.scaled(factor)}),
    })
    scaled._reference, scaled._source = base, base._source
    return scaled
