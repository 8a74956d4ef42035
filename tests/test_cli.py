"""Bad input: one clear paragraph naming the field, value or path, and exit code 2."""

from __future__ import annotations

import pytest

from support import invoke


def test_ls_protocols_lists_every_protocol():
    out = invoke("ls", "protocols")
    assert out.exit_code == 0
    for name in ("tiny_cil", "tiny_iid", "cil_places_lt", "online_cub_20k", "cil_places_lt_norehearsal"):
        assert name in out.output


def test_ls_methods_names_the_supplying_distribution():
    out = invoke("ls", "methods")
    assert out.exit_code == 0
    assert "vanilla" in out.output and "bench-stability-gap" in out.output


def test_show_protocol_prints_spec_and_hash():
    out = invoke("show", "protocol", "tiny_cil")
    assert out.exit_code == 0 and "hash" in out.output and "classes_per_session: 5" in out.output


@pytest.mark.parametrize("args, needle", [
    (("run", "--protocol", "tiny_cli"), "Did you mean: tiny_cil"),
    (("run", "--method", "vanila"), "Did you mean: vanilla"),
    (("run", "--method", "vanilla+sgmm"), "Unknown modifier 'sgmm'"),
    (("run", "--method", "vanilla++"), "malformed"),
    (("run", "--set", "lr"), "key=value"),
    (("run", "--set", "lrr=0.1"), "lrr"),
    (("run", "--set", "lr=0.1", "--set", "lr=0.2"), "--set lr is given twice, as 0.1 and 0.2: give it once."),
    (("sweep", "table1_tiny_cil", "--dry-run", "--seeds", "0,x"), "--seeds '0,x' must be comma-separated integers"),
    (("show", "protocol", "nope"), "Unknown protocol 'nope'"),
])
def test_bad_input_exits_2_with_a_named_error(args, needle):
    out = invoke(*args)
    assert out.exit_code == 2, out.output
    assert needle in out.output
    assert "Traceback" not in out.output


def test_a_malformed_protocol_file_exits_2_naming_field_and_value(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nversion: one\n")
    out = invoke("validate", str(bad))
    assert out.exit_code == 2 and "version" in out.output and "'one'" in out.output


def test_validate_accepts_a_good_protocol(tmp_path):
    out = invoke("validate", "protocols/tiny_cil.yaml")
    assert out.exit_code == 0 and "OK" in out.output


def test_missing_data_folder_names_folder_and_layout(tmp_path, seeded_store):
    out = invoke("run", "--protocol", "online_cub_20k", "--results-dir", str(seeded_store(tmp_path)),
                 env={"BENCH_DATA": str(tmp_path / "data")})
    assert out.exit_code == 2
    assert str(tmp_path / "data" / "imagenet") in out.output and "train" in out.output


def test_online_cub_with_remind_sgm_names_the_missing_cub_folder(tmp_path, seeded_store):
    # ImageNet present (a one-image stand-in), CUB absent: the error names CUB's folder and layout
    for split in ("train", "val"):
        (tmp_path / "data" / "imagenet" / split / "n01").mkdir(parents=True)
        (tmp_path / "data" / "imagenet" / split / "n01" / "a.JPEG").touch()
    out = invoke("run", "--protocol", "online_cub_20k", "--method", "remind+sgm", "--results-dir",
                 str(seeded_store(tmp_path / "r")), env={"BENCH_DATA": str(tmp_path / "data")})
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert str(tmp_path / "data" / "CUB_200_2011") in out.output and "images.txt" in out.output
    assert not (tmp_path / "r" / "runs").exists()


def test_unset_data_variable_is_named(tmp_path, seeded_store):
    out = invoke("run", "--protocol", "cil_places_lt", "--results-dir", str(seeded_store(tmp_path)), env={"BENCH_DATA": None})
    assert out.exit_code == 2 and "BENCH_DATA" in out.output


def test_corrupt_result_file_is_named(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text("{not json")
    out = invoke("validate", str(bad))
    assert out.exit_code == 2 and str(bad) in out.output


@pytest.mark.parametrize("args, needle", [
    (("sweep", "table1_tiny_cil", "--dry-run", "--seeds", ""), "--seeds '' must be comma-separated integers"),
    (("show", "protocol", ""), "The protocol name is empty"),
    (("show", "protocol", "  "), "The protocol name is empty"),
    *[(("show", "protocol", f"tiny_cil_flops@{k}x"), "K must be a plain decimal (e.g. 0.5) of at least 0.0001")
      for k in ("0", "-1", "1e-30", "0.00001", "nan", "inf", "1e9", "+2", "5e-1")],
])
def test_empty_or_absurd_small_inputs_exit_2_naming_what_is_wrong(args, needle):
    """An empty --seeds ran the file's seeds; an empty protocol name was "Protocol file . is a folder"; a
    negative, NaN or exponent factor in NAME@Kx was an unknown protocol instead of a factor it cannot take."""
    out = invoke(*args)
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert needle in out.output, out.output


@pytest.mark.parametrize("columns", ["", ",,", " , "])
def test_leaderboard_table_refuses_columns_that_name_no_column(tmp_path, columns):
    out = invoke("leaderboard", "table", "--results-dir", str(tmp_path), "--columns", columns)
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert f"--columns {columns!r} names no column" in out.output, out.output


@pytest.mark.parametrize("name", ['""', '"  "'])
def test_a_sweep_file_with_an_empty_name_is_refused(tmp_path, name):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: {name}\nseeds: [0]\nruns: [{{protocol: tiny_cil, methods: [vanilla]}}]\n")
    out = invoke("sweep", str(path), "--dry-run")
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    assert "name" in out.output and "Sweep :" not in out.output, out.output


def test_only_a_bench_process_of_its_own_sets_its_imports_aside_from_the_collector(monkeypatch):
    """A command that computes freezes what it has imported (frozen objects are never collected, nor walked
    again by each full collection) when the process is its own; a Python caller's collector stays as it was."""
    import gc

    from bench_stability_gap.harness import cli

    held = [[] for _ in range(10)]  # objects the collector tracks, made after any freeze before this test
    frozen = gc.get_freeze_count()
    cli._set_imports_aside()  # main() was called from Python here (click's runner, this test): not its own
    assert gc.get_freeze_count() == frozen
    monkeypatch.setattr(cli.main, "whole_process", True)  # as `bench ...` and `python -m` call it
    cli._set_imports_aside()
    assert gc.get_freeze_count() >= frozen + len(held)
