"""SGM = dynamic soft targets + data-driven init + old output class freezing + LoRA + OneCycle.

Hook order. Every component is written so that the order of the modifiers in a method string does
not matter (``vanilla+lora+init`` and ``vanilla+init+lora`` train identical weights; a test pins
it):
- the harness grows the head before ``begin_session``; ``init`` writes only the new rows, ``oocf``
  snapshots only the old rows, and ``lora`` injects adapters whose delta is zero (B = 0), so
  embeddings, and hence init rows, are the same before and after injection; only ``lora`` draws
  random numbers in ``begin_session``;
- the optimizer is built after every modifier's ``begin_session``, from ``requires_grad`` (which
  ``lora`` has set by then), so the adapters get the body's layer-wise groups whatever the order;
- ``oocf`` acts through gradient hooks and an optimizer step post-hook, independent of the other
  modifiers' ``after_backward``; only ``soft`` replaces targets; only ``sgm`` returns a scheduler.
Inside ``sgm`` the parts run in the fixed order lora, init, oocf, soft. Naming a part twice
(``vanilla+sgm+lora``) is an error, since it would inject or freeze twice.

OneCycle: ``max_lr: scalar`` (default) is the published code's ``OneCycleLR(max_lr=lr)``
(yousuf907/SGM, model_sgm.py): one peak, the method's lr times ``max_lr_scale``, for every group, so
under SGM the layer-wise lr decay is erased (every group follows the same cycle). ``max_lr: per_group``
gives each group its own lr as peak, so the decay survives (the corrected reading; docs/fidelity.md).
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel

from ...harness.data.stream import Session
from ...harness.errors import BenchError
from ..base import Modifier, StandardMethod, TrainBatch
from ..configs import OneCycleConfig, SGMConfig
from .init import DataDrivenInit
from .lora import LoRA
from .oocf import OldClassFreezing
from .soft import SoftTargets


class OneCycle(Modifier):
    """OneCycle schedule, one scalar peak or one per parameter group (not registered on its own)."""

    name = "onecycle"
    summary = "OneCycle learning-rate schedule (peak: the method's lr for every group, or each group's own)."
    Config = OneCycleConfig
    config: OneCycleConfig

    def scheduler(self, method: StandardMethod, optimizer: torch.optim.Optimizer, total_steps: int | None):
        if total_steps is None:
            raise BenchError(
                f"Method {method.label!r} shapes its learning rate over the session's update count (onecycle), "
                f"which this run does not know: protocol {method.ctx.protocol.name} gives a FLOP budget and the "
                f"harness predicted no count. Use a protocol with training.updates, or the method without onecycle.")
        # under a FLOP budget the count is the harness's prediction: the schedule holds its last lr if the
        # session makes more updates than predicted
        held = method.ctx.protocol.training.budget is not None
        return one_cycle(optimizer, total_steps, self.config, base_lr=method.config.lr, hold_at_end=held)


class HeldOneCycleLR(torch.optim.lr_scheduler.OneCycleLR):
    """OneCycle that stays at its final lr after its last step instead of raising."""

    def step(self, epoch: int | None = None) -> None:
        if self.last_epoch >= self.total_steps:
            return
        super().step(epoch)


def one_cycle(optimizer: torch.optim.Optimizer, total_steps: int, cfg: OneCycleConfig | None = None,
              base_lr: float | None = None, hold_at_end: bool = False):
    """``base_lr``: the scalar peak (the method's lr); needed for ``max_lr: scalar``."""
    cfg = cfg or OneCycleConfig()
    if cfg.max_lr == "scalar":
        if base_lr is None:
            raise ValueError("one_cycle with max_lr 'scalar' needs base_lr (the method's lr)")
        max_lr: float | list[float] = base_lr * cfg.max_lr_scale
    else:
        max_lr = [g["lr"] * cfg.max_lr_scale for g in optimizer.param_groups]
    schedule = HeldOneCycleLR if hold_at_end else torch.optim.lr_scheduler.OneCycleLR
    return schedule(
        optimizer, max_lr=max_lr, total_steps=max(total_steps, 2), pct_start=cfg.pct_start,
        div_factor=cfg.div_factor, final_div_factor=cfg.final_div_factor,
        anneal_strategy=cfg.anneal_strategy, cycle_momentum=cfg.cycle_momentum)


PARTS = (LoRA, DataDrivenInit, OldClassFreezing, SoftTargets)


class SGM(Modifier):
    name = "sgm"
    summary = "SGM: soft targets + data-driven init + old-class freezing + LoRA + OneCycle."
    Config = SGMConfig
    config: SGMConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        c = self.config
        self.lora, self.init = LoRA(c.lora), DataDrivenInit(c.init)
        self.oocf, self.soft = OldClassFreezing(c.oocf), SoftTargets(c.soft)
        self.onecycle = OneCycle(c.onecycle)
        self.parts: list[Modifier] = [p for p in (self.lora, self.init, self.oocf, self.soft) if p.name in c.use]

    def check_combination(self, modifiers: list[Modifier]) -> None:
        doubled = [m.name for m in modifiers if m is not self and isinstance(m, (*PARTS, OneCycle, SGM))
                   and (m.name in self.config.use or isinstance(m, SGM))]
        if doubled:
            raise BenchError(f"Modifier sgm already includes {', '.join(doubled)}; drop it from the method string "
                             f"or configure it through sgm (e.g. --set sgm.lora.rank=16).")

    def setup(self, method: StandardMethod) -> None:
        for p in self.parts:
            p.setup(method)

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        for p in self.parts:
            p.begin_session(method, session)

    def before_update(self, method: StandardMethod, batch: TrainBatch) -> None:
        for p in self.parts:
            p.before_update(method, batch)

    def targets(self, method: StandardMethod, batch: TrainBatch, logits: torch.Tensor):
        return self.soft.targets(method, batch, logits) if self.soft in self.parts else None

    def after_backward(self, method: StandardMethod) -> None:
        for p in self.parts:
            p.after_backward(method)

    def param_groups(self, method: StandardMethod, groups: list[dict]) -> list[dict]:
        for p in self.parts:
            groups = p.param_groups(method, groups)
        return groups

    def scheduler(self, method: StandardMethod, optimizer: torch.optim.Optimizer, total_steps: int | None):
        for p in self.parts:
            p.scheduler(method, optimizer, total_steps)  # oocf registers its step hook here
        return self.onecycle.scheduler(method, optimizer, total_steps) if "onecycle" in self.config.use else None

    def end_session(self, method: StandardMethod, session: Session) -> None:
        for p in self.parts:
            p.end_session(method, session)

    def state_dict(self) -> dict[str, Any]:
        return {p.name: p.state_dict() for p in (self.lora, self.init, self.oocf, self.soft)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for p in (self.lora, self.init, self.oocf, self.soft):
            p.load_state_dict((state or {}).get(p.name, {}))
