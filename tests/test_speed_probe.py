"""ci/speed_probe.py, the fixed piece of work ci/test.sh times beside the suite: its line must stay one that
ci/test.sh reads its total from."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

CI = Path(__file__).parents[1] / "ci"


def test_the_probe_prints_its_total_and_parts_and_the_test_script_reads_the_total(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("speed_probe", CI / "speed_probe.py")
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    for part, seconds in (("_imports", 5.04), ("_python", 0.52), ("_torch", 2.31)):
        monkeypatch.setattr(probe, part, lambda seconds=seconds: seconds)
    probe.main()
    line = capsys.readouterr().out
    assert line == "speed probe: 7.9 s (imports 5.0 s, python 0.5 s, torch 2.3 s)\n"
    # the expression ci/test.sh applies to the probe's output
    (expression,) = re.findall(r"sed -E '([^']+)'", (CI / "test.sh").read_text())
    read = subprocess.run(["sed", "-E", expression], input=line, capture_output=True, text=True, check=True)
    assert read.stdout == "7.9\n"
