"""The paper's setting, axis by axis, and how far a protocol stands from it.

A ranking measured on a cheap protocol predicts the paper's findings only as far as the protocol shares the
paper's setting. This module is the one place that says what that setting is (the values below, each with the
section of Harun & Kanan, TMLR 2024, or the published code, that gives it) and puts a protocol's own value
beside each, for ``bench show protocol`` and the leaderboard's protocol sections.

Three setups of the paper, each compared with the protocols that stand for it:

* **offline CIL** (Table 1 and the tables built on it): ImageNet-1K, then Places365-LT in 5 sessions;
* **storage-limited offline CIL** (Table 6): ImageNet-1K, then Places365-Standard, 1,200 updates of 256;
* **online CIL** (Table 7): ImageNet-1K, then CUB-200 sample by sample, under REMIND.

Which one a protocol is compared with follows from its spec alone (``setup_for``): online updates, the
online setup; a Places365-Standard stream under a storage cap, the storage setup; every other, Table 1's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .protocol import Protocol


@dataclass(frozen=True)
class Value:
    """One axis of a paper setup: its value, and where the paper (or its code) gives it."""

    text: str
    where: str


@dataclass(frozen=True)
class Setup:
    name: str
    where: str
    updates: Value
    batch: Value
    eval: Value
    input_size: Value
    backbone: Value
    pretrain_data: Value
    sgm: Value


_INPUT = Value("224 x 224", "the published loaders' Resize(256) + CenterCrop(224) (utils_data.py); the text gives none")
_BACKBONE = Value("ConvNeXtV2-Femto (5.2M parameters), FCMAE self-supervised then supervised fine-tuning on "
                  "ImageNet-1K; first 4 blocks frozen, 8 plastic", '§5.1, "Network Architecture"')
_PRETRAIN = Value("ImageNet-1K: 1,000 classes, 1.2M images", '§5.1, "Network Architecture"; §6.2 (1.2M images)')

OFFLINE_CIL = Setup(
    name="Table 1: offline CIL, ImageNet-1K then Places365-LT in 5 sessions of 73 classes",
    where='§5.1, "Continual Learning Procedure"; Appendix C, "Main Experiments"',
    updates=Value("600", '§5.1, "Continual Learning Procedure"; Appendix C, "Main Experiments"'),
    batch=Value("128: 64 new + 64 old (50 % new)", '§5.1, "Continual Learning Procedure"'),
    eval=Value("every 50 updates: 12 points a session (the code's vf: every 100, 6)",
               '§5.1, "Continual Learning Procedure"; model_sgm.py vf = 100'),
    input_size=_INPUT, backbone=_BACKBONE, pretrain_data=_PRETRAIN,
    sgm=Value("lr 0.001, AdamW wd 0.05, layer decay 0.9; LoRA rank 48 on the blocks' pointwise (MLP) layers; OneCycle; "
              "soft targets, init, OOCF", 'Appendix C, "Main Experiments"; §4'))

_STORAGE_WHERE = 'Appendix C, "Storage Constrained Offline CL with DERpp and GDumb"'
STORAGE_CIL = Setup(
    name="Table 6: storage-limited offline CIL, ImageNet-1K then Places365-Standard in 5 sessions of 73 classes",
    where='§6.2; Appendix C, "Storage Constrained Offline CL with DERpp and GDumb"',
    updates=Value("1,200", 'Appendix C, "Storage Constrained Offline CL with DERpp and GDumb"'),
    batch=Value("256: 128 new + 128 old (50 % new)", "§6.2"),
    eval=Value("every 100 updates: 12 points a session", 'Appendix C, "Storage Constrained Offline CL with DERpp '
                                                         'and GDumb"'),
    input_size=_INPUT, backbone=_BACKBONE, pretrain_data=_PRETRAIN,
    sgm=Value("lr 0.0015, AdamW wd 0.05, layer decay 0.9; LoRA rank 48 on the blocks' pointwise (MLP) layers; "
              "OneCycle; soft targets, init, OOCF", _STORAGE_WHERE))

ONLINE_CIL = Setup(
    name="Table 7: online CIL, ImageNet-1K then CUB-200 sample by sample, with REMIND",
    where='§6.3; Appendix C, "Storage Constrained Online CL with REMIND"',
    updates=Value("one per arriving sample", 'Appendix C, "Storage Constrained Online CL with REMIND"'),
    batch=Value("51: 1 new + 50 old (2 % new)", 'Appendix C, "Storage Constrained Online CL with REMIND"'),
    eval=Value("not stated", "§6.3"),
    input_size=_INPUT, backbone=_BACKBONE, pretrain_data=_PRETRAIN,
    sgm=Value("REMIND's per-class lr 0.001 to 1e-05, AdamW wd 0.05; LoRA rank 48 as the main experiments", 'Appendix '
              'C, "Storage Constrained Online CL with REMIND"'))


@dataclass(frozen=True)
class Axis:
    """One line of the distance: the axis, the paper's value and where it is given, the protocol's value."""

    axis: str
    paper: str
    where: str
    protocol: str


def paper_protocol(p: Protocol) -> bool:
    """Whether ``p`` stands for one of the paper's own setups (the one ``setup_for`` names), so that what holds
    of the paper's runs (vanilla's two readings of its text and its code, say) holds of its runs: every
    protocol that is not embedded. An embedded protocol is an analogue on other data and another network,
    where the published code has nothing to read."""
    return not p.embedded


def setup_for(p: Protocol) -> Setup:
    """The paper setup a protocol stands for, read off its spec (see the module's docstring)."""
    if p.training.online:
        return ONLINE_CIL
    if any(s.source == "places365" for s in p.stream_data) and p.memory.capacity is not None:
        return STORAGE_CIL
    return OFFLINE_CIL


def _updates(p: Protocol) -> str:
    t = p.training
    if t.online:
        return "one per arriving sample"
    if t.budget is not None:
        return f"as many as fit {t.budget.tflops:g} training TFLOPs a session (a FLOP budget)"
    return f"{t.updates:,}"


def _batch(p: Protocol) -> str:
    b = p.training.batch
    mix = {"by_source": ", old by source as the published loaders"}.get(p.training.old_mix or "", "")
    return f"{b.new + b.old:,}: {b.new:,} new + {b.old:,} old ({100 * b.new / (b.new + b.old):.0f} % new{mix})"


def _eval(p: Protocol) -> str:
    e, updates = p.eval, p.training.updates
    if e.tflops is not None:
        return "by training compute (eval.tflops)"
    if e.every is None:
        return "at each session's end"
    points = f": {updates // e.every} points a session" if isinstance(updates, int) else ""
    dense = f" (every {e.dense_every} until update {e.dense_until})" if e.dense_every else ""
    return f"every {e.every} updates{points}{dense}"


def _pretrain_data(p: Protocol) -> str:
    d, pre = p.pretrain_data, p.pretrain
    size = []
    if d.num_classes is not None:
        size.append(f"{d.num_classes:,} classes")
    if d.train_per_class is not None:
        size.append(f"{d.train_per_class:,} images a class")
    text = d.source + (f": {', '.join(size)}" if size else "")
    if pre.mode == "train":
        return f"{text}; the deployed model fitted to it for {pre.updates:,} updates ({pre.trainable}) from the " \
               f"backbone's weights"
    return f"{text}; the backbone's released weights and head"


def distance(p: Protocol, sgm: str) -> tuple[Setup, list[Axis]]:
    """The paper setup ``p`` stands for, and each axis: the paper's value beside ``p``'s. ``sgm`` is what
    ``vanilla+sgm`` (or the online setup's ``remind+sgm``) gets on ``p``, described by the caller (the
    method's settings live with the methods)."""
    s = setup_for(p)
    ours = [("updates per session", s.updates, _updates(p)),
            ("batch (new fraction)", s.batch, _batch(p)),
            ("eval cadence", s.eval, _eval(p)),
            ("input size", s.input_size, f"{p.backbone.input_size} x {p.backbone.input_size}"),
            ("backbone and its pretraining", s.backbone, f"{p.backbone.model} ({p.backbone.weights}); trunk frozen "
                                                         f"through {p.backbone.trunk[-1]}"),
            ("deployed model's pre-training data", s.pretrain_data, _pretrain_data(p)),
            ("SGM's settings", s.sgm, sgm)]
    return s, [Axis(axis, value.text, value.where, mine) for axis, value, mine in ours]


def describe(setup: Setup, axes: list[Axis]) -> str:
    """The distance as YAML comment lines (``bench show protocol`` prints them under the spec)."""
    lines = [f"# Distance from the paper: {setup.name} ({setup.where})"]
    width = max(len(a.axis) for a in axes)
    for a in axes:
        lines.append(f"#   {a.axis:<{width}}  paper: {a.paper}  [{a.where}]")
        lines.append(f"#   {'':<{width}}  here:  {a.protocol}")
    return "\n".join(lines)
