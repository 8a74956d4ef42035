"""A sweep: tuned first where its rows ask, planned against the stored runs, its stages run locally or on Ray,
and its table."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BenchError
from ..results.read_once import reading_once
from ..results.schema import RunResult
from .execute import Echo, Summary, Tracking, execute, quiet
from .options import offline_unless, run_options
from .requests import SweepRequest
from .results import load_results
from .running import mirror_found

if TYPE_CHECKING:
    import pandas as pd  # loaded where a frame is made

    from ...leaderboard.aggregate import TableFormat as SweepTableFormat
    from ..run.options import RunOptions
    from ..run.workbench import Workbench
    from ..sweep.plan import PlannedRun, Sweep
    from ..sweep.progress import ProgressBoard, TaskState
    from ..sweep.ray_executor import RayPlan
    from ..sweep.stages import Stage

def tune_first(spec: Sweep, options: RunOptions, ray_plan: RayPlan | None = None, *, dry_run: bool = False,
               echo: Echo = quiet) -> bool:
    """Tune each method of the sweep's ``tuned: true`` rows under its protocol's ruleset where no tuned
    entry exists yet (every ruleset, validation split and search space checked first). A dry run lists
    them instead and returns False when any is missing (its rows cannot be planned yet)."""
    from ..results.tuned import has_entry
    from ..spec.protocol import load_protocol
    from ..sweep.plan import tuned_cells
    from ..sweep.tuning import ensure_tuned, ruleset, search_space

    cells = [(load_protocol(p), m) for p, m in tuned_cells(spec)]
    for protocol, method in cells:
        ruleset(protocol, None, None), protocol.tuning_view(), search_space(method, protocol)
    missing = [(p, m) for p, m in cells if not has_entry(options.results_dir, p, m)]
    for protocol, method in missing:
        trials = ruleset(protocol, None, None).trials
        if dry_run:
            echo(f"  to tune first: {method} on {protocol.name} ({trials} trials)")
            continue
        echo(f"\nTuning {method} on {protocol.name} ({trials} trials on its validation split) before its tuned rows")
        ensure_tuned(protocol, method, dataclasses.replace(options, progress=False), ray_plan, echo)
    return not (dry_run and missing)


def plan_sweep(spec: Sweep, seeds: list[int] | None, options: RunOptions, ray_plan: RayPlan | None = None, *,
               dry_run: bool = False, echo: Echo = quiet) -> list[PlannedRun] | None:
    """The sweep's runs, tuned first where its rows ask, each marked done when a stored result covers it
    in the precision, device and kernel set ``options`` give (a bf16 run on CUDA is not covered by an fp32
    one); None for a dry run whose tuned rows are not tuned yet."""
    from ..sweep.plan import plan, todo_note
    from ..tools.preflight import check_backbone

    if not tune_first(spec, options, ray_plan, dry_run=dry_run, echo=echo):
        return None
    runs = plan(spec, options.results_dir, seeds, options)  # builds every method: names and settings checked
    todo = [r for r in runs if r.done is None]
    if not dry_run:
        for protocol in {r.protocol.spec_hash: r.protocol for r in todo}.values():
            check_backbone(protocol)
    echo(f"Sweep {spec.name}: {len(runs)} run(s), {len(runs) - len(todo)} already done, {len(todo)} to run; "
         f"results in {options.results_dir}")
    for i, r in enumerate(runs, 1):
        if r.done is not None or dry_run:
            echo(f"  [{i}/{len(runs)}] {r.label}: " + (f"done ({r.done})" if r.done else todo_note(r, options)))
    return runs


@dataclass
class SweepOutcome:
    runs: list[PlannedRun]  # done ones included
    states: dict[str, TaskState] = field(default_factory=dict)  # Ray: each task's final state
    hung: list[str] = field(default_factory=list)  # local: the runs stopped past their hook time limit (labels)

    def hung_error(self) -> BenchError | None:
        """The one paragraph a sweep ends with when some of its runs hung (None: none did)."""
        if not self.hung:
            return None
        return BenchError(f"{len(self.hung)} run(s) of the sweep did not finish: a call into the method ran past its "
                          f"time limit ({'; '.join(self.hung)}; each one's paragraph is above). The sweep's other "
                          f"runs finished; running the same command again retries the stopped ones, each from its "
                          f"last checkpoint.")

    @property
    def failed(self) -> list[TaskState]:
        return [t for t in self.states.values() if t.status in ("failed", "skipped")]


def run_sweep(request: SweepRequest, options: RunOptions, *, ray_plan: RayPlan | None = None, echo: Echo = quiet,
              summary: Summary | None = None) -> SweepOutcome:
    """The one orchestration of a sweep (``bench sweep`` and ``sweep``): tune first where asked, plan
    against the runs ``options`` make, then the stages still to go, locally or on Ray (``ray_plan``). A
    dry run only plans (no run at all when its tuned rows are not tuned yet)."""
    from ..sweep.stages import stage_graph

    tracking, dry_run = request.tracking, request.dry_run
    with reading_once():
        runs = plan_sweep(request.spec, request.seeds, options, ray_plan, dry_run=dry_run, echo=echo)
        if runs is None or dry_run:
            return SweepOutcome(runs or [])
        if tracking.mlflow:
            _mirror_done(runs, options.results_dir, tracking.uri, echo)
        graph = stage_graph(runs, options.results_dir, options)
        options = dataclasses.replace(options, reuse_stored=True)  # planned as missing: a concurrent sweep's is reused
        shared = sum(stage.kind != "run" for stage in graph)
        echo(f"{len(graph)} stage(s) to go, counted [i/{len(graph)}] below: {len(graph) - shared} method run(s) "
             f"and {shared} shared stage(s) (deployed models, joint references, the A_best reference runs, which "
             f"include the sweep's runs of those methods).")
        if ray_plan is None:
            hung = run_local_sweep(graph, options, tracking, echo=echo, summary=summary)
            return SweepOutcome(runs, hung=hung)
    from ..sweep.ray_executor import run_ray

    return SweepOutcome(runs, run_ray(graph, options, ray_plan, tracking.uri, tracking.mlflow, echo))


def _mirror_done(runs: list[PlannedRun], results_dir: Path, tracking_uri: str | None, echo: Echo) -> None:
    """The MLflow records of the sweep's rows that are done, made where the store lacks a complete one, as
    ``bench run`` makes a found run's: a sweep run again after one made without MLflow completes them."""
    from ..results.schema import load_result

    for r in runs:
        if r.done is not None:
            mirror_found(load_result(r.done), r.done, results_dir, tracking_uri, r.protocol, echo)


def run_local_sweep(graph: list[Stage], options: RunOptions, tracking: Tracking = Tracking(), *, echo: Echo = quiet,
                    summary: Summary | None = None) -> list[str]:
    """Every stage of a sweep's graph in this process, one workbench per protocol spec and seed: shared
    stages (joint, A_best references) once, then each method run as ``execute`` does it (live MLflow run
    included); every result a shared stage stores is mirrored as ``sweep.mirror.mirror`` mirrors all.
    Returns the labels of the method runs stopped past their hook time limit (the sweep went on)."""
    from ..sweep.mirror import mirror
    from ..sweep.progress import ProgressBoard
    from ..sweep.stages import run_local

    board = ProgressBoard({stage.key: stage.label for stage in graph}, work={stage.key: stage.work for stage in graph})
    before: list[Stage] = []  # the stage running, marked done when the next one starts
    hung: dict[str, str] = {}  # stage key -> label of its run, stopped past its hook time limit

    def start(stage: Stage) -> None:
        if before:
            done = before.pop()
            board.finished(done.key, "failed" if done.key in hung else "done")
        board.started(stage.key, "local")
        before.append(stage)
        echo(f"\n[{graph.index(stage) + 1}/{len(graph)}] {stage.label}  ({sweep_status(board)})")

    def method_run(stage: Stage, bench: Workbench) -> None:
        execute(stage.protocol, stage.method, stage.seed, dataclasses.replace(options, overrides=dict(stage.overrides)),
                tracking, tuned=stage.tuned, bench=bench, echo=echo, summary=summary)

    def stored(stage: Stage, made: list[tuple[RunResult, Path]]) -> None:  # a shared stage's results
        for result, path in made:
            if summary:
                summary(result, path)
            if tracking.mlflow:
                rid, uri = mirror(result, path, options.results_dir, tracking.uri, stage.protocol)
                echo(f"  MLflow run {rid} in {uri}")

    def stopped(stage: Stage, fault: Exception) -> None:  # the sweep goes on with its other runs
        hung[stage.key] = stage.label
        echo(f"Error: {fault} The sweep goes on with its other runs.")

    run_local(graph, options, start, method_run, stored, stopped)
    if before:
        done = before.pop()
        board.finished(done.key, "failed" if done.key in hung else "done")
    echo(f"\nSweep finished: {sweep_status(board)}")
    return list(hung.values())


def sweep_status(board: ProgressBoard) -> str:
    """Where a local sweep stands, in stages (the unit its [i/N] counts): done, elapsed, ETA."""
    from ..progress_bar import duration
    from ..sweep.progress import count, eta_seconds

    states = board.snapshot()
    eta = eta_seconds(states, board.work)
    return (f"{count(states, 'done')}/{len(states)} stages done, elapsed {duration(board.clock() - board.begun)}, "
            f"ETA {'-' if eta is None else duration(eta)}")


def sweep(sweep: str, seeds: list[int] | None = None, *, results_dir: str | Path | None = None,
          device: str = "auto", precision: str | None = None, mlflow: bool = True, tracking_uri: str | None = None,
          progress: bool = False, trunk_cache: bool = True, allow_download: bool = False,
          cpu_kernels: str = "fast") -> pd.DataFrame:
    """Run a sweep (a built-in name or a YAML grid of protocols x methods x seeds) in this process, as
    ``bench sweep`` does with the local executor: rows with ``tuned: true`` are tuned first where needed,
    and runs already stored in the precision these runs compute in are skipped. Returns ``load_results``
    of the results folder, restricted to the sweep's runs (one row per run). The process gets its CPU
    settings back afterwards, as after ``run``."""
    from ..model.compute import cpu_settings_restored

    offline_unless(allow_download)
    request = SweepRequest.checked(sweep, seeds, results_dir, Tracking(tracking_uri, mlflow))
    options = run_options(results_dir, device, precision=precision, cpu_kernels=cpu_kernels, trunk_cache=trunk_cache,
                          progress=progress, allow_download=allow_download)
    with cpu_settings_restored():
        outcome = run_sweep(request, options)
    if (hung := outcome.hung_error()) is not None:
        raise hung
    frame = load_results(options.results_dir)
    wanted = {(r.protocol.name, r.row, r.seed) for r in outcome.runs}
    keep = [(p, m, s) in wanted for p, m, s in zip(frame["protocol"], frame["method"], frame["seed"])]
    return frame[keep].reset_index(drop=True)


def sweep_table(spec: Sweep, runs: Iterable[PlannedRun], results_dir: Path, fmt: SweepTableFormat = "markdown",
                columns: Sequence[str] = ()) -> str:
    """The leaderboard's mean ± std table restricted to this sweep's protocols, rows and seeds (with their
    joint references), in ``fmt`` (``brief``: the gaps and the paired difference in 120 columns; else a
    format of ``bench leaderboard table``, with ``columns`` as its --columns keys)."""
    from ...leaderboard.aggregate import format_table, summarize, table_columns
    from ...leaderboard.sources import load_folder

    runs = list(runs)
    wanted = {(r.protocol.name, r.row, r.seed) for r in runs}
    seeds, names = {r.seed for r in runs}, {r.protocol.name for r in runs}
    # the references its rows were scored with come along: the A_best reference set, and the joint runs
    # (a NAME@Kx budget's are NAME's, shared by the family)
    references = {(r.protocol.name, m) for r in runs for m in r.protocol.best_new_reference}
    joints = {(p.name, "joint") for r in runs for p in (r.protocol, r.protocol.reference)}
    entries = [e for e in load_folder(results_dir).entries
               if (e.result.protocol.name, e.result.label, e.result.seed) in wanted
               or (e.result.seed in seeds and (e.result.protocol.name, "joint" if e.is_reference else e.result.label)
                   in references | joints)]
    header = f"Sweep {spec.name}: seeds {', '.join(map(str, sorted(seeds)))}\n\n"
    if fmt == "markdown":
        header = "## " + header
    boards = [b for b in summarize(entries) if b.name in names]  # not NAME's own board
    table = format_table(boards, fmt, table_columns(columns))
    if fmt in ("latex", "json"):  # machine-read: the table alone
        return table
    return header + (spec.description.strip() + "\n\n" if spec.description and fmt != "brief" else "") + table
