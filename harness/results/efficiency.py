"""The paper's efficiency figures: what a run cost against retraining jointly, from the two budgets."""

from __future__ import annotations

from .schema import Budget


def efficiency_vs_joint(budget: Budget, joint: Budget) -> Budget:
    """The paper's efficiency figures (appendix "Computational Efficiency": SGM needs 16.7x fewer
    updates and 31.9x fewer TFLOPs than joint): the joint reference's total optimizer steps and
    training FLOPs (summed over every joint model the protocol trains: one per session with
    ``joint.mode: per_session``) divided by this run's (all sessions). Greater than 1: the method is
    that many times cheaper than retraining jointly. None where a figure is missing (a joint result
    stored before FLOPs were counted)."""
    updates = joint.optimizer_steps / budget.optimizer_steps if budget.optimizer_steps else None
    ratio = (joint.train_flops / budget.train_flops
             if joint.train_flops is not None and budget.train_flops else None)
    return budget.model_copy(update={"updates_vs_joint": updates, "train_flops_vs_joint": ratio})
