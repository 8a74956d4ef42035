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
