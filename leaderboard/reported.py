"""The paper's reported numbers (leaderboard/data/reported.yaml), shown beside ours, never ranked with them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..harness.errors import BenchError
from .aggregate import COLUMN_BY_KEY, Stat

METRIC_KEYS = ("params", "S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha")


class ReportedRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="the paper's name for the row")
    method: str = Field(description="the bench method string that corresponds to it")
    reference: bool = False
    params: float | None = None
    S_delta: float | list[float] | None = None
    P_delta: float | list[float] | None = None
    CK_delta: float | list[float] | None = None
    sigma: float | list[float] | None = None
    mu: float | list[float] | None = None
    alpha: float | list[float] | None = None

    @field_validator("S_delta", "P_delta", "CK_delta", "sigma", "mu", "alpha")
    @classmethod
    def _mean_std(cls, v: object) -> object:
        if isinstance(v, list) and len(v) != 2:
            raise ValueError("a value is a number or [mean, std]")
        return v

    def stat(self, key: str) -> Stat:
        v = getattr(self, key, None)
        if v is None:
            return Stat(None, None, 0)
        if isinstance(v, list):
            return Stat(float(v[0]), float(v[1]), 1)
        return Stat(float(v), None, 1)


class ReportedTable(BaseModel):
    model_config = ConfigDict(extra="forbid")

    table: str
    label: str
    caption: str
    runs: int = Field(1, ge=1)
    rows: list[ReportedRow]

    @property
    def columns(self) -> list[str]:
        """The metric columns this table reports (the paper's tables differ)."""
        return [k for k in METRIC_KEYS if any(getattr(r, k) is not None for r in self.rows)]


def load_reported(path: Path | None = None) -> dict[str, list[ReportedTable]]:
    """protocol name -> the paper's tables for it."""
    text = (path.read_text() if path
            else (resources.files("bench_stability_gap.leaderboard") / "data" / "reported.yaml").read_text())
    try:
        data = yaml.safe_load(text) or {}
        return {str(k): [ReportedTable.model_validate(t) for t in v] for k, v in data.items()}
    except (yaml.YAMLError, ValidationError, AttributeError, TypeError) as exc:
        raise BenchError(f"Reported numbers file {path or 'leaderboard/data/reported.yaml'} "
                         f"is invalid: {exc}") from None


assert set(METRIC_KEYS) <= set(COLUMN_BY_KEY)
