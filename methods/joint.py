"""The joint model: the upper bound every gap is normalised by (A_joint)."""

from __future__ import annotations

from .base import StandardMethod


class Joint(StandardMethod):
    """Trained offline on S1..Sj for each session j (or once on everything); not a continual learner.

    The runner trains it with the protocol's ``joint`` budget, drawing batches uniformly from all data
    seen so far, and records its end-of-session accuracies as the reference for every other run.
    """

    name = "joint"
    summary = "Upper bound: retrained on all data seen so far (S1..Sj) for each session; gives A_joint."
    reference = True
