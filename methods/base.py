"""The method contract, and the standard training step that modifiers hook into.

A method is one object with a small contract (Mammoth's ``observe`` is the model): the harness owns
the stream, the batches, the memory and the budget; the method turns one batch into exactly one
optimizer update.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel
from torch import Tensor, nn

from ..harness.model.compute import ComputeEnv
from .configs import MethodConfig, NoConfig  # noqa: F401 - re-exported: plugins subclass MethodConfig from here

if TYPE_CHECKING:
    from ..harness.data.stream import Session
    from ..harness.model.backbone import SplitModel
    from ..harness.run.isolation import LentInputs, MemoryView, TrainStream
    from ..harness.spec.protocol import Protocol


@dataclass
class Context:
    """What the harness lends a method for the run (docs/writing-a-method.md): nothing here leads to the
    test split, the memory's ``add`` or the harness's own random streams."""

    protocol: Protocol              # the protocol spec of the run (sessions, budgets, backbone, memory)
    stream: TrainStream             # sessions, train catalog and labels; no test split
    device: torch.device            # where the model and the batches are (cpu or cuda)
    memory: MemoryView              # read-only: ids, capacity, spec
    inputs: LentInputs              # train inputs by global id, for ids in the memory or the session in progress
    rng: np.random.Generator        # the method's own numpy stream (the harness draws batches from another)
    generator: torch.Generator      # the method's own torch stream, for any parameter init it does
    compute: ComputeEnv = field(default_factory=ComputeEnv.now)
    """the process settings the run computes under (device, precision, CPU kernel set and threads); build
    an AdamW with ``compute.optimizer(groups)`` to step as the standard step does"""
    counters: dict[str, float] = field(default_factory=dict)
    """extra compute a method declares; names and which are charged: harness.model.flops.COUNTERS"""
    planned_updates: Callable[[], int] | None = None
    """under a FLOP budget: the updates the rest of the session's budget pays for at the next update's price
    (a prediction, for a schedule's length); None under an update count"""


@dataclass
class TrainBatch:
    """One update's batch: the session's new samples first, then those the harness drew from the memory."""

    x: Tensor              # inputs, on ctx.device: trunk features when the trunk is cached, else images
    y: Tensor              # stream labels (int64)
    ids: np.ndarray        # global train ids (numpy int64), the memory's currency
    is_new: Tensor         # bool mask: sample comes from the current session (the first rows), not the memory
    labels: np.ndarray | None = None  # ``y`` on the host, when the harness made the batch
    new: np.ndarray | None = None     # ``is_new`` on the host, likewise

    def host_labels(self) -> np.ndarray:
        """``y`` as a numpy array, without a copy back from the device where the batch carries it (that copy
        waits for everything the GPU has queued)."""
        return self.labels if self.labels is not None else self.y.cpu().numpy()

    def host_is_new(self) -> np.ndarray:
        """``is_new`` as a numpy array, likewise."""
        return self.new if self.new is not None else self.is_new.cpu().numpy()


@dataclass
class StepStats:
    """What an update reports: its loss, as a 0-dim tensor (the harness reads it with the others at eval points,
    so an update never waits for the device) or a float."""

    loss: Tensor | float


class Method(ABC):
    """Base of every method, built-in or plugin."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Config: ClassVar[type[BaseModel]] = MethodConfig
    rehearsal: ClassVar[bool] = True            # False: the whole batch comes from the current session
    memory_policy: ClassVar[str | None] = None  # e.g. "class_balanced" (GDumb); None: the protocol's policy
    uses_standard_step: ClassVar[bool] = False  # True: every modifier composes with it
    # samples' worth of input-shaped data the method may keep outside the harness's memory (a batch it
    # caches, a prototype per class in input space); counted with the memory against the storage cap
    retained_allowance: ClassVar[int] = 0
    # the modifiers this method works with, when not all do (None: any modifier of the standard step).
    # A method whose loss term a modifier makes inert (``bench check-method`` says which) lists the others
    compatible_modifiers: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, config: BaseModel, modifiers: list[Modifier] | None = None) -> None:
        self.config = config
        self.modifiers = modifiers or []
        if self.modifiers and not self.uses_standard_step:
            names = ", ".join(m.name for m in self.modifiers)
            raise ValueError(f"{self.name} does not use the standard step; modifiers {names} cannot apply")
        for m in self.modifiers:
            m.check_combination(self.modifiers)

    @property
    def label(self) -> str:
        """The method string this instance was built from, modifiers included (``vanilla+sgm``)."""
        return "+".join([self.name, *(m.name for m in self.modifiers)])

    @abstractmethod
    def setup(self, model: SplitModel, ctx: Context) -> None: ...

    def begin_session(self, session: Session) -> None:  # noqa: B027 - optional hook
        pass

    @abstractmethod
    def observe(self, batch: TrainBatch) -> StepStats:
        """Exactly one optimizer update on ``batch``."""

    def end_session(self, session: Session) -> None:  # noqa: B027 - optional hook
        pass

    @abstractmethod
    def predict(self, x: Tensor) -> Tensor:
        """Logits over every class seen so far; called in eval mode under no_grad."""

    def sample_bytes(self, gid: int) -> int | None:
        """Bytes one stored sample costs when the method stores something other than the raw sample
        (REMIND: product-quantised codes); None means the raw sample's size."""
        return None

    def shared_in_eval_copy(self) -> list[object]:
        """Objects the harness's throwaway eval copy shares instead of deep-copying, because they cannot
        be copied (a faiss quantizer); ``predict`` must only read them."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027
        pass


class Modifier:
    """A change to the standard step (SGM's components). Every hook is optional."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Config: ClassVar[type[BaseModel]] = NoConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        self.config = config if config is not None else self.Config()

    def check_combination(self, modifiers: list[Modifier]) -> None:
        """Raise BenchError when this modifier cannot sit beside ``modifiers`` (checked when the method
        is built, so a bad method string fails before anything trains, joint reference included)."""

    def setup(self, method: StandardMethod) -> None: ...
    def begin_session(self, method: StandardMethod, session: Session) -> None: ...
    def before_update(self, method: StandardMethod, batch: TrainBatch) -> None:
        """Before the forward pass of each update (online init writes a first-arriving class's row)."""
    def targets(self, method: StandardMethod, batch: TrainBatch, logits: Tensor) -> Tensor | None:
        return None
    def after_backward(self, method: StandardMethod) -> None: ...
    def after_update(self, method: StandardMethod) -> None:
        """After the optimizer (and schedule) step of each update."""
    def param_groups(self, method: StandardMethod, groups: list[dict]) -> list[dict]:
        return groups
    def scheduler(self, method: StandardMethod, optimizer: torch.optim.Optimizer, total_steps: int | None):
        """A learning-rate schedule over the session's ``total_steps`` updates (None: the count is not known,
        under a FLOP budget without a prediction), or None for none."""
        return None
    def end_session(self, method: StandardMethod, session: Session) -> None: ...
    def predict(self, method: StandardMethod, x: Tensor) -> Tensor | None:
        """Scores that replace the head's logits at evaluation (a nearest-mean head); None: the head's."""
        return None
    def shared_in_eval_copy(self) -> list[object]:
        """What the harness's throwaway eval copy shares rather than copies (``Method.shared_in_eval_copy``)."""
        return []
    def check_base(self, method_cls: type[Method], protocol: Protocol) -> None:
        """Raise BenchError when this modifier cannot work on ``method_cls`` under ``protocol`` (checked
        when the method is built, before anything trains)."""
    def state_dict(self) -> dict[str, Any]:
        return {}
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def layerwise_groups(model: SplitModel, lr: float, weight_decay: float, layer_decay: float,
                     train_body: bool, unit: str = "module", order: list[int] | None = None) -> list[dict]:
    """Parameter groups with the lr decayed by ``layer_decay`` per step below the head.

    ``unit="module"``: the head is one group at ``lr``, each body module (``backbone.body`` entry) one
    group, ``lr * layer_decay**depth`` counted from the top. ``unit="tensor"``: the published code's
    ``get_layerwise_params`` (yousuf907/SGM, model_sgm.py / model_vanilla.py): every parameter tensor of
    body then head, in ``named_parameters`` order, reversed, tensor ``i`` from the end at
    ``lr * layer_decay**i``; frozen tensors (LoRA's base weights) count as steps but get no group. So the
    head's bias trains at ``lr``, its weight at ``0.9 lr``, and a body a hundred tensors deep barely moves.
    ``order``: the body entries' indices in the order the walk meets them from the bottom (the published
    model's registration order, ``Backbone.registration_order``); unset: the body's own order.
    """
    if unit == "tensor":
        named = []
        for k in (order if order is not None else range(len(model.body))) if train_body else []:
            named += [(f"body.{k}.{n}", p) for n, p in model.body[k].named_parameters()]
        named += [(f"head.{n}", p) for n, p in model.head.named_parameters()]
        return [{"name": name, "params": [p], "lr": lr * layer_decay**i, "weight_decay": weight_decay}
                for i, (name, p) in enumerate(reversed(named)) if p.requires_grad]
    groups = [{"name": "head", "params": [p for p in model.head.parameters() if p.requires_grad],
               "lr": lr, "weight_decay": weight_decay}]
    if train_body:
        layers = list(model.body)
        for depth, layer in enumerate(reversed(layers), start=1):
            params = [p for p in layer.parameters() if p.requires_grad]
            if params:
                groups.append({"name": f"body.{len(layers) - depth}", "params": params,
                               "lr": lr * layer_decay**depth, "weight_decay": weight_decay})
    return groups


class StandardMethod(Method):
    """Cross-entropy on the batch, AdamW with layer-wise lr decay, with modifier hook points.

    Hooks, in order: setup -> begin_session -> (per update) before_update, targets, after_backward,
    after_update -> end_session; predict replaces the head's logits at evaluation;
    param_groups and scheduler shape the optimizer built at each session start.
    """

    uses_standard_step = True
    Config = MethodConfig

    config: MethodConfig
    """Your settings (the ``Config`` class), resolved from the defaults, the protocol's entries and ``--set``."""
    modifiers: list[Modifier]
    """The modifiers of the method string, in order (``vanilla+soft+oocf``: soft, then oocf)."""
    model: SplitModel
    """The deployed model (``trunk``, ``body``, ``head``), set by ``setup``; the harness grows ``head``
    before each ``begin_session``, and under ``lora`` the body holds adapters during a session (docs:
    section 13)."""
    ctx: Context
    """What the harness lends for the run, set by ``setup`` (the tables below)."""
    session: Session
    """The session in progress, set by ``begin_session``."""
    optimizer: torch.optim.Optimizer | None
    """AdamW over the parameter groups, built at each ``begin_session`` (after the modifiers' hooks); None
    between sessions."""
    scheduler: Any  # an LRScheduler or None; state_dict() reads it through getattr, which mypy does not narrow
    """The learning-rate schedule a modifier returned (``sgm``'s OneCycle), or None."""

    def setup(self, model: SplitModel, ctx: Context) -> None:
        """Keep the model and the context; freeze the body unless ``trainable`` is body+head; the modifiers' setup."""
        self.model, self.ctx = model, ctx
        train_body = self.config.trainable == "body+head"
        for p in model.body.parameters():
            p.requires_grad_(train_body)
        for m in self.modifiers:
            m.setup(self)

    def begin_session(self, session: Session) -> None:
        """The modifiers' ``begin_session`` (LoRA injects, OOCF hooks the old rows), then a fresh optimizer."""
        self.session = session
        for m in self.modifiers:
            m.begin_session(self, session)
        self.optimizer, self.scheduler = self.build_optimizer(self.session_updates(session))
        self._restore_optimizer()

    def session_updates(self, session: Session) -> int | None:
        """Updates in ``session``: the protocol's count, one per sample online; under a FLOP budget the
        harness's prediction (``ctx.planned_updates``: the run itself stops when the next update would
        pass the budget, so a schedule built on it may end an update early or late)."""
        fixed = self.ctx.protocol.training.session_updates(len(session.train_ids))
        if fixed is None and self.ctx.planned_updates is not None:
            return self.ctx.planned_updates()
        return fixed

    def build_optimizer(self, total_steps: int | None):
        """AdamW of the run's kernel set (``ctx.compute.optimizer``: fused on the CPU) with layer-wise lr
        decay over what has ``requires_grad``, shaped by the modifiers; and their schedule."""
        cfg = self.config
        groups = layerwise_groups(self.model, cfg.lr, cfg.weight_decay, cfg.layer_decay,
                                  train_body=any(p.requires_grad for p in self.model.body.parameters()),
                                  unit=cfg.layer_decay_unit, order=self.decay_order())
        for m in self.modifiers:
            groups = m.param_groups(self, groups)
        groups = [g for g in groups if g["params"]]
        optimizer = self.ctx.compute.optimizer(groups)
        scheduler = None
        for m in self.modifiers:
            scheduler = m.scheduler(self, optimizer, total_steps) or scheduler
        return optimizer, scheduler

    def session_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer of the session in progress: ``begin_session`` builds it, so an update outside a
        session is a harness bug, said as such."""
        optimizer: torch.optim.Optimizer | None = getattr(self, "optimizer", None)
        if optimizer is None:
            raise RuntimeError(f"{self.label}: no session in progress, so no optimizer (begin_session builds it)")
        return optimizer

    def decay_order(self) -> list[int] | None:
        """The body entries' order for the per-tensor lr decay (None: forward order)."""
        if getattr(self.config, "layer_decay_order", "body") == "registration":
            return self.ctx.protocol.backbone.registration_order()
        return None

    def _restore_optimizer(self) -> None:
        optimizer_state, scheduler_state = getattr(self, "_pending_optimizer_state", (None, None))
        if optimizer_state is not None:
            self.session_optimizer().load_state_dict(optimizer_state)
        if scheduler_state is not None and self.scheduler is not None:
            self.scheduler.load_state_dict(scheduler_state)
        self._pending_optimizer_state = (None, None)

    def loss_terms(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> dict[str, Tensor]:
        """The loss, term by term (their sum is what trains). A method that adds a term (a penalty, a
        distillation) returns it here under a name of its own, beside the cross-entropy: ``bench
        check-method`` then checks that each term reaches a trainable parameter once the modifiers are
        applied, and names the term a modifier makes inert."""
        return {"cross_entropy": F.cross_entropy(logits, targets)}

    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        """The sum of ``loss_terms`` (cross-entropy against class indices or a probability vector, such
        as soft targets, unless a method says otherwise)."""
        terms = iter(self.loss_terms(batch, logits, targets).values())
        total = next(terms)
        for term in terms:
            total = total + term
        return total

    def observe(self, batch: TrainBatch) -> StepStats:
        """One update: modifiers' ``before_update``, forward, ``targets``, ``loss``, backward,
        ``after_backward``, step."""
        for m in self.modifiers:
            m.before_update(self, batch)
        self.model.train()
        logits = self.model(batch.x)
        targets: Tensor = batch.y
        for m in self.modifiers:
            replaced = m.targets(self, batch, logits)
            targets = targets if replaced is None else replaced
        loss = self.loss(batch, logits, targets)
        optimizer = self.session_optimizer()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for m in self.modifiers:
            m.after_backward(self)
        optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        for m in self.modifiers:
            m.after_update(self)
        return StepStats(loss=loss.detach())

    def end_session(self, session: Session) -> None:
        """The modifiers' ``end_session`` (LoRA folds its adapters), then the optimizer is dropped."""
        for m in self.modifiers:
            m.end_session(self, session)
        # each session builds its own optimizer and schedule: none carries over (nor into a checkpoint
        # taken between sessions, whose restored state must not reach the next session's fresh optimizer)
        self.optimizer, self.scheduler = None, None

    def predict(self, x: Tensor) -> Tensor:
        """Logits of ``self.model``, or the scores a modifier's ``predict`` gives instead (called in eval
        mode under no_grad, on a throwaway copy)."""
        for m in self.modifiers:
            scores = m.predict(self, x)
            if scores is not None:
                return scores
        return self.model(x)

    def shared_in_eval_copy(self) -> list[object]:
        """What the modifiers ask the harness's eval copy to share rather than copy (a subclass adds its own)."""
        return [shared for m in self.modifiers for shared in m.shared_in_eval_copy()]

    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule and modifier state: with the model and memory, enough to resume mid-session."""
        return {
            "optimizer": optimizer.state_dict() if (optimizer := getattr(self, "optimizer", None)) else None,
            "scheduler": self.scheduler.state_dict() if getattr(self, "scheduler", None) else None,
            "modifiers": {m.name: m.state_dict() for m in self.modifiers},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Modifier state now; optimizer state now if built, else when the next session builds it."""
        self._pending_optimizer_state = (state.get("optimizer"), state.get("scheduler"))
        if getattr(self, "optimizer", None) is not None:
            self._restore_optimizer()
        for m in self.modifiers:
            m.load_state_dict(state["modifiers"].get(m.name, {}))


def count_trainable(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
