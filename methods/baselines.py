"""The paper's reference learners on the standard step: lower bound, output layer only, rehearsal."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..harness.errors import BenchError
from .base import Context, StandardMethod
from .configs import OutputOnlyConfig, SGMConfig, VanillaConfig

if TYPE_CHECKING:
    from ..harness.model.backbone import SplitModel


class Vanilla(StandardMethod):
    """Rehearsal with the standard step. ``pointwise: lora`` builds the body as the published code's
    vanilla does (yousuf907/SGM ``model_vanilla.py`` takes its blocks from ``convnext_v2_lora.py``, whose
    pointwise layers are ``loralib.Linear(r=48)``): those layers' weights are frozen, a rank-r adapter
    at scale alpha/r trains beside each for the whole run and is never folded (loralib 0.1.1, the
    pinned version, merges nothing on a parent's ``.eval()``), everything else in the body trains."""

    name = "vanilla"
    summary = "Rehearsal: half of each batch from the session, half from memory; body and head train."
    Config = VanillaConfig
    config: VanillaConfig

    def setup(self, model: SplitModel, ctx: Context) -> None:
        super().setup(model, ctx)
        if self.config.pointwise == "lora" and not self.modifier_adapts_pointwise():
            self._lora_blocks(model, ctx)

    def modifier_adapts_pointwise(self) -> bool:
        """A LoRA modifier (``lora``, or ``sgm`` using it) puts its own adapters on the pointwise layers,
        fresh each session and folded at its end, as the published SGM does on the same LoRA blocks."""
        return any(m.name == "lora" or (isinstance(m.config, SGMConfig) and "lora" in m.config.use)
                   for m in self.modifiers)

    def _lora_blocks(self, model: SplitModel, ctx: Context) -> None:
        from .sgm.lora import inject_adapters, lora_modules

        targets = list(ctx.protocol.backbone.lora_targets)
        if not targets:
            raise BenchError(f"vanilla: pointwise=lora needs the protocol's backbone.lora_targets, which "
                             f"{ctx.protocol.name} leaves empty; use --set pointwise=trained.")
        train_body = self.config.trainable == "body+head"
        inject_adapters(model.body, targets, self.config.pointwise_rank, self.config.pointwise_alpha,
                        "kaiming_uniform", ctx.generator)
        frozen = {id(layer.get_base_layer().weight) for _, layer in lora_modules(model.body)}
        for p in model.body.parameters():
            p.requires_grad_(train_body and id(p) not in frozen)


class Finetune(StandardMethod):
    name = "finetune"
    summary = "Naive fine-tuning on the current session only (no rehearsal): the lower bound."
    rehearsal = False


class OutputOnly(StandardMethod):
    name = "output_only"
    summary = "Rehearsal that trains only the output layer; every hidden layer stays frozen."
    Config = OutputOnlyConfig
    config: OutputOnlyConfig
