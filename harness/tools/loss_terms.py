"""Does each term of a method's loss reach a trainable parameter, once the modifiers are applied?

A modifier changes what trains: LoRA wraps the body's target modules (``fc1.weight`` becomes
``fc1.base_layer.weight``) and freezes every body parameter but its adapters; old-class freezing zeroes
the gradient of the head's old rows. A penalty anchored to parameters by name or aimed at the old rows
(EWC's) then adds nothing to any gradient: the run trains, the numbers look plausible, and the method
is not what it claims. This check trains the method on the check's small protocol and, at every update,
back-propagates each term of ``loss_terms`` alone (modifiers' gradient hooks and ``after_backward``
included, as in the real step) and looks for a non-zero gradient on a parameter the optimizer updates.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from ...methods.base import StandardMethod, TrainBatch
from ...methods.registry import build_method
from ..errors import BenchError
from ..model.flops import uncounted
from ..run.continual import run_cl
from ..run.options import RunOptions
from ..run.workbench import Workbench


def declares_terms(method: StandardMethod) -> bool:
    """The method names its terms (``loss_terms``), or keeps the standard loss; a method that overrides
    ``loss`` alone has one term, its whole loss."""
    cls = type(method)
    return cls.loss_terms is not StandardMethod.loss_terms or cls.loss is StandardMethod.loss


def _reaches(method: StandardMethod, term: Tensor) -> bool:
    """Whether ``term`` alone leaves a non-zero gradient on a parameter the optimizer updates."""
    params = [p for g in method.session_optimizer().param_groups for p in g["params"]]
    if not term.requires_grad:
        return False
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    with uncounted():  # a probe beside the real step, not training
        term.backward(retain_graph=True)
    for m in method.modifiers:
        m.after_backward(method)
    reached = any(p.grad is not None and bool(p.grad.ne(0).any()) for p in params)
    for p, g in zip(params, saved):
        p.grad = g
    return reached


def live_terms(bench: Workbench, text: str, overrides: dict[str, object], seed: int,
               options: RunOptions) -> dict[str, bool] | None:
    """Per loss term of ``text``: whether it reached a trainable parameter at some update of the run on
    ``bench``. None: the method has its own step (no standard loss to split)."""
    _, method = build_method(text, bench.protocol, overrides)
    if not isinstance(method, StandardMethod):
        return None
    seen: dict[str, bool] = {}
    named = declares_terms(method)

    def loss(batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        terms = (type(method).loss_terms(method, batch, logits, targets) if named
                 else {"loss": type(method).loss(method, batch, logits, targets)})
        for name, term in terms.items():
            seen[name] = seen.get(name, False) or _reaches(method, term)
        return type(method).loss(method, batch, logits, targets) if named else terms["loss"]

    method.loss = loss  # type: ignore[method-assign]  # this instance only: the probe wraps the real step
    run_cl(bench, method, seed, dataclasses.replace(options, on_eval=None))
    return seen


def check_loss_terms(bench: Workbench, text: str, overrides: dict[str, object], seed: int,
                     options: RunOptions) -> str:
    """Raise BenchError naming each term that no trainable parameter feels, and the modifier that makes
    it so (found by running the base alone and with each of the string's modifiers in turn)."""
    with_mods = live_terms(bench, text, overrides, seed, options)
    if with_mods is None:
        raise BenchError(f"Method {text!r} has its own step: its loss cannot be split into terms.")
    inert = [t for t, live in with_mods.items() if not live]
    if not inert:
        return f"every term reaches a trainable parameter: {', '.join(with_mods)}"
    base, *mods = text.split("+")

    def live_with(kept: list[str]) -> dict[str, bool]:  # the base with some of the modifiers, and their --set
        own = {k: v for k, v in overrides.items() if k.split(".")[0] not in mods or k.split(".")[0] in kept}
        return live_terms(bench, "+".join([base, *kept]), own, seed, options) or {}

    alone = live_with([]) if mods else with_mods
    each = {m: live_with([m]) for m in mods} if any(alone.get(t, False) for t in inert) and len(mods) > 1 else {}
    problems = []
    for term in inert:
        if not alone.get(term, False):
            problems.append(f"loss term {term!r} gets no gradient on any trainable parameter even without "
                            f"modifiers (is it anchored to what trains?)")
            continue
        culprits = [m for m in mods if m in each and not each[m].get(term, False)] or mods
        problems.append(f"loss term {term!r} gets no gradient on any trainable parameter under modifier "
                        f"{' and '.join(culprits)} (it does without)")
    raise BenchError(
        f"Method {text!r}: {'; '.join(problems)}. A modifier changes what trains: LoRA renames the body's "
        f"wrapped weights (fc1.weight -> fc1.base_layer.weight) and freezes all but its adapters, old-class "
        f"freezing zeroes the gradient of the head's old rows; a term anchored to those adds nothing to the "
        f"update. Anchor it to what trains under the modifier, or declare the modifiers the method works with "
        f"(compatible_modifiers = (...)); docs/writing-a-method.md, 'Modifiers and your parameters'.")
