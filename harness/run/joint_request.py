"""What ``joint`` accepts, checked without torch: it is the harness's reference, so it takes no variant."""

from __future__ import annotations

from typing import Any

from ..errors import BenchError
from ..results.schema import JOINT


def check_joint_request(method_text: str, overrides: dict[str, Any]) -> None:
    """``joint`` is the harness's reference: a variant of it would change every other run's S_Δ."""
    base, *mods = [p.strip() for p in method_text.split("+")]
    if base == JOINT and (mods or overrides):
        given = " ".join([f"modifiers {'+'.join(mods)}"] * bool(mods) + [f"--set {overrides}"] * bool(overrides))
        raise BenchError(
            f"Method {method_text!r}: joint is the harness's upper-bound reference (A_joint), trained with the "
            f"protocol's joint section (joint.lr, joint.weight_decay, joint.updates, joint.batch_size), so it "
            f"takes no modifiers or --set ({given} given). To study another upper bound, copy the protocol "
            f"file and change its joint section: the new spec hash keeps its references apart."
        )
