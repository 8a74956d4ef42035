"""The README's sample output is a stored real run rendered by the code that prints it (ci/first_run_sample.py),
so a change to the table's format, to the first-run protocol's spec or to the README's first command fails here
until the sample is regenerated."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
try:
    import first_run_sample as sample
finally:
    sys.path.pop(0)


def test_the_readme_sample_is_what_the_stored_first_run_renders() -> None:
    assert sample.problems(sample.README.read_text()) == []


def test_the_sample_names_the_protocol_and_prints_the_gaps() -> None:
    block = sample.render()
    assert f"$ .venv/bin/bench run -p {sample.PROTOCOL}" in block
    assert f"\n{sample.PROTOCOL} | vanilla | seed 0 | " in block
    for key in ("S_delta", "P_delta", "CK_delta"):
        assert f"\n  {key} " in block


def test_an_edited_sample_a_changed_protocol_or_another_first_command_is_reported(tmp_path: Path) -> None:
    readme = sample.README.read_text()
    block = sample.current_block(readme)
    assert block is not None
    edited = readme.replace(block, block.replace("S_delta", "S_Delta"))
    assert sample.problems(edited) == ["the README's sample differs from what the stored run renders"]

    other_command = readme.replace(f"&& {sample.COMMAND}\n", "&& .venv/bin/bench run\n")
    assert sample.problems(other_command)[0].startswith("the README's first command is not")

    stale = json.loads(sample.STORED.read_text())
    stale["protocol"]["hash"] = "0" * 16
    stored = tmp_path / "stale.json"
    stored.write_text(json.dumps(stale))
    found = sample.problems(readme, stored)
    assert found[0].startswith(f"the stored run is {sample.PROTOCOL} spec 0000000000000000, the protocol now is")

    assert sample.problems(readme.replace(sample.END, ""))[-1].startswith("the README has no sample block")
