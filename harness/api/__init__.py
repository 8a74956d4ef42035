"""bench from Python: ``run`` one method, ``sweep`` a grid, ``tune`` a method's settings, ``load_results`` of a
folder as a pandas frame, the leaderboard's ``table`` and ``reproduce`` a stored run.

The command line is a thin layer on this package: ``bench run``, ``bench sweep`` and ``bench tune`` parse
their options into the requests of ``api.requests`` and call the same functions as these (the CLI parses
and prints; the checks, the run, its MLflow mirror, the predictions file and the reference runs' mirrors
happen here), so a notebook gets exactly the result the command line stores::

    from bench_stability_gap.harness.api import load_results, run

    result = run("tiny_cil", "vanilla+sgm", seed=0, results_dir="bench-results", lr=0.0005)
    frame = load_results("bench-results")   # one row per run, every metric

The modules: ``checks`` (argument kinds), ``options`` (``run_options``), ``running`` (one run's request and
answer), ``execute`` (running a checked request: tracking, mirroring, predictions), ``tuning``, ``sweeping``
and ``results`` (the stored runs read). See docs/python-api.md for a worked example.
"""

from __future__ import annotations

from .options import run_options
from .results import LOAD_COLUMNS, TABLE_FORMATS, load_results, reproduce, results_columns, table
from .running import run
from .sweeping import plan_sweep, sweep, sweep_table
from .tuning import tune

__all__ = ["LOAD_COLUMNS", "TABLE_FORMATS", "load_results", "plan_sweep", "reproduce", "results_columns", "run",
           "run_options", "sweep", "sweep_table", "table", "tune"]
