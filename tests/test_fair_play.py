"""Fair play: cheating plugins, installed as a plugin author would ship them (a fake dist-info, as
tests/test_plugins.py does for the example), are each caught with exit 2 and a message naming the
method and the rule, or provably cannot change any number (rewinding the generator a method is lent).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.methods.registry import build_method
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.methods.base import MethodConfig, StandardMethod
from support import install_folder, invoke, small_protocol

CHEATS = Path(__file__).parent / "plugin_cheats"


@pytest.fixture()
def cheats_installed(site, monkeypatch):
    return install_folder(site, CHEATS, monkeypatch)


# each cheat, the words its error must contain (the method's name is checked for all)
CAUGHT = {
    "cheat_keep_test": r"predict\(\) changed its kept.*evaluation teaches a method nothing",
    "cheat_global_test": r"predict\(\) changed bench_cheat_plugin\.STASH.*evaluation teaches a method nothing",
    "cheat_stream_test": r"asked ctx\.stream for 'test'.*test split is the harness's alone",
    "cheat_adapt_in_predict": r"predict\(\) changed its model\..*bn\d\.num_batches_tracked.*more\) while being evaluated.*evaluation teaches a method nothing",
    "cheat_private_ids": r"asked ctx\.inputs for sample id\(s\).*neither in the rehearsal memory nor in the session",
    "cheat_private_data": r"keeps \d+ samples' worth of input data outside the rehearsal memory.*hoard.*storage cap is 40",
    "cheat_lossy_state": r"state round-trip.*does not give the same state back",
    "cheat_helper_stash": r"predict\(\) changed bench_cheat_plugin\.stash\.KEPT.*evaluation teaches a method nothing",
    "cheat_train_original": r"predict\(\) changed its model\.head\.fc\.bias.*evaluation teaches a method nothing",
    "cheat_future_ids": r"failed in begin_session\(\).*assignment destination is read-only",
    "cheat_foreign_stash": r"evaluated on other test images, it trained differently.*evaluation teaches a method nothing",
}


@pytest.mark.parametrize("name", sorted(CAUGHT))
def test_check_method_catches_each_cheat_with_exit_2_naming_method_and_rule(name, cheats_installed, check_benches_once):
    out = invoke("check-method", name)
    assert out.exit_code == 2, out.output
    assert f"Method {name!r} fails the contract" in out.output
    assert re.search(CAUGHT[name], " ".join(out.output.split()), re.S), out.output
    assert "Traceback" not in out.output


def test_a_real_run_refuses_a_method_that_keeps_test_inputs(cheats_installed, tmp_path, bench_cache):
    common = ("--protocol", str(small_protocol(tmp_path)), "--results-dir", str(tmp_path / "results"), "--no-mlflow",
              "--no-progress")
    out = invoke("run", "--method", "cheat_keep_test", *common)
    assert out.exit_code == 2 and "'cheat_keep_test'" in out.output and "evaluation teaches a method nothing" in out.output
    assert not [p for p in (tmp_path / "results").rglob("*.json") if "cheat" in str(p)]  # nothing ranked


class Recorder(StandardMethod):
    """Vanilla rehearsal that records the batch ids the harness gives it."""

    name = "recorder"

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.seen_ids: list[list[int]] = []

    def observe(self, batch):
        self.seen_ids.append([int(i) for i in batch.ids])
        return super().observe(batch)


def test_rewinding_the_lent_generator_changes_no_batch_and_no_number(cheats_installed, capped_workbench, tmp_path):
    options = RunOptions(results_dir=tmp_path, progress=False, log=False)
    bench = capped_workbench
    _, cheat = build_method("cheat_rewind_rng", bench.protocol.name)
    cheat_curves, cheat_budget, _ = run_cl(bench, cheat, 0, options)
    honest = Recorder(MethodConfig(**cheat.config.model_dump()))
    curves, budget, _ = run_cl(bench, honest, 0, options)
    assert cheat.seen_ids == honest.seen_ids  # the memory batches are the harness's draws, not the method's
    assert len({tuple(ids[8:]) for ids in cheat.seen_ids}) > 1  # and they do vary from update to update
    assert cheat_curves == curves and cheat_budget == budget
    # the lent context leads to no harness generator: the memory is a read-only view
    assert not hasattr(cheat.ctx.memory, "rng") and cheat.ctx.rng is not None


@pytest.mark.slow  # a whole check-method run; the built-ins' contract is in tests/test_contract.py's fast tier
def test_built_ins_pass_check_method(check_benches_once):
    out = invoke("check-method", "vanilla")
    assert out.exit_code == 0, out.output
    assert out.output.count("PASS") == 7 and "vanilla: passes the contract." in out.output


def test_the_projects_contract_suite_never_collects_an_installed_plugin(cheats_installed):
    from tests.test_contract import _base_names

    names = _base_names()
    assert "vanilla" in names and not any(n.startswith("cheat_") for n in names)
