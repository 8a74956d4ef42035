"""LoRA on the body's 1x1 convolutions, folded into the weights at every session end (SGM, Sec. 4).

At session start fresh adapters are injected with peft into the body modules named by the
protocol's ``backbone.lora_targets`` (ConvNeXt ``mlp.fc1``/``mlp.fc2``, EfficientNet
``conv_pw``/``conv_pwl``): Theta = W + (alpha/r) B A, B = 0, so the network is unchanged at the first
update; A is drawn from the run's seeded generator. Only the adapters and the head train. At session
end the adapters are folded explicitly, W <- W + (alpha/r) B A, and each wrapped module is replaced by
its (updated) base module, so the body is plain timm modules again with its original state-dict keys.
No train/eval toggle merges anything (loralib 0.1.2 merges on every .eval(); docs/fidelity.md).

Defaults follow the published code (yousuf907/SGM, convnext_v2_lora.py / model_sgm.py), which uses
loralib's ``lora.Linear(r=48)`` with its default ``lora_alpha=1`` and merges ``W + (B @ A) * (1/48)``:
``alpha: 1`` (scaling 1/r) and ``init: kaiming_uniform`` (loralib's A init, U(+-1/sqrt(fan_in))).
The paper's text (Sec. 4, eq. 6) reads Theta = W + BA with A Gaussian: ``alpha: <r>`` and
``init: gaussian`` (A ~ N(0, 1/r^2)). Adam's step does not depend on the gradient's scale, so the
adapters' effective change per update is proportional to alpha/r: scaling 1 moves them 48x faster.

BatchNorm in the body: with ``norm: frozen`` (default) BatchNorm layers stay in eval mode while
training (running statistics used, never updated), so the body's function changes only through the
adapters, as with the LayerNorm of the paper's ConvNeXt. ``norm: batch_stats`` lets them normalise
with batch statistics in training and update their running statistics (their affine parameters are
frozen either way).

Resuming inside a session: ``state_dict`` carries the live adapters; ``load_state_dict`` re-injects
them when the body has none (begin_session, or a resume after it, injects them first).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, cast

import torch
from pydantic import BaseModel
from torch import Tensor, nn

from ...harness.data.stream import Session
from ...harness.errors import BenchError
from ...harness.model.backbone import body_has_module
from ..base import Modifier, StandardMethod
from ..configs import LoRAConfig

if TYPE_CHECKING:
    from peft.tuners.lora import LoraLayer
    from torch.utils.hooks import RemovableHandle

ADAPTER = "default"


def lora_modules(module: nn.Module) -> list[tuple[str, LoraLayer]]:
    """The LoRA-wrapped modules of ``module``, by name.

    peft is imported where adapters are injected, not with this module: importing it (and the transformers
    it imports) costs a process 2-3 s that a run of a method without LoRA need not spend. Until it is
    imported no module can be a LoRA layer."""
    lora = sys.modules.get("peft.tuners.lora")
    if lora is None:
        return []
    return [(n, m) for n, m in module.named_modules() if isinstance(m, lora.LoraLayer)]


def fold_lora(module: nn.Module) -> int:
    """Merge every adapter into its base weight and put the base module back; returns how many."""
    folded = lora_modules(module)
    for name, layer in folded:
        layer.merge(safe_merge=True, adapter_names=[ADAPTER])
        parent_name, _, child = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, child, layer.get_base_layer())
    if "peft_config" in vars(module):  # the bookkeeping inject_adapter_in_model leaves on the model
        del module.peft_config
    return len(folded)


def lora_param_count(module: nn.Module) -> int:
    return sum(p.numel() for n, p in module.named_parameters() if "lora_" in n)


def inject_adapters(body: nn.Module, targets: list[str], rank: int, alpha: float, init: str,
                    generator: torch.Generator) -> None:
    """peft adapters on the ``targets`` modules of ``body``, delta zero (B = 0), A drawn from ``generator``:
    ``kaiming_uniform`` as loralib (the published code), or ``gaussian`` N(0, 1/r^2) (the text)."""
    from peft import LoraConfig, inject_adapter_in_model

    # peft declares lora_alpha an int, yet only divides by it (scaling = alpha / r): a float alpha is exact
    cfg = LoraConfig(r=rank, lora_alpha=alpha,  # type: ignore[arg-type]
                     target_modules=targets, lora_dropout=0.0, bias="none", init_lora_weights="gaussian")
    inject_adapter_in_model(cfg, body, adapter_name=ADAPTER)
    with torch.no_grad():
        for _, layer in lora_modules(body):
            a = cast(Tensor, layer.lora_A[ADAPTER].weight)  # nn.Module's attribute lookup says Tensor | Module
            if init == "gaussian":
                a.copy_(torch.randn(a.shape, generator=generator) / rank)
            else:  # loralib: kaiming_uniform_(A, a=sqrt(5)) = U(-b, b), b = 1/sqrt(fan_in)
                fan_in = a[0].numel()
                a.copy_((torch.rand(a.shape, generator=generator) * 2 - 1) / fan_in**0.5)
            cast(Tensor, layer.lora_B[ADAPTER].weight).zero_()


class LoRA(Modifier):
    name = "lora"
    summary = "LoRA (peft) on the body's 1x1 convs; only adapters and head train; folded at session end."
    Config = LoRAConfig
    config: LoRAConfig

    def __init__(self, config: BaseModel | None = None) -> None:
        super().__init__(config)
        self._requires_grad: dict[str, bool] = {}
        self._handles: list[RemovableHandle] = []

    def setup(self, method: StandardMethod) -> None:
        self._method = method
        if getattr(method.config, "trainable", "body+head") != "body+head":
            raise BenchError(f"Modifier lora adapts the body, but method {method.name!r} trains only the head "
                             f"(trainable={method.config.trainable}); use a base that trains the body.")
        targets = self.target_names(method)
        if not targets:
            raise BenchError(f"Modifier lora: protocol {method.ctx.protocol.name} lists no backbone.lora_targets "
                             f"(and lora.targets is unset).")
        missing = [t for t in targets if not body_has_module(method.model.body, t)]
        if missing:
            raise BenchError(f"Modifier lora: the body has no module named {', '.join(missing)} "
                             f"(targets {targets}).")

    def target_names(self, method: StandardMethod) -> list[str]:
        return list(self.config.targets if self.config.targets is not None
                    else method.ctx.protocol.backbone.lora_targets)

    @property
    def scaling_alpha(self) -> float:
        return float(self.config.alpha if self.config.alpha is not None else self.config.rank)

    def inject(self, method: StandardMethod) -> None:
        body = method.model.body
        if lora_modules(body):
            raise BenchError("Modifier lora: the body still holds adapters from an unfinished session.")
        self._requires_grad = {n: p.requires_grad for n, p in body.named_parameters()}
        inject_adapters(body, self.target_names(method), self.config.rank, self.scaling_alpha, self.config.init,
                        method.ctx.generator)
        for n, p in body.named_parameters():
            p.requires_grad_("lora_" in n)
        if self.config.norm == "frozen":
            for m in body.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    self._handles.append(m.register_forward_pre_hook(_stay_in_eval))

    def begin_session(self, method: StandardMethod, session: Session) -> None:
        self.inject(method)

    def param_groups(self, method: StandardMethod, groups: list[dict]) -> list[dict]:
        if self.config.lr_scale != 1.0:
            for g in groups:
                if g.get("name", "").startswith("body"):
                    g["lr"] = g["lr"] * self.config.lr_scale
        return groups

    def end_session(self, method: StandardMethod, session: Session) -> None:
        body = method.model.body
        fold_lora(body)
        for h in self._handles:
            h.remove()
        self._handles = []
        for n, p in body.named_parameters():
            p.requires_grad_(self._requires_grad.get(n, p.requires_grad))

    def state_dict(self) -> dict[str, Any]:
        """The live adapters while a session runs (empty between sessions: they are folded)."""
        method = getattr(self, "_method", None)
        if method is None or not lora_modules(method.model.body):
            return {}
        return {"adapters": {k: v.detach().cpu().clone() for k, v in method.model.body.state_dict().items()
                             if "lora_" in k}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        adapters = (state or {}).get("adapters")
        if not adapters:
            return
        method = getattr(self, "_method", None)
        if method is None:
            raise BenchError("Modifier lora: load_state_dict with live adapters needs setup() first.")
        body = method.model.body
        if not lora_modules(body):
            self.inject(method)
        missing = set(adapters) - set(body.state_dict())
        if missing:
            raise BenchError(f"Modifier lora: saved adapters {sorted(missing)[:3]} do not fit this body.")
        body.load_state_dict(adapters, strict=False)


def _stay_in_eval(module: nn.Module, _inputs: tuple[object, ...]) -> None:
    module.training = False
