"""ci/map_figure.py pairs vanilla+sgm with vanilla by seed at each step of the map and draws the effects."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
try:
    import map_figure
finally:
    sys.path.pop(0)


def _frame() -> pd.DataFrame:
    rows = []
    # tiny_cil: three seeds, SGM above vanilla by 0.10, 0.12, 0.14; laptop_table1: one seed only
    for seed, gap in enumerate((0.10, 0.12, 0.14)):
        rows.append(("tiny_cil", "vanilla", seed, 0.20, 0.30))
        rows.append(("tiny_cil", "vanilla+sgm", seed, 0.20 + gap, 0.30 - gap))
    rows.append(("laptop_table1", "vanilla", 0, 0.5, 0.5))
    rows.append(("laptop_table1", "vanilla+sgm", 0, 0.4, 0.5))
    rows.append(("tiny_cil", "joint", 0, float("nan"), float("nan")))  # references are not a step's runs
    frame = pd.DataFrame(rows, columns=["protocol", "method", "seed", "S_delta", "CK_delta"])
    frame["settings"], frame["reason"] = "defaults", ""
    return frame


def test_effects_pair_by_seed_with_a_t_interval_and_none_where_no_pair(tmp_path: Path) -> None:
    steps = map_figure.effects(map_figure.published_runs(_frame()), ["S_delta", "CK_delta"])
    by = {s.protocol: s for s in steps}
    tiny = by["tiny_cil"].effects["S_delta"]
    assert tiny is not None and tiny.mean == pytest.approx(0.12) and tiny.seeds == (0, 1, 2)
    assert tiny.interval is not None and tiny.interval.low < 0.12 < tiny.interval.high
    assert by["tiny_cil"].effects["CK_delta"].mean == pytest.approx(-0.12)  # type: ignore[union-attr]
    one = by["laptop_table1"].effects["S_delta"]
    assert one is not None and one.mean == pytest.approx(-0.1) and one.interval is None
    assert by["tiny_cil_u600"].effects["S_delta"] is None
    text = map_figure.table(steps, ["S_delta", "CK_delta"])
    assert "+0.120 [" in text and "(one seed: no interval)" in text and "no pair" in text
    out = tmp_path / "map.png"
    map_figure.figure(steps, ["S_delta", "CK_delta"], out)
    assert out.stat().st_size > 0


def test_a_second_run_of_one_cell_is_refused_not_averaged() -> None:
    frame = _frame()
    frame = pd.concat([frame, frame.iloc[[0]]])
    with pytest.raises(SystemExit, match="more than one stored run of tiny_cil vanilla seed 0"):
        map_figure.published_runs(frame)
