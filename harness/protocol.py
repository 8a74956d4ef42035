"""Protocol specs: the data stream, budget, storage cap and eval cadence of one benchmark setting.

A protocol is a versioned YAML file validated by pydantic (``extra="forbid"``); its content hash is
stamped on every result so that results from different specs are never compared.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .specfile import builtin_names, load_spec, parse_spec


class Spec(BaseModel):
    """Base for every spec model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


SourceName = Literal[
    "fashion_mnist", "mnist5k", "animal_mnist", "imagenet", "places365", "places365_lt", "cub200", "synthetic"
]


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
    train_per_class: int | None = Field(None, gt=0, description="subsample training images per class")
    test_per_class: int | None = Field(None, gt=0, description="subsample test images per class")
    classes: int | None = Field(None, gt=0, description="use only the first N classes of the source")
    synthetic: Synthetic | None = Field(None, description="source 'synthetic' only: its class and image counts")

    @model_validator(mode="after")
    def _synthetic_counts(self) -> DataSource:
        if (self.source == "synthetic") != (self.synthetic is not None):
            raise ValueError("synthetic (the counts) is required for source 'synthetic' and only for it")
        return self


class Backbone(Spec):
    """The timm model, where its weights come from, and how it splits into trunk | body | head."""

    model: str
    weights: str = Field(
        description="package:<module> (weights shipped in a pip package), file:<path>, or timm:<name.tag>"
    )
    input_size: int = Field(gt=0)
    in_chans: int = 3
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    trunk: list[str] = Field(min_length=1, description="module paths frozen for the whole run")
    body: list[str] = Field(min_length=1, description="module paths that stay plastic")
    head: str = Field(description="module path of the pretrained classifier (replaced by a growing head)")
    lora_targets: list[str] = Field(default_factory=list, description="names of the body's 1x1 convs")


class Pretrain(Spec):
    """How the deployed model (session 1) comes about."""

    mode: Literal["weights", "train"] = Field(
        description="weights: the public model's own head covers S1 (ImageNet); train: fit on S1 once, cached"
    )
    updates: int = Field(0, ge=0)
    batch_size: int = Field(128, gt=0)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.05, ge=0)
    trainable: Literal["head", "body+head"] = "body+head"
    seed: int = Field(0, description="fixed: every run of the protocol starts from the same deployed model")


class Batch(Spec):
    """Composition of one update's minibatch; the harness draws it, the method only consumes it."""

    new: int = Field(gt=0, description="samples from the current session")
    old: int = Field(0, ge=0, description="samples from memory (rehearsal methods only)")

    @property
    def size(self) -> int:
        return self.new + self.old


class Training(Spec):
    updates: int | Literal["per_sample"] = Field(
        description="U, optimizer updates per session; per_sample = online, one update per arriving sample"
    )
    batch: Batch
    augment: bool = Field(False, description="random crop + flip on training images (disables train cache)")
    class_balanced: bool = Field(False, description="draw old samples class-balanced instead of uniformly")


class Memory(Spec):
    policy: Literal["unlimited", "reservoir", "class_balanced", "none"] = "unlimited"
    capacity: int | None = Field(None, gt=0, description="max stored samples; required unless unlimited/none")
    include_pretrain: bool = Field(True, description="S1 data is stored and rehearsed too")

    @model_validator(mode="after")
    def _capacity_matches_policy(self) -> Memory:
        if self.policy in ("reservoir", "class_balanced") and self.capacity is None:
            raise ValueError(f"memory.capacity is required for policy {self.policy!r}")
        if self.policy in ("unlimited", "none") and self.capacity is not None:
            raise ValueError(f"memory.capacity must be empty for policy {self.policy!r}")
        return self


class Evaluation(Spec):
    """Eval schedule: at update 0, every ``every`` updates, and every ``dense_every`` until ``dense_until``."""

    every: int = Field(gt=0)
    dense_every: int | None = Field(None, gt=0)
    dense_until: int = Field(0, ge=0)
    batch_size: int = Field(256, gt=0)

    def points(self, total_updates: int) -> list[int]:
        """Sorted update counts after which the harness evaluates; always includes 0 and the last update."""
        pts = {0, total_updates, *range(self.every, total_updates + 1, self.every)}
        if self.dense_every:
            pts.update(range(self.dense_every, min(self.dense_until, total_updates) + 1, self.dense_every))
        return sorted(pts)


class JointReference(Spec):
    """The upper bound A_joint: a model trained on S1..Sj (per session) or once on everything (final)."""

    mode: Literal["per_session", "final"] = "per_session"
    updates: int = Field(gt=0)
    batch_size: int = Field(gt=0)
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.05, ge=0)


class Protocol(Spec):
    name: str = Field(pattern=r"^[a-z0-9_]+$")
    version: int = Field(ge=1)
    description: str
    superseded_by: str | None = None
    paper_ref: str | None = Field(None, description="section / table of the paper this protocol reproduces")
    embedded: bool = Field(False, description="runs offline with data that installs with the project")
    pretrain_data: DataSource
    stream_data: Annotated[list[DataSource], Field(min_length=1)]
    ordering: Literal["cil", "iid"]
    sessions: int = Field(gt=0, description="N - 1: learning sessions after the deployed model")
    classes_per_session: int | None = Field(None, gt=0, description="CIL: new classes per session")
    backbone: Backbone
    pretrain: Pretrain
    training: Training
    memory: Memory = Memory()
    eval: Evaluation
    joint: JointReference

    @model_validator(mode="after")
    def _ordering_fields(self) -> Protocol:
        if self.ordering == "cil" and self.classes_per_session is None:
            raise ValueError("classes_per_session is required for ordering 'cil'")
        if self.memory.policy == "none" and self.training.batch.old:
            raise ValueError("training.batch.old must be 0 when memory.policy is 'none'")
        return self

    @property
    def spec_hash(self) -> str:
        """Content hash of the validated spec (defaults included), stamped on every result."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def parse_protocol(text: str, origin: str) -> Protocol:
    """Validate YAML text as a protocol; every problem becomes a BenchError naming the field."""
    return parse_spec(Protocol, text, "protocol", origin)


def builtin_protocol_names() -> list[str]:
    return builtin_names()


def load_protocol(name_or_path: str) -> Protocol:
    """A built-in protocol by name, or a YAML file by path."""
    return load_spec(Protocol, name_or_path, "protocol")
