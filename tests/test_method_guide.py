"""The plugin guide's reference of what a method can read is the code's own: generated from the
docstrings, it must equal what docs/writing-a-method.md holds, and every field must say what it is."""

from __future__ import annotations

from bench_stability_gap.harness.tools.method_guide import GUIDE, OBJECTS, generate, members, section


def test_the_guide_holds_the_generated_reference():
    assert section(GUIDE.read_text()) == generate(), (
        "docs/writing-a-method.md is out of date: run python -m bench_stability_gap.harness.tools.method_guide --write")


def test_every_field_and_method_a_method_can_read_is_described():
    undocumented = [f"{cls.__name__}.{name}" for _, cls in OBJECTS for name, _, what in members(cls) if not what]
    assert undocumented == []


def test_the_reference_names_what_plugin_authors_asked_for():
    text = generate()
    for needle in ("`pretrain_ids`", "`get` | `(ids) -> Tensor`", "#### `self (StandardMethod)`", "`model` | `SplitModel`",
                   "#### `ctx.inputs`: LentInputs", "`current`"):
        assert needle in text, needle
