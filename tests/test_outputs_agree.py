"""Every output says the same thing: the tables name a run's identity as the CSV does, the joint row has one
settings label everywhere, #P names vanilla's paper readings only on the paper's protocols, the power note
never reads as a contradiction of a significant p, FWT takes a column only where it can differ from 0, a
notebook run shows its progress, and MLflow holds the loss and per-task curves on the accuracy curves' axis."""

from __future__ import annotations

import inspect
import io
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from results_factory import joint_run, two_session_run
from tqdm.auto import tqdm

from bench_stability_gap.harness import api
from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.progress_bar import PlainBar, progress_bar
from bench_stability_gap.harness.results.catalog import METRICS
from bench_stability_gap.harness.results.schema import RunResult, save_result
from bench_stability_gap.harness.results.tracking import _final_metrics
from bench_stability_gap.harness.results.uncertainty import Interval, Paired, against_baseline, paired_power
from bench_stability_gap.harness.spec.protocol import load_protocol
from bench_stability_gap.leaderboard.aggregate import (COLUMN_BY_KEY, COLUMNS, JOINT_ROW, format_table,
                                                       paired_text, summarize, table_columns)
from bench_stability_gap.leaderboard.sources import load_folder
from bench_stability_gap.methods.configs import joint_settings

KERNELS = "gemm1x1+dw-small+adamw-fused"
CPU = {"device": "cpu", "torch_threads": 1, "cpu_kernels": KERNELS, "precision": "fp32"}


def _write(root: Path, protocol: str | None = None, config: dict | None = None) -> Path:
    """vanilla on seeds 0-1 and their joint runs; stamped as the built-in ``protocol`` (its hash and joint
    settings, so the board ranks them) when one is named, else the hand protocol."""
    spec = load_protocol(protocol) if protocol else None
    for seed in (0, 1):
        for run in (joint_run(f"j{seed}", seed), two_session_run(f"v{seed}", seed=seed, lift=0.01 * seed)):
            update: dict = {"options": CPU}
            if spec is not None:
                update["protocol"] = run.protocol.model_copy(update={"name": spec.name, "hash": spec.spec_hash,
                                                                     "version": spec.version})
                update["config"] = joint_settings(spec) if run.is_reference else dict(config or {})
            elif not run.is_reference:
                update["config"] = dict(config or {})
            save_result(root, run.model_copy(update=update))
    return root


def _table(root: Path, fmt: str, columns: str | None = None) -> str:
    args = ["leaderboard", "table", "--results-dir", str(root), "--format", fmt]
    out = CliRunner().invoke(main, args + (["--columns", columns] if columns else []))
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.parametrize("fmt", ["markdown", "text", "latex"])
def test_every_table_format_names_the_run_identity(tmp_path: Path, fmt: str) -> None:
    # the CSV's identity fields of these runs: fp32, defaults, 1 thread, the kernel set, arithmetic unrecorded
    out = _table(_write(tmp_path), fmt)
    identity = next(line for line in out.splitlines() if "kernels" in line)
    for field in ("fp32", "1 thread", f"kernels {KERNELS}", "arithmetic unrecorded"):
        assert field.replace("_", r"\_") in identity, (field, identity)
    vanilla = next(line for line in out.splitlines() if line.lstrip("| ").startswith("vanilla"))
    assert "defaults" in vanilla  # settings can differ per row: each row names its own


@pytest.mark.parametrize("fmt", ["markdown", "text", "latex"])
def test_the_joint_row_has_the_csv_label(tmp_path: Path, fmt: str) -> None:
    root = _write(tmp_path)
    csv = _table(root, "csv").splitlines()
    cols = csv[0].split(",")
    joint_settings_csv = {r.split(",")[cols.index("settings")] for r in csv[1:] if ",joint," in r}
    assert joint_settings_csv == {"defaults"}
    out = _table(root, fmt)
    assert "protocol's joint" not in out
    joint = next(line for line in out.splitlines() if JOINT_ROW in line)
    assert "defaults" in joint


def test_params_names_vanillas_readings_only_on_the_papers_protocols(tmp_path: Path) -> None:
    full = {"pointwise": "trained"}
    embedded = _table(_write(tmp_path / "tiny", "tiny_cil", full), "markdown")
    assert "| vanilla |" in embedded and "full fine-tuning" not in embedded
    paper = _table(_write(tmp_path / "paper", "cil_places_lt", full), "markdown")
    assert "(text: full fine-tuning)" in next(x for x in paper.splitlines() if x.startswith("| vanilla |"))


def test_the_power_note_states_the_power_at_the_seeds_at_hand() -> None:
    paired = Paired(0.044, Interval(0.019, 0.070), (0, 1, 2), p=0.018, p_holm=0.018, needed=4, power=0.7549)
    text = paired_text(paired, COLUMN_BY_KEY["CK_delta"], 3)
    assert text == "+0.044 [+0.019, +0.070] p=0.018, power 0.75 at 3 seeds"  # 0.7549 shown as 0.75: never rounded up
    # on a board: differences 1, 2, 3 (mean 2, sd 1: effect 2) over 3 seeds, one row compared (level 0.05)
    (row,) = against_baseline({"m": {0: 1.0, 1: 2.0, 2: 3.0}}, {0: 0.0, 1: 0.0, 2: 0.0}).values()
    assert row is not None and row.power == pytest.approx(paired_power(2.0, 3))
    # the noncentral t with 2 degrees of freedom and noncentrality 2·√3 = 3.46 against t(2, 0.975) = 4.30: under
    # half its mass lies beyond, so 3 pairs at effect 2 fall well short of 80 % (p 0.074 here: n.s.)
    assert 0.4 < row.power < 0.5 and row.inconclusive
    shown = paired_text(row, COLUMN_BY_KEY["CK_delta"], 3)
    assert f"power {math.floor(row.power * 100) / 100:.2f} at 3 seeds" in shown and "needs" not in shown
    # enough power already: no note at all
    (strong,) = against_baseline({"m": {0: 1.0, 1: 1.01, 2: 0.99, 3: 1.0}}, {s: 0.0 for s in range(4)}).values()
    assert strong is not None and "power" not in paired_text(strong, COLUMN_BY_KEY["CK_delta"], 4)


def test_fwt_takes_a_column_only_where_it_can_differ_from_zero(tmp_path: Path) -> None:
    # tiny_cil: class-incremental with a grown head (no units for classes still to come): FWT is 0 by
    # construction; cil_places_lt keeps the published model's full head, so a future class can be predicted
    grown = _table(_write(tmp_path / "tiny", "tiny_cil"), "markdown", "fwt")
    assert "| vanilla |" in grown
    full = _table(_write(tmp_path / "paper", "cil_places_lt"), "markdown", "fwt")
    assert any(x.startswith("| method") and "FWT" in x for x in full.splitlines())
    assert not any(x.startswith("| method") and "FWT" in x for x in grown.splitlines())
    entries = load_folder(tmp_path / "tiny").entries + load_folder(tmp_path / "paper").entries
    boards = {b.name: b for b in summarize(entries)}
    assert not boards["tiny_cil"].forward_transfer and boards["cil_places_lt"].forward_transfer
    latex = _table(tmp_path / "tiny", "latex", "fwt").splitlines()
    header = next(x for x in latex if x.startswith("Method &"))
    assert "FWT" not in header and "% FWT is left out where it is 0 by construction" in "\n".join(latex)
    assert METRICS["fwt"] in table_columns(["fwt"]) and METRICS["fwt"] not in COLUMNS
    for name, shown in (("tiny", False), ("paper", True)):  # the site's tables: the same rule
        out = CliRunner().invoke(main, ["leaderboard", "build", "--results-dir", str(tmp_path / name),
                                        "--out", str(tmp_path / f"site-{name}")])
        assert out.exit_code == 0, out.output
        index = (tmp_path / f"site-{name}" / "index.html").read_text()
        assert ('data-col="fwt"' in index) is shown, name


def test_api_run_shows_progress_unless_asked_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    assert inspect.signature(api.run).parameters["progress"].default is True
    kernel = SimpleNamespace(config={"IPKernelApp": {}})  # what IPython's get_ipython() is in a Jupyter kernel
    monkeypatch.setitem(sys.modules, "IPython", SimpleNamespace(get_ipython=lambda: kernel))
    bar = progress_bar(True, total=3, file=io.StringIO())  # a notebook's stderr is no terminal
    assert isinstance(bar, tqdm) and not isinstance(bar, PlainBar) and not bar.disable
    bar.close()
    assert progress_bar(False, total=3, file=io.StringIO()).disable
    monkeypatch.setitem(sys.modules, "IPython", SimpleNamespace(get_ipython=lambda: None))  # plain Python
    assert isinstance(progress_bar(True, total=3, file=io.StringIO()), PlainBar)


def test_mlflow_logs_loss_and_per_task_accuracy_on_the_accuracy_axis() -> None:
    run = two_session_run()
    curves = [run.curves[0].model_copy(update={"loss": [4.0, 3.0, 2.0, 1.0]}),
              run.curves[1].model_copy(update={"loss": [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]})]
    run = RunResult.model_validate({**run.model_dump(), "curves": [c.model_dump() for c in curves]})
    for live in (False, True):  # a live run logged old/new/all as it went; the rest is logged at its end
        metrics = _final_metrics(run, with_curves=not live)
        by_key: dict[str, list[tuple[int, float]]] = {}
        for m in metrics:
            by_key.setdefault(m.key, []).append((m.step, m.value))
        # session 2: U=4, points at updates 0, 2, 4 (steps 0, 2, 4); session 3: U=6, starts at step 4, points 0, 3
        if not live:
            assert by_key["acc_old"] == [(0, 0.9), (2, 0.5), (4, 0.8), (7, 0.6)]
        assert by_key["acc_task_1"] == [(0, 0.9), (2, 0.5), (4, 0.8), (7, 0.65)]
        assert by_key["acc_task_2"] == [(0, 0.0), (2, 0.6), (4, 0.7), (7, 0.55)]
        assert by_key["acc_task_3"] == [(7, 0.9)]
        assert by_key["session_start_acc_task_3"] == [(4, 0.1)]
        # the loss of the k-th update of a session at the step its update count reaches k
        assert by_key["loss"] == [(1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0),
                                  (5, 6.0), (6, 5.0), (7, 4.0), (8, 3.0), (9, 2.0), (10, 1.0)]
