"""Accuracy curves recorded during a run: the raw material of every metric and plot."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class BeforePoint(BaseModel):
    """Accuracies of the model a session starts from, on the session's test classes (tasks 1..j): the
    model at the end of session j-1 (the deployed model for j = 2), measured before the harness grows the
    head and before the method's ``begin_session``. What ACC, forgetting, BWT and FWT read as "before
    session j"; the curve's update-0 point (after ``begin_session``) is what S_Δ and the plots read."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")

    old: float
    new: float
    all: float
    tasks: list[float]


class SessionCurve(BaseModel):
    """Accuracies of one learning session j (2..N) at each eval point, update 0 included.

    ``tasks[k][p]`` is the accuracy at point ``p`` on the test classes first introduced in session
    ``k + 1`` (task 1 = the pre-training classes), for k = 0..j-1; De Lange's min-ACC and the
    paper's sigma read it.
    """

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # NaN stays NaN in the JSON

    session: int = Field(ge=2)
    total_updates: int = Field(gt=0, description="U_j, the number of updates in this session")
    updates: list[int] = Field(description="eval points (updates done so far), first is 0")
    old: list[float] = Field(description="A_i(E_1:j-1)")
    new: list[float] = Field(description="A_i(E_j)")
    all: list[float] = Field(description="A_i(E_1:j)")
    tasks: list[list[float]] = Field(description="per-task accuracy, tasks[k][p]")
    # cumulative training FLOPs at each eval point (filled when FLOP accounting is on)
    train_flops: list[float] | None = None
    loss: list[float] = Field(default_factory=list,
                              description="training loss of each update, in order (the paper's Fig. 2a); "
                                          "empty when not recorded")
    before: BeforePoint | None = Field(
        default=None, description="the model the session starts from, before begin_session and head growth; "
                                  "absent from results stored before it was recorded")

    @model_validator(mode="after")
    def _aligned(self) -> SessionCurve:
        n = len(self.updates)
        if n == 0 or self.updates[0] != 0:
            raise ValueError("a session curve starts with the eval point at update 0")
        if any(b <= a for a, b in zip(self.updates, self.updates[1:])):
            raise ValueError("eval points must be strictly increasing")
        if self.updates[-1] > self.total_updates:
            raise ValueError("an eval point lies beyond the session's last update")
        if not (len(self.old) == len(self.new) == len(self.all) == n):
            raise ValueError("old/new/all must have one value per eval point")
        if len(self.tasks) != self.session or any(len(t) != n for t in self.tasks):
            raise ValueError("tasks must hold one curve per task 1..j, one value per eval point")
        if self.loss and len(self.loss) != self.total_updates:
            raise ValueError(f"loss must hold one value per update ({self.total_updates}) or none")
        if self.before is not None and len(self.before.tasks) != self.session:
            raise ValueError("before must hold one accuracy per task 1..j")
        return self


class ReferenceSession(BaseModel):
    """End-of-session accuracies of the joint model trained on S1..Sj (the paper's A_joint)."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")  # NaN stays NaN in the JSON

    session: int = Field(ge=2)
    old: float
    new: float
    all: float
    tasks: list[float]
