"""What the leaderboard says about each built-in method and modifier: its family and its paper.

Kept beside the registry, torch-free, as timm keeps a model's metadata beside its registration: the
leaderboard reads it without importing any method. A name not listed here (a plugin's method, which the
leaderboard does not import) is shown in the family ``other`` without a link.
A method string's family is that of its last modifier that has one (``vanilla+nmc``: head), else its
base's (``vanilla+sgm``: rehearsal, the base SGM wraps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Family = Literal["baseline", "rehearsal", "regularisation", "head", "other"]
FAMILIES: tuple[Family, ...] = ("baseline", "rehearsal", "regularisation", "head", "other")


@dataclass(frozen=True)
class MethodInfo:
    family: Family | None   # None: a modifier that leaves the base's family (sgm's parts)
    paper: str              # the paper's title and venue, as cited
    url: str                # where to read it


SGM_PAPER = ("Harun & Kanan, Overcoming the Stability Gap in Continual Learning, TMLR 2024",
             "https://openreview.net/forum?id=o2wEfwUOma")

METADATA: dict[str, MethodInfo] = {
    "joint": MethodInfo("baseline", "Joint training on every session so far (the gaps' reference)", SGM_PAPER[1]),
    "finetune": MethodInfo("baseline", "Naive fine-tuning, the lower bound (" + SGM_PAPER[0] + ")", SGM_PAPER[1]),
    "output_only": MethodInfo("rehearsal", "Output-layer-only rehearsal (" + SGM_PAPER[0] + ")", SGM_PAPER[1]),
    "vanilla": MethodInfo("rehearsal", "Vanilla rehearsal (" + SGM_PAPER[0] + ")", SGM_PAPER[1]),
    "derpp": MethodInfo("rehearsal", "Buzzega et al., Dark Experience for General Continual Learning, NeurIPS 2020",
                        "https://arxiv.org/abs/2004.07211"),
    "gdumb": MethodInfo("rehearsal", "Prabhu et al., GDumb: A Simple Approach that Questions Our Progress in "
                                     "Continual Learning, ECCV 2020", "https://github.com/drimpossible/GDumb"),
    "remind": MethodInfo("rehearsal", "Hayes et al., REMIND Your Neural Network to Prevent Catastrophic "
                                      "Forgetting, ECCV 2020", "https://arxiv.org/abs/1910.02509"),
    "er_ace": MethodInfo("rehearsal", "Caccia et al., New Insights on Reducing Abrupt Representation Change in "
                                      "Online Continual Learning, ICLR 2022", "https://arxiv.org/abs/2104.05025"),
    "lwf": MethodInfo("regularisation", "Li & Hoiem, Learning without Forgetting, TPAMI 2017",
                      "https://arxiv.org/abs/1606.09282"),
    "ewc": MethodInfo("regularisation", "Kirkpatrick et al., Overcoming catastrophic forgetting in neural "
                                        "networks, PNAS 2017", "https://arxiv.org/abs/1612.00796"),
    "nmc": MethodInfo("head", "Łapacz et al., Exploring the Stability Gap in Continual Learning: The Role of "
                              "the Classification Head, WACV 2025", "https://arxiv.org/abs/2411.04723"),
    **{part: MethodInfo(None, *SGM_PAPER) for part in ("sgm", "soft", "init", "oocf", "lora")},
}


def method_family(method: str) -> Family:
    """The family a method string is listed under (see the module's docstring)."""
    base, *modifiers = method.split("+")
    for name in reversed(modifiers):
        info = METADATA.get(name)
        if info is not None and info.family is not None:
            return info.family
    info = METADATA.get(base)
    return info.family if info is not None and info.family is not None else "other"


def method_papers(method: str) -> list[tuple[str, str, str]]:
    """(name, citation, url) of each part of a method string that has a paper, base first; SGM's parts
    share one paper, listed once."""
    out: list[tuple[str, str, str]] = []
    for name in method.split("+"):
        info = METADATA.get(name)
        if info is not None and all(url != info.url for _, _, url in out):
            out.append((name, info.paper, info.url))
    return out
