"""Inert losses are caught: ``bench check-method`` fails, naming the loss term and the modifier, when a
modifier leaves a term of the method's loss without a gradient on anything that trains."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.run.workbench import RunOptions
from bench_stability_gap.harness.spec.protocol import Protocol
from bench_stability_gap.harness.tools.check_method import capped_spec
from bench_stability_gap.harness.tools.loss_terms import check_loss_terms, live_terms
from bench_stability_gap.methods.registry import build_method
from support import install_folder

EWC = Path(__file__).parent / "plugin_ewc"


@pytest.fixture()
def ewc_installed(site, monkeypatch):
    return install_folder(site, EWC, monkeypatch)


def test_the_ewc_penalty_trains_alone_and_is_inert_under_sgm(ewc_installed, capped_workbench, tmp_path):
    capped = capped_workbench
    options = RunOptions(results_dir=tmp_path, progress=False, log=False)
    assert check_loss_terms(capped, "ewc_fixture", {}, 0, options) == \
        "every term reaches a trainable parameter: cross_entropy, ewc_penalty"
    assert "every term reaches" in check_loss_terms(capped, "vanilla+sgm", {}, 0, options)
    with pytest.raises(BenchError, match=r"loss term 'ewc_penalty' gets no gradient .* under modifier sgm \(it "
                                         r"does without\)"):
        check_loss_terms(capped, "ewc_fixture+sgm", {}, 0, options)


@pytest.mark.slow  # two more probe runs
def test_lora_alone_and_old_class_freezing_alone_each_leave_part_of_the_penalty_training(ewc_installed,
                                                                                        capped_workbench, tmp_path):
    capped = capped_workbench
    options = RunOptions(results_dir=tmp_path, progress=False, log=False)
    assert live_terms(capped, "ewc_fixture+sgm", {}, 0, options) == {"cross_entropy": True, "ewc_penalty": False}
    assert live_terms(capped, "ewc_fixture+lora", {}, 0, options)["ewc_penalty"]  # the head's anchored rows train
    assert live_terms(capped, "ewc_fixture+oocf", {}, 0, options)["ewc_penalty"]  # the body trains


@pytest.mark.slow  # two whole check-method runs (about 2 minutes on 2 shared cores)
def test_check_method_exits_2_naming_the_inert_term_and_passes_the_plugin_alone(ewc_installed,
                                                                                   check_benches_once):
    bad = CliRunner().invoke(main, ["check-method", "ewc_fixture+sgm"])
    assert bad.exit_code == 2, bad.output
    assert "FAIL  loss terms reach trainable parameters" in bad.output
    assert "'ewc_penalty'" in bad.output and "under modifier sgm" in bad.output
    good = CliRunner().invoke(main, ["check-method", "ewc_fixture"])
    assert good.exit_code == 0, good.output
    assert "PASS  loss terms reach trainable parameters: every term reaches a trainable parameter: " \
           "cross_entropy, ewc_penalty" in good.output


def test_a_method_that_declares_its_modifiers_refuses_the_others(ewc_installed, monkeypatch):
    from bench_ewc_plugin import EWCFixture

    monkeypatch.setattr(EWCFixture, "compatible_modifiers", ("lora",))
    build_method("ewc_fixture+lora", Protocol.model_validate(capped_spec()))
    with pytest.raises(BenchError, match=r"'ewc_fixture' declares that it works with the modifiers lora only.*"
                                         r"cannot take sgm"):
        build_method("ewc_fixture+sgm", Protocol.model_validate(capped_spec()))
