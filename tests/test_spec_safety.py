"""Hostile spec files and protocol values: exit code 2 and one paragraph naming the file, line, field or
value, before anything runs; never a hang or a traceback."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.harness.spec.specfile import MAX_DEPTH, MAX_NODES

TINY = load_protocol("tiny_cil").model_dump(mode="json")


def validate(path: Path):
    out = CliRunner().invoke(main, ["validate", str(path)], catch_exceptions=False)
    return out.exit_code, out.output


def one_paragraph(text: str) -> bool:
    return "Traceback" not in text and len(text.strip().splitlines()) == 1


def billion_laughs() -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\nname: *i\n"


@pytest.mark.parametrize("content, needles", [
    (billion_laughs(), [f"more than {MAX_NODES} values", "line"]),
    ("x: " + "[" * 5000 + "]" * 5000 + "\n", ["nested too deeply"]),
    ("x: " + "[" * (MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "\n", [f"deeper than {MAX_DEPTH}", "line 1"]),
    ("name: a\nversion: 1\nname: b\n", ["duplicate key 'name'", "line 3", "first at line 1"]),
    ("sessions: 4\nbackbone: {model: m, model: n}\n", ["duplicate key 'model'", "line 2"]),
    ("name: a\n  version: [1\n", ["not valid YAML", "line 2"]),
])
def test_hostile_yaml_is_refused_fast_with_the_place_named(tmp_path, content, needles) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text(content)
    t0 = time.perf_counter()
    code, output = validate(path)
    # a bound on a hang, not a speed target: an expanded alias bomb never finishes; a loaded machine takes seconds
    assert time.perf_counter() - t0 < 60, "refused without expanding"
    assert code == 2 and one_paragraph(output), output
    assert str(path) in output
    for needle in needles:
        assert needle in output, (needle, output)


@pytest.mark.parametrize("data, needle", [
    ("name: tiny\n".encode("utf-16"), "UTF-16/32 encoded"),
    (b"name: caf\xe9\nversion: 1\n", "byte 0xe9 at line 1"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not a UTF-8 text file"),
    (b"name: x\n\x00\x00", "NUL byte at line 2"),
])
def test_non_text_files_are_refused(tmp_path, data, needle) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(data)
    code, output = validate(path)
    assert code == 2 and one_paragraph(output) and needle in output and str(path) in output, output


def test_a_utf8_bom_is_fine(tmp_path) -> None:
    path = tmp_path / "bom.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + yaml.safe_dump(TINY).encode())
    assert validate(path)[0] == 0


def test_merge_keys_still_work_and_own_keys_override(tmp_path) -> None:
    spec = copy.deepcopy(TINY)
    text = yaml.safe_dump(spec).replace("joint:\n", "joint:\n  <<: {lr: 0.5, updates: 7}\n")
    path = tmp_path / "merge.yaml"
    path.write_text(text)
    assert validate(path)[0] == 0
    assert load_protocol(str(path)).joint.lr == spec["joint"]["lr"]


def bad(tmp_path: Path, change) -> tuple[int, str]:
    spec = copy.deepcopy(TINY)
    change(spec)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    return validate(path)


@pytest.mark.parametrize("change, needles", [
    (lambda s: s["training"].update(updates=0), ["training.updates", "greater than 0", "(got 0)"]),
    (lambda s: s["training"].update(updates=-5), ["training.updates", "(got -5)"]),
    (lambda s: s["joint"].update(updates=0), ["joint.updates", "(got 0)"]),
    (lambda s: s["training"]["batch"].update(new=10**9), ["training.batch.new", "(got 1000000000)"]),
    (lambda s: s["backbone"].update(input_size=100000), ["backbone.input_size", "(got 100000)"]),
    (lambda s: s.update(classes_per_session=3), ["classes_per_session (3) does not divide the 20 stream classes"]),
    (lambda s: s.update(classes_per_session=10), ["sessions (4) x classes_per_session (10) = 40", "hold only 20"]),
    (lambda s: s["joint"].update(lr=float("inf")), ["joint.lr", "finite", "(got inf)"]),
    (lambda s: s["pretrain"].update(lr=0.0), ["pretrain.lr", "greater than 0"]),
    (lambda s: s["pretrain"].update(lr=1e308), ["pretrain.lr", "less than or equal to 10"]),
    (lambda s: s["backbone"].update(mean=[float("nan"), 0.5, 0.5]), ["backbone.mean.0", "finite", "(got nan)"]),
    (lambda s: s["backbone"].update(std=[0.5, 0.0, 0.5]), ["backbone.std.1", "greater than 0"]),
    (lambda s: s["pretrain"].update(seed=2**40), ["pretrain.seed", "(got 1099511627776)"]),
    (lambda s: s["pretrain"].update(seed=-1), ["pretrain.seed", "(got -1)"]),
    (lambda s: s["stream_data"][0].update(train_per_class=1), ["training.batch.new (32) exceeds the 5"]),
    (lambda s: s["pretrain"].update(batch_size=20000), ["pretrain.batch_size (20000) exceeds the 10000"]),
    (lambda s: s["training"].update(updates=list(range(10**3))), ["training.updates", "(got [0, 1, 2, 3, 4, 5, ...])"]),
    (lambda s: s.update(description="x" * 10**5, version="v" * 10**5), ["version", "vvv..."]),
])
def test_protocol_values_that_would_fail_late_are_refused(tmp_path, change, needles) -> None:
    code, output = bad(tmp_path, change)
    assert code == 2 and one_paragraph(output), output
    for needle in needles:
        assert needle in output, (needle, output)
    assert len(output) < 600, "the offending value is shown truncated"


@pytest.mark.parametrize("change, needles", [
    # a name longer than a results folder or a cache lock can carry; the longest allowed still validates
    (lambda s: s.update(name="a" * 5000), ["name", "at most 100 characters"]),
    # YAML's true is not a count: pydantic would read it as 1
    (lambda s: s.update(sessions=True), ["sessions: a number, not true/false"]),
    (lambda s: s["training"].update(updates=True), ["training.updates: a number, not true/false"]),
    (lambda s: s["training"]["batch"].update(old=False), ["training.batch.old: a number, not true/false"]),
    (lambda s: s["backbone"].update(mean=[True, 0.5, 0.5]), ["backbone.mean: a number, not true/false"]),
    # the same images twice, under two labels
    (lambda s: s["stream_data"].append(dict(s["stream_data"][0])),
     ["stream_data[2] reads the same data as stream_data[0]", "'mnist5k'"]),
    # an old half the memory can never hold, by capacity or by what there is to store
    (lambda s: s["training"]["batch"].update(old=65536),
     ["training.batch.old (65,536) exceeds the 18,000 training samples the memory could ever store"]),
    (lambda s: s.update(memory={"policy": "reservoir", "capacity": 1}),
     ["training.batch.old (32) exceeds the 1 samples of memory.capacity"]),
    # subsamples past what the source holds, once clamped silently
    (lambda s: s["stream_data"][0].update(classes=1000), ["stream_data.0", "classes (1,000) exceeds the 10 classes"]),
    (lambda s: s["stream_data"][0].update(train_per_class=100000),
     ["stream_data.0", "train_per_class (100,000) exceeds the 400 training images a class source 'mnist5k'"]),
    (lambda s: s["pretrain_data"].update(test_per_class=2000), ["pretrain_data", "test_per_class (2,000) exceeds"]),
    # fields that would be ignored, or name nothing
    (lambda s: s.update(ordering="iid"), ["classes_per_session (5) sets the classes of CIL sessions", "'iid'"]),
    (lambda s: s.update(superseded_by="nope"), ["superseded_by: Unknown protocol 'nope'"]),
    (lambda s: (s.update(ordering="iid", sessions=10000), s.pop("classes_per_session")),
     ["sessions (10,000) over the 8,000 stream training samples leave none for a session"]),
    # a module in two places (the trunk pass, or shapes mid-training, failed on these)
    (lambda s: s["backbone"]["trunk"].append("blocks.0"), ["backbone.trunk entry 'blocks.0' repeats"]),
    (lambda s: s["backbone"]["body"].insert(0, "blocks.3.0"),
     ["backbone.body entry 'blocks.3.0' overlaps backbone.trunk entry 'blocks.3'"]),
    (lambda s: s["backbone"].update(lora_targets=["conv_pw", "conv_pw"]), ["backbone.lora_targets repeats 'conv_pw'"]),
])
def test_protocol_values_that_ran_wrongly_or_died_late_are_refused(tmp_path, change, needles) -> None:
    code, output = bad(tmp_path, change)
    assert code == 2 and one_paragraph(output), output
    for needle in needles:
        assert needle in output, (needle, output)


def test_the_longest_name_validates_and_its_budget_family_names_stay_short(tmp_path) -> None:
    from bench_stability_gap.harness.spec.protocol import MAX_NAME

    spec = {**load_protocol("tiny_cil_flops").model_dump(mode="json"), "name": "a" * MAX_NAME}
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert validate(path)[0] == 0
    assert len(load_protocol(f"{path}@0.0001x").name) <= MAX_NAME + 13  # within the 140 a run was seen to carry


def test_a_changed_copy_under_a_built_in_name_is_refused_and_an_identical_one_is_not(tmp_path) -> None:
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(TINY))
    assert validate(same)[0] == 0
    code, output = bad(tmp_path, lambda s: s["training"].update(updates=101))
    assert code == 2 and one_paragraph(output), output
    assert "named 'tiny_cil', as the built-in protocol, but differs" in output and "name: tiny_cil_mine" in output


def test_a_file_named_as_a_member_of_a_builtin_budget_family_must_be_that_member(tmp_path) -> None:
    """A file named tiny_cil_flops@2x filed its results as the built-in family member's whatever it held."""
    scaled = load_protocol("tiny_cil_flops@2x").model_dump(mode="json")
    same = tmp_path / "same.yaml"
    same.write_text(yaml.safe_dump(scaled))
    assert validate(same)[0] == 0
    scaled["training"]["batch"]["new"] += 1
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(scaled))
    code, output = validate(changed)
    assert code == 2 and one_paragraph(output), output
    assert "named 'tiny_cil_flops@2x', as the built-in protocol, but differs" in output, output
    assert "name: tiny_cil_flops_mine" in output, output
    unbudgeted = tmp_path / "unbudgeted.yaml"
    unbudgeted.write_text(yaml.safe_dump({**TINY, "name": "tiny_cil@2x"}))  # tiny_cil has no budget to scale
    code, output = validate(unbudgeted)
    assert code == 2 and one_paragraph(output), output
    assert "budget family, which has no such member" in output and "name: tiny_cil_mine" in output, output


def test_extends_naming_a_folder_says_so(tmp_path) -> None:
    path = tmp_path / "e.yaml"
    path.write_text(f"extends: {tmp_path}\nname: e\n")
    code, output = validate(path)
    assert code == 2 and f"the file it extends, {tmp_path} is a folder" in output, output


@pytest.mark.skipif(not Path("/proc/self/mem").is_file(), reason="needs Linux's /proc/self/mem")
@pytest.mark.parametrize("command", [["validate", "{bad}"], ["validate", "{ext}"], ["run", "--protocol", "{bad}"],
                                     ["tune", "tiny_cil_quick", "vanilla", "--space", "{bad}"]])
def test_a_file_that_fails_to_read_is_one_paragraph(tmp_path, command) -> None:
    """A spec, extended spec or search-space file that exists but fails to read (no read permission, an I/O
    error; /proc/self/mem fails to read even for root) was a traceback from --space and extends."""
    bad = tmp_path / "bad.yaml"
    bad.symlink_to("/proc/self/mem")
    ext = tmp_path / "ext.yaml"
    ext.write_text(f"extends: {bad}\nname: e\n")
    args = [a.format(bad=bad, ext=ext) for a in command] + (["--results-dir", str(tmp_path / "r")]
                                                            if command[0] != "validate" else [])
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 2 and one_paragraph(out.output), out.output
    assert f"{bad} cannot be read (Input/output error)" in out.output, out.output
