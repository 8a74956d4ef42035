"""What SGM gets on a protocol, in one line: the settings ``vanilla+sgm`` (``remind+sgm`` on an online
protocol, the paper's online setup) is built with there, for the paper-distance block that ``bench show
protocol`` and the leaderboard print beside the paper's own settings (``harness/spec/paper.py``)."""

from __future__ import annotations

from ...harness.errors import BenchError
from ...harness.spec.protocol import Protocol
from ..registry import build_method


def sgm_settings(protocol: Protocol) -> str:
    """lr, optimizer, LoRA and the parts in use, as the method string is built on ``protocol`` with no --set."""
    base = "remind" if protocol.training.online else "vanilla"
    try:
        _, method = build_method(f"{base}+sgm", protocol)
    except BenchError as exc:  # a protocol the method refuses: say so instead of a value
        return f"{base}+sgm cannot run here ({exc})"
    config = method.config
    sgm = next(m for m in method.modifiers if m.name == "sgm").config
    lr = f"lr {config.lr:g}"
    if base == "remind":
        lr = f"REMIND's per-class lr {config.lr:g} to {config.lr_end:g}"
    parts = [f"{lr}, AdamW wd {config.weight_decay:g}, layer decay {config.layer_decay:g}"]
    if "lora" in sgm.use:
        targets = sgm.lora.targets or protocol.backbone.lora_targets
        scale = "" if sgm.lora.alpha is None else f" (scale {sgm.lora.alpha:g}/{sgm.lora.rank})"
        parts.append(f"LoRA rank {sgm.lora.rank}{scale} on {', '.join(targets)}")
    if "onecycle" in sgm.use:
        parts.append("OneCycle")
    named = {"soft": "soft targets", "init": "init", "oocf": "OOCF"}
    parts.append(", ".join(named[u] for u in sgm.use if u in named) or "no soft targets, init or OOCF")
    return "; ".join(parts)
