"""Settings (``Config``) of every built-in method and modifier, apart from the code that trains.

This module imports pydantic only, never torch: ``bench run -m vanila`` or ``--set lrr=1`` is answered
in well under a second because the registry validates a run's settings from here (``CONFIGS``, keyed
by entry-point target) before any heavy import. Each method class points its ``Config`` here; a
test checks the two never drift. Every number has a sane bound, so an overflow (``lr=1e308``,
``lora.rank=100000``) is refused before compute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..harness.spec.protocol import MAX_BATCH, MAX_LR, Decay, LearningRate, Protocol, Seed

if TYPE_CHECKING:
    from ..harness.spec.specfile import JSONValue

MAX_WEIGHT = 1_000.0       # loss weights, temperatures, scale factors
MAX_SAMPLES = 10**9
MAX_LORA_RANK = 1_024      # wider than any body layer a protocol adapts


@dataclass(frozen=True)
class Dim:
    """One dimension of a search space ``bench tune`` samples: a float range (``log``: sampled on a log
    scale) or a list of ``choices``."""

    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[str | int | float | bool | None, ...] | None = None  # what Optuna's categorical stores


SearchSpace = dict[str, Dim]  # setting (as --set names it) -> its range
SGMPart = Literal["soft", "init", "oocf", "lora", "onecycle"]  # sgm's components, in the order they act


class Settings(BaseModel):
    """Base of every settings model: unknown keys are errors, and no float is NaN or infinite (an
    overflowing ``--set lr=1e999`` is refused, never trained with). ``search_space``: what ``bench tune``
    may change, the same ranges for every protocol (a method string's space is its base's plus each
    modifier's under the modifier's name)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    search_space: ClassVar[SearchSpace] = {}


class MethodConfig(Settings):
    """Hyper-parameters shared by methods using the standard step; subclasses add their own."""

    lr: LearningRate = 1e-3
    weight_decay: Decay = 0.05
    layer_decay: float = Field(0.9, gt=0, le=1, description="lr multiplier per layer below the head")
    layer_decay_unit: Literal["tensor", "module"] = Field(
        "tensor", description="what one step of layer_decay is: a parameter tensor, walking named_parameters "
                              "from the head down (the published code), or a body module (one per backbone.body entry)")
    layer_decay_order: Literal["body", "registration"] = Field(
        "body", description="order of the per-tensor walk: the body's forward order, or the published model's "
                            "registration order (backbone.registered_first entries deepest)")
    trainable: str = Field("body+head", pattern="^(head|body\\+head)$")

    # around the paper's AdamW settings (lr 1e-3 at batch 256, weight decay 0.05), a decade or more each way
    search_space: ClassVar[SearchSpace] = {"lr": Dim(1e-5, 1e-2, log=True), "weight_decay": Dim(1e-3, 0.3, log=True)}


class VanillaConfig(MethodConfig):
    pointwise: Literal["trained", "lora"] = Field(
        "trained", description="the body's pointwise layers (backbone.lora_targets): trained (full fine-tuning, "
                               "the paper's text) or loralib LoRA layers as the published code builds them "
                               "(weight frozen, a rank-r adapter at scale alpha/r trained beside it, never folded)")
    pointwise_rank: int = Field(48, gt=0, le=MAX_LORA_RANK, description="r of the adapters when pointwise: lora")
    pointwise_alpha: float = Field(1.0, gt=0, le=1e6, description="adapter scale alpha/r when pointwise: lora "
                                                                   "(loralib's default alpha 1: 1/48 at r 48)")


class NoConfig(Settings):
    """For a modifier with no settings: any ``--set`` for it is an error."""


class OutputOnlyConfig(MethodConfig):
    trainable: str = Field("head", pattern="^head$", description="only the output layer trains")


class DERppConfig(MethodConfig):
    alpha: float = Field(0.1, ge=0, le=MAX_WEIGHT,
                         description="weight of the logit-matching (MSE) term on memory samples")
    beta: float = Field(0.9, ge=0, le=MAX_WEIGHT, description="weight of the cross-entropy term on memory samples")
    pad_logits: Literal["zero", "none"] = Field(
        "zero", description="stored logits shorter than the grown head: pad with zeros, or match stored columns only")
    logit_batch_size: int = Field(256, gt=0, le=MAX_BATCH,
                                  description="samples per forward when logits are computed on entry")
    pretrain_logits: Literal["on_replay", "at_setup"] = Field(
        "on_replay", description="deployed-model logits of stored pre-training samples: when first replayed, "
                                 "or all at setup (same values)")

    # DER++'s own grid (Buzzega et al.) spans alpha 0.1-1, beta 0.5-1
    search_space: ClassVar[SearchSpace] = {**MethodConfig.search_space, "alpha": Dim(0.01, 1.0, log=True),
                                           "beta": Dim(0.1, 1.0)}


class LwFConfig(MethodConfig):
    distill_weight: float = Field(1.0, ge=0, le=MAX_WEIGHT, description="lambda: weight of the distillation term")
    temperature: float = Field(2.0, gt=0, le=MAX_WEIGHT, description="T: softmax temperature of the distillation term")
    t2_scale: bool = Field(False, description="multiply the distillation by T^2 (Hinton); off as in LwF and the paper")

    search_space: ClassVar[SearchSpace] = {**MethodConfig.search_space, "temperature": Dim(1.0, 4.0),
                                           "distill_weight": Dim(0.1, 10.0, log=True)}


class ERACEConfig(MethodConfig):
    mask: Literal["batch", "session"] = Field(
        "batch", description="classes an incoming sample competes with: those present among the batch's incoming "
                             "samples (Caccia et al.), or every class of the session")
    replay_classes: Literal["seen", "all"] = Field(
        "seen", description="head units a replayed sample competes with: the classes seen so far (Caccia et al.'s "
                            "eq. 5), or every unit, those of classes not seen yet included (Mammoth's er_ace); the "
                            "two differ only under backbone.head_units: full")


class EWCConfig(MethodConfig):
    weight: float = Field(100.0, ge=0, le=1e6, description="lambda in (lambda/2) sum F (theta - theta*)^2, F the "
                                                       "empirical Fisher of the true labels, sample by sample "
                                                       "(100 = Avalanche's and Mammoth's 50: no 1/2 there)")
    gamma: float = Field(1.0, ge=0, le=1, description="online EWC's decay of the accumulated Fisher at each new "
                                                      "estimate (1: the Fishers of every session add up)")
    fisher_samples: int = Field(200, gt=0, le=MAX_SAMPLES, description="samples of a session (S1: of the "
                                                                      "pre-training data) whose squared "
                                                                      "gradients estimate its Fisher")

    search_space: ClassVar[SearchSpace] = {**MethodConfig.search_space, "weight": Dim(1.0, 1e4, log=True)}


class NMCConfig(Settings):
    per_class: int | None = Field(
        100, gt=0, le=MAX_SAMPLES, description="samples per class the class means are computed from (the first in "
                                               "id order of those the method holds); null: all of them")
    batch_size: int = Field(256, gt=0, le=MAX_BATCH, description="samples per forward when the means are computed")


class REMINDConfig(MethodConfig):
    lr_end: float = Field(1e-5, gt=0, le=MAX_LR,
                          description="per-class lr reached once a class has been seen lr_decay_samples times")
    lr_schedule: Literal["per_class", "none"] = Field("per_class", description="REMIND's per-class lr decay, or none")
    lr_decay_samples: int | None = Field(
        1300, gt=0, le=MAX_SAMPLES,
        description="samples of a class after which its lr is lr_end (REMIND: 1300); unset: its count in the stream")
    lr_step: int = Field(100, gt=0, le=MAX_SAMPLES,
                         description="the per-class lr changes every lr_step samples of the class (REMIND: 100)")
    pq_subquantizers: int = Field(8, gt=0, le=4096,
                                  description="M: codebooks per feature vector (REMIND: 32, "
                                              "the online_cub_* default); must divide the trunk's channels")
    pq_bits: int = Field(8, ge=1, le=16, description="bits per code (2**bits centroids per codebook)")
    pq_fit_samples: int = Field(10000, gt=0, le=MAX_SAMPLES,
                                description="pre-training samples the codebook is fitted on (each gives H*W vectors)")
    pq_seed: Seed = Field(0, description="which pre-training samples the codebook is fitted on "
                                         "(faiss k-means is seeded too)")
    reconstruct_new: bool = Field(True, description="train on the arriving sample's reconstruction (REMIND) "
                                                    "or its raw features")
    eval_reconstruct: bool = Field(True, description="predict from reconstructed test features (REMIND) or raw ones")
    augment: bool = Field(True, description="feature-map random resized crops and mixup of replayed samples")
    crop_scale: tuple[float, float] = Field((2 / 7, 1.0), description="area fraction of the feature map a crop keeps")
    crop_ratio: tuple[float, float] = Field((3 / 4, 4 / 3), description="aspect ratio range of the crops")
    mixup_alpha: float = Field(0.1, ge=0, le=MAX_WEIGHT, description="lambda ~ Beta(alpha, alpha); 0 disables mixup")
    chunk: int = Field(512, gt=0, le=MAX_BATCH, description="samples per pass when encoding or fitting")

    @model_validator(mode="after")
    def _lr_range(self) -> REMINDConfig:
        if self.lr_end > self.lr:
            raise ValueError(f"lr_end ({self.lr_end}) must not exceed lr ({self.lr})")
        if not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(f"crop_scale {self.crop_scale} must satisfy 0 < low <= high <= 1")
        if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio {self.crop_ratio} must satisfy 0 < low <= high")
        return self


class SoftTargetsConfig(Settings):
    reset: Literal["session", "never"] = Field(
        "session", description="session: u and its counts restart uniform at every session start (the "
                               "published code); never: one running mean over the whole run (the text)")
    new_samples: Literal["softmax", "running_mean"] = Field(
        "softmax", description="base vector of a sample of a class new in this session: the current softmax "
                               "(the published code) or u_k like every other sample (the text)")
    update_on: Literal["correct", "all"] = Field(
        "correct", description="which samples update u_k: correctly classified ones (the published code's "
                               "accumulate_soft_targets) or every sample of class k (the text, eq. 6)")
    grow: Literal["pad", "reset"] = Field(
        "pad", description="reset: never only: extend an updated u_k by zeros for new classes (pad) or reset "
                           "all to uniform when the head grows (reset)")


class InitConfig(Settings):
    centre: Literal["none", "session"] = Field(
        "none", description="subtract the session's mean embedding before L2-normalising (none = paper)")
    scale: Literal["unit", "logit"] = Field(
        "unit", description="unit: the paper's mean of unit vectors; logit: match the old rows' own-class logit")
    calibration_per_class: int = Field(20, gt=0, le=MAX_SAMPLES,
                                       description="memory samples per old class for scale: logit")
    batch_size: int = Field(256, gt=0, le=MAX_BATCH, description="samples per forward pass of the embedding sweep")
    when: Literal["auto", "session_start", "first_arrival"] = Field(
        "auto", description="session_start: from the session's samples; first_arrival: from the samples "
                            "that have arrived when a class first appears; auto: first_arrival on online "
                            "(per_sample) protocols, else session_start")

    search_space: ClassVar[SearchSpace] = {"scale": Dim(choices=("unit", "logit"))}


class OOCFConfig(Settings):
    old_rows: Literal["decay", "frozen"] = Field(
        "decay", description="decay: gradient masked, AdamW weight decay still applies (the published code); "
                             "frozen: the rows never move (the text)")


class LoRAConfig(Settings):
    rank: int = Field(48, gt=0, le=MAX_LORA_RANK, description="r; the paper uses 48")
    alpha: float | None = Field(1.0, gt=0, le=1e6, description="B A is scaled by alpha/r; 1 as loralib's default in "
                                                                  "the published code (1/48 at r 48); "
                                                                  "null: alpha = r (scaling 1)")
    init: Literal["kaiming_uniform", "gaussian"] = Field(
        "kaiming_uniform", description="A's init: loralib's kaiming_uniform(a=sqrt 5) as the published code, "
                                       "or N(0, 1/r^2) as the paper's text (Gaussian)")
    targets: list[str] | None = Field(None, description="body module names to adapt; unset: backbone.lora_targets")
    norm: Literal["frozen", "batch_stats"] = Field(
        "frozen", description="body BatchNorm while training: frozen (eval mode) or batch_stats (train mode)")
    lr_scale: float = Field(1.0, gt=0, le=MAX_WEIGHT,
                            description="multiplier on the learning rate of the adapters' groups")

    search_space: ClassVar[SearchSpace] = {"rank": Dim(choices=(8, 16, 32, 48, 64)),
                                           "lr_scale": Dim(0.3, 30.0, log=True)}


class OneCycleConfig(Settings):
    pct_start: float = Field(0.3, gt=0, lt=1, description="fraction of the session spent raising the lr")
    div_factor: float = Field(25.0, gt=0, le=1e6, description="initial lr = max_lr / div_factor")
    final_div_factor: float = Field(1e4, gt=0, le=1e9, description="final lr = initial lr / final_div_factor")
    anneal_strategy: Literal["cos", "linear"] = "cos"
    cycle_momentum: bool = Field(True, description="cycle AdamW's beta1 between 0.85 and 0.95 (torch default)")
    max_lr: Literal["scalar", "per_group"] = Field(
        "scalar", description="scalar: one peak (the method's lr) for every group, as the published code; "
                              "per_group: each group's own (layer-decayed) lr is its peak")
    max_lr_scale: float = Field(1.0, gt=0, le=MAX_WEIGHT,
                                description="peak = (the method's or the group's) lr times this")

    search_space: ClassVar[SearchSpace] = {"pct_start": Dim(0.05, 0.5), "max_lr": Dim(choices=("scalar", "per_group"))}


def _nest(values: dict[str, object]) -> dict[str, object]:
    """``{"lora": {"rank": 48}, "lora.rank": 16}`` -> ``{"lora": {"rank": 16}}``: dotted keys nest, and
    later keys win (``--set sgm.lora.rank=16`` over a defaults.yaml entry ``lora: {rank: 48}``)."""
    out: dict[str, object] = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        if dot:
            key, value = head, {rest: value}
        if isinstance(value, dict):
            value = _nest(value)
            prior = out.get(key)
            if isinstance(prior, BaseModel):
                prior = prior.model_dump()
            if isinstance(prior, dict):
                value = _deep_merge(prior, value)
        out[key] = value
    return out


# a: untyped values, as mypy cannot carry the per-key isinstance(out.get(k), dict) below over to out[k]
def _deep_merge(a: dict[str, Any], b: dict[str, object]) -> dict[str, object]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class SGMConfig(Settings):
    """The parts' settings, nested: ``--set sgm.lora.rank=16``, ``--set sgm.onecycle.pct_start=0.1``."""

    soft: SoftTargetsConfig = Field(default_factory=SoftTargetsConfig)
    init: InitConfig = Field(default_factory=InitConfig)
    oocf: OOCFConfig = Field(default_factory=OOCFConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)
    onecycle: OneCycleConfig = Field(default_factory=OneCycleConfig)
    use: list[SGMPart] = Field(
        default_factory=lambda: list(get_args(SGMPart)),
        description="the parts that act (all five = SGM; fewer = an ablation inside sgm)")

    # the parts' own spaces; `use` stays (which parts act is the method, not a setting to tune)
    search_space: ClassVar[SearchSpace] = {
        **{f"init.{k}": d for k, d in InitConfig.search_space.items()},
        **{f"lora.{k}": d for k, d in LoRAConfig.search_space.items()},
        **{f"onecycle.{k}": d for k, d in OneCycleConfig.search_space.items()},
    }

    @model_validator(mode="before")
    @classmethod
    def _dotted(cls, data: object) -> object:
        return _nest(data) if isinstance(data, dict) else data


_PKG = "bench_stability_gap.methods"

# entry-point target (as in pyproject.toml) -> its settings; a plugin not listed here is validated by
# importing its class (slower, same rules)
CONFIGS: dict[str, type[BaseModel]] = {
    f"{_PKG}.baselines:Finetune": MethodConfig,
    f"{_PKG}.baselines:OutputOnly": OutputOnlyConfig,
    f"{_PKG}.baselines:Vanilla": VanillaConfig,
    f"{_PKG}.derpp:DERpp": DERppConfig,
    f"{_PKG}.gdumb:GDumb": MethodConfig,
    f"{_PKG}.lwf:LwF": LwFConfig,
    f"{_PKG}.remind:REMIND": REMINDConfig,
    f"{_PKG}.er_ace:ERACE": ERACEConfig,
    f"{_PKG}.ewc:EWC": EWCConfig,
    f"{_PKG}.nmc:NearestMeanHead": NMCConfig,
    f"{_PKG}.sgm.soft:SoftTargets": SoftTargetsConfig,
    f"{_PKG}.sgm.init:DataDrivenInit": InitConfig,
    f"{_PKG}.sgm.oocf:OldClassFreezing": OOCFConfig,
    f"{_PKG}.sgm.lora:LoRA": LoRAConfig,
    f"{_PKG}.sgm.combined:SGM": SGMConfig,
}


def joint_config(protocol: Protocol) -> MethodConfig:
    """The joint model's optimizer settings: the protocol's ``joint`` section, no layer-wise decay (it
    is an upper bound, trained like the deployed model), the whole body and head plastic."""
    return MethodConfig(lr=protocol.joint.lr, weight_decay=protocol.joint.weight_decay, layer_decay=1.0,
                        trainable="body+head")


def joint_settings(protocol: Protocol) -> dict[str, JSONValue]:
    """What a stored joint run's ``config`` must equal to serve as this protocol's A_joint."""
    return joint_config(protocol).model_dump(mode="json")
