"""The sweep file: a pydantic schema (printed by ``bench sweep --schema``), protocol paths read relative
to the file, a ``grid:`` expanded to methods × --set values × seeds; bad input exits 2 before any compute."""

from __future__ import annotations

import json

import yaml

from bench_stability_gap.harness.sweep.plan import load_sweep

from support import invoke, reduced_tiny


def _sweep(folder, body: dict):
    path = folder / "sweeps" / "mine.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"name": "mine", "seeds": [0, 1], **body}))
    return path


def test_schema_lists_every_key_and_forbids_others():
    out = invoke("sweep", "--schema")
    assert out.exit_code == 0, out.output
    schema = json.loads(out.output)
    assert set(schema["properties"]) == {"name", "description", "seeds", "runs", "grid"}
    assert schema["additionalProperties"] is False
    assert set(schema["$defs"]["SweepGrid"]["properties"]) == {"protocol", "methods", "set"}


def test_a_grid_expands_methods_by_set_values_by_seeds_and_paths_resolve_from_the_file(tmp_path, monkeypatch,
                                                                                      bench_cache):
    (tmp_path / "sweeps" / "protocols").mkdir(parents=True)
    (tmp_path / "sweeps" / "protocols" / "small.yaml").write_text(yaml.safe_dump(reduced_tiny()))
    path = _sweep(tmp_path, {"grid": [{"protocol": "protocols/small.yaml", "methods": ["vanilla", "vanilla+sgm"],
                                       "set": {"lr": [0.001, 0.0003], "weight_decay": [0.0, 0.05]}}]})
    groups = load_sweep(str(path)).groups()
    assert [g.set for g in groups] == [{"lr": 0.001, "weight_decay": 0.0}, {"lr": 0.001, "weight_decay": 0.05},
                                       {"lr": 0.0003, "weight_decay": 0.0}, {"lr": 0.0003, "weight_decay": 0.05}]
    monkeypatch.chdir(tmp_path.parent)  # another working directory: the protocol is found beside the file
    out = invoke("sweep", str(path), "--dry-run", "--results-dir", str(tmp_path / "results"))
    assert out.exit_code == 0, out.output
    assert "Sweep mine: 16 run(s), 0 already done, 16 to run" in out.output  # 2 methods x 4 settings x 2 seeds
    assert "tiny_cil_reduced vanilla+sgm seed 1 --set lr=0.0003 --set weight_decay=0.05: to run" in out.output


def test_bad_sweep_files_exit_2_naming_the_key_or_path(tmp_path):
    unknown = _sweep(tmp_path, {"runs": [{"protocol": "tiny_cil", "methods": ["vanilla"], "sett": {"lr": 1}}]})
    out = invoke("sweep", str(unknown), "--dry-run")
    assert out.exit_code == 2 and "runs.0.sett" in out.output and "Extra inputs are not permitted" in out.output

    missing = _sweep(tmp_path, {"runs": [{"protocol": "protocols/nope.yaml", "methods": ["vanilla"]}]})
    out = invoke("sweep", str(missing), "--dry-run")
    assert out.exit_code == 2
    assert "protocol 'protocols/nope.yaml'" in out.output and str(tmp_path / "sweeps" / "protocols" / "nope.yaml") in out.output

    for grid, needle in (([{"protocol": "tiny_cil", "methods": [], "set": {}}], "grid.0.methods"),
                         ([{"protocol": "tiny_cil", "methods": ["vanilla"], "set": {"lr": []}}], "lr lists no value"),
                         ([], "the sweep holds no run")):
        out = invoke("sweep", str(_sweep(tmp_path, {"grid": grid})), "--dry-run")
        assert out.exit_code == 2 and needle in out.output, out.output


def test_a_seed_or_method_listed_twice_plans_one_run(tmp_path):
    twice = [{"protocol": "tiny_cil", "methods": ["vanilla", "vanilla"]}, {"protocol": "tiny_cil", "methods": ["vanilla"]}]
    path = _sweep(tmp_path, {"seeds": [1, 0, 1], "runs": twice})
    for extra in ([], ["--seeds", "2,2"]):
        out = invoke("sweep", str(path), "--dry-run", "--results-dir", str(tmp_path / "results"), *extra)
        assert out.exit_code == 0, out.output
        seeds = [1, 0] if not extra else [2]
        assert f"Sweep mine: {len(seeds)} run(s), 0 already done, {len(seeds)} to run" in out.output
        assert [line.split("seed ")[1].split(":")[0] for line in out.output.splitlines()
                if " tiny_cil vanilla seed " in line] == [str(s) for s in seeds]


def test_a_seed_that_yaml_reads_as_a_bool_or_a_string_is_refused(tmp_path):
    for seeds, got in (([True], "(got True)"), (["1"], "(got '1')")):
        out = invoke("sweep", str(_sweep(tmp_path, {"seeds": seeds, "runs": [{"protocol": "tiny_cil",
                                                                             "methods": ["vanilla"]}]})), "--dry-run")
        assert out.exit_code == 2 and f"seeds.0: Input should be a valid integer {got}" in out.output, out.output
