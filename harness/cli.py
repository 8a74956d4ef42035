"""The ``bench`` command line. Bad input -> one clear paragraph on stderr and exit code 2."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..leaderboard.cli import results_dir_option
from .errors import BenchError, only_with, shorten, stop_note

if TYPE_CHECKING:
    from ..leaderboard.aggregate import TableFormat as SweepFormat

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# OpenMP threads that spin while waiting make torch 10-20x slower as soon as two processes share the
# cores (several seeds at once, a test suite beside a run); sleeping waiters cost ~nothing when alone.
# Must be set before torch is imported; a user's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# No hub access without --allow-download: huggingface_hub reads HF_HUB_OFFLINE once, when it is first
# imported (by timm), so the flag must be in the environment before anything imports it.
if "--allow-download" not in sys.argv[1:]:
    os.environ["HF_HUB_OFFLINE"] = "1"

from .spec.protocol import DEFAULT_PROTOCOL  # noqa: E402 - after the environment set-up above

DEFAULT_METHOD = "vanilla"


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or `kill`'s stop): handled as Ctrl-C is, so both end the same way."""


def _on_sigterm(signum: int, frame) -> None:
    raise Terminated()


def _end_now(code: int, wait_for_threads: bool = False) -> None:
    """End this process at once, whatever ended its command: only the atexit handlers run (multiprocessing's
    reaps the loader's worker processes; MLflow's and logging's flush), not the interpreter's teardown of
    every module and object, which writes nothing (every file is written atomically, and a stop has unwound
    past each write). With torch, torchvision and timm loaded the teardown is about 1 s of CPU at the end of
    every command, and it took most of the 5-20 s a stop took to exit on a loaded machine.
    ``wait_for_threads``: first join the threads still running that are not daemons, as a normal exit does
    (a finished command; a stopped one ends them with the process)."""
    import atexit
    import threading

    _flush()
    try:
        if wait_for_threads:
            for thread in threading.enumerate():
                if thread is not threading.current_thread() and not thread.daemon:
                    thread.join()
        atexit._run_exitfuncs()  # what a normal exit runs first; threads left running end with the process
    finally:
        _flush()
        os._exit(code)


def _flush() -> None:
    """Flush stdout and stderr; a reader that has gone (``bench ls | head``) loses the rest, as at any exit."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _exit_code(code: object) -> int:
    """The status ``sys.exit(code)`` gives the process: None is 0, a message is printed and is 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


DRY_RUN = "bench.dry_run"  # ctx.meta key: the command only lists what it would do
DRY_INTERRUPTED = "Interrupted: a dry run trains and writes nothing, so there is nothing to resume."


class BenchGroup(click.Group):
    """Turns BenchError into a one-paragraph message and its exit code (2 for bad input, 75 for a storage
    fault; never a traceback), and SIGTERM into what Ctrl-C does."""

    whole_process = False  # invoked as the process's own command line (the bench script, python -m)

    def main(self, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        # no args: the command line of this very process, which a stop may end at once (a caller in
        # Python, click's test runner included, passes its own and gets the exit as an exception)
        self.whole_process = args is None
        return super().main(args, *rest, **kwargs)

    def invoke(self, ctx: click.Context):
        import signal

        from .atomic import StorageFault, fault_message, storage_error
        from .run.stopped import forget_stored

        forget_stored()  # the stop notes name what this command stored
        before = signal.getsignal(signal.SIGTERM)
        if before is signal.SIG_DFL:  # never over a handler someone installed on purpose
            signal.signal(signal.SIGTERM, _on_sigterm)
        try:
            return super().invoke(ctx)
        except BenchError as err:
            click.secho(f"Error: {shorten(str(err))}", err=True, fg="red")
            ctx.exit(err.exit_code)
        except click.ClickException as err:  # a usage error echoes the value given: cut, as ours are
            # click marks message Final (its __init__ sets it); it is read only when the error is shown
            err.message = shorten(err.message)  # type: ignore[misc]
            raise
        except KeyboardInterrupt as stop:  # the stage it stopped in noted what is on disk (run.stopped)
            from .run.stopped import interrupted

            note = stop_note(stop) or (DRY_INTERRUPTED if ctx.meta.get(DRY_RUN) else interrupted())
            click.echo(f"\n{note}", err=True)
            code = 143 if isinstance(stop, Terminated) else 130
            if self.whole_process:
                _end_now(code)
            ctx.exit(code)
        except Exception as exc:  # a write outside the atomic path (a cache shard, a library's file)
            fault = storage_error(exc)
            if fault is None:
                raise
            message = fault_message(fault, "a file", None, "Stored results and checkpoints are kept.")
            click.secho(f"Error: {shorten(message)}", err=True, fg="red")
            ctx.exit(StorageFault.exit_code)
        finally:
            if before is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, before)


@click.group(cls=BenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="bench-stability-gap")
def main() -> None:
    """bench: measure the stability gap of continual learners under identical budgets."""


def print_summary(result, path: Path) -> None:
    for line in summary_lines(result, path):
        click.echo(line)


def summary_lines(result, path: Path | str) -> list[str]:
    """The table a run prints when it ends, from its stored result alone (the README's sample is rendered
    by this from a stored run, so the two cannot differ)."""
    from .results.schema import row_label

    m = result.metrics
    stages = "".join(f", {'GPU ' if gpu else ''}{stage} {v:.0f} s" for stage, v, gpu in result.stage_times())
    from .results.schema import identity_text

    # the row label names --set overrides or the tuning ruleset: which variant of the method this was; then what
    # else names its board (precision, how its settings were chosen, the CPU's threads and kernels)
    lines = [f"\n{result.protocol.name} | {row_label(result.method.spec, result.overrides, result.tuned)} | "
             f"seed {result.seed} | {identity_text(result)} | {result.wall_time_s:.1f} s{stages} | result: {path}"]
    if result.status != "complete":
        lines.append(f"  status {result.status}: the curves so far are stored; the run is never ranked nor used as a "
                     f"reference ({len(result.curves)} session(s) recorded)")
        return lines
    if m is None:
        lines.append("joint reference (A_joint per session):")
        lines.append(f"  {'session':>7} {'old':>7} {'new':>7} {'all':>7}")
        lines.extend(f"  {r.session:>7} {r.old:>7.3f} {r.new:>7.3f} {r.all:>7.3f}" for r in result.reference)
        return lines
    from .results.catalog import METRICS, SUMMARY_KEYS, format_value
    from .results.tidy import run_values

    values = run_values(result, m)
    for key in SUMMARY_KEYS:  # each row as the catalog describes it (the leaderboard's columns read it too)
        info = METRICS[key]
        lines.append(f"  {key:<9}{format_value(values[key], info):>9} {info.unit:<2} {info.arrow:<2}{info.description}")
    rec = " ".join(str(v) if v is not None else "-" for v in m.recovery_updates["99"])
    lines.append(f"  updates to recover 99% of the joint model's accuracy on the "
                 f"pre-training classes, per session: {rec}")
    b = result.budget
    if b.train_flops is not None:
        ratios = ""
        if b.updates_vs_joint is not None and b.train_flops_vs_joint is not None:
            ratios = (f"; joint needs {b.updates_vs_joint:.1f}x the updates and "
                      f"{b.train_flops_vs_joint:.1f}x the training FLOPs")
        lines.append(f"  training {b.train_flops / 1e12:.3f} TFLOPs, "
                     f"evaluation {b.eval_flops / 1e12:.3f} TFLOPs{ratios}")
    if b.train_tflops_budget is not None:  # what such a run is about: the compute it was given, the updates it bought
        spent = "-" if b.train_flops is None else f"{b.train_flops / 1e12:.3f}"
        lines.append(f"  FLOP budget {b.train_tflops_budget:g} TFLOPs per session: spent {spent} TFLOPs in "
                     f"{b.optimizer_steps} updates ({', '.join(map(str, b.updates_per_session))} per session)")
    return lines


def resource_note() -> str:
    """Peak memory of this process and the disk the caches hold: what a paper-size run must know."""
    import resource

    from .paths import bytes_under, cache_dir

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    root = cache_dir()
    disk = bytes_under(root)
    return f"  peak RSS {rss:.2f} GiB; caches on disk {disk / 2**30:.2f} GiB under {root}"


def _run_options(f):
    """The options every command that trains shares (run, sweep)."""
    for option in reversed([
        click.option("--results-dir", type=click.Path(path_type=Path), envvar="BENCH_RESULTS_DIR",
                     help="where results and the MLflow store go [default: ./bench-results]"),
        click.option("--device", default="auto", show_default=True,
                     help="auto (CUDA when torch sees a GPU, else cpu), cpu, cuda or cuda:N (N a GPU torch reports); "
                          "anything else is refused before compute"),
        click.option("--trunk-cache/--no-trunk-cache", default=True, show_default=True,
                     help="compute frozen-trunk outputs once (exact; same numbers)"),
        click.option("--progress/--no-progress", default=True, show_default=True),
        click.option("--allow-download", is_flag=True, help="let timm fetch pretrained weights from the hub"),
        click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                     help="MLflow tracking URI [default: sqlite in results dir]"),
        click.option("--no-mlflow", is_flag=True, help="write the JSON result only"),
        # resume settings reach RunOptions through the context (see _options), not every command's signature
        click.option("--gpu-decode/--no-gpu-decode", default=True, show_default=True, expose_value=False,
                     callback=_remember, help="on CUDA, decode JPEG files on the GPU (nvJPEG); the trunk cache "
                                              "keeps the two decoders' features apart"),
        click.option("--precision", type=click.Choice(["fp32", "tf32", "bf16"]), default=None, expose_value=False,
                     callback=_remember, help="arithmetic of training and evaluation: fp32 (torch 1.12's defaults, "
                                              "as the published code), tf32 (CUDA: TF32 matmuls too) or bf16 "
                                              "autocast [default: fp32 on the paper's protocols; embedded ones: "
                                              "bf16 on CUDA, fp32 on the CPU]; part of a run's identity"),
        click.option("--cpu-kernels", type=click.Choice(["fast", "stock"]), default="fast", show_default=True,
                     expose_value=False, callback=_remember,
                     help="on the CPU: the harness's faster kernels for small convolutions and a fused AdamW, "
                          "or PyTorch's own; they differ in the last bits, so the set is part of a run's "
                          "identity and runs of the two never share a row or a reference"),
        click.option("--no-wait", is_flag=True, expose_value=False, callback=_remember,
                     help="when another bench process is computing the same run (or reference) right now, exit 2 "
                          "naming it instead of waiting for it and reusing its result"),
        click.option("--restart", is_flag=True, expose_value=False, callback=_remember,
                     help="discard the stored checkpoint of this run instead of resuming from it"),
        click.option("--hook-time-limit", type=click.FloatRange(min=0, min_open=True, max=10_000_000),
                     expose_value=False, callback=_remember, metavar="SECONDS",
                     help="stop the run (exit 2, its checkpoint kept) when one call into the method (observe, "
                          "predict, a session hook) runs longer than this [default: the protocol's "
                          "hook_time_limit, else max(300 s, 100 x the run's slowest update so far)]"),
        click.option("--checkpoint-every", type=click.IntRange(min=0), expose_value=False, callback=_remember,
                     metavar="K", help="checkpoint every K updates (0: at session ends only) [default: every "
                                       "2 minutes and at session ends]"),
    ]):
        f = option(f)
    return f


def _remember(ctx: click.Context, param: click.Parameter, value: object) -> object:
    ctx.meta[f"bench.{param.name}"] = value
    return value


def _options(overrides: dict, results_dir: Path | None, device: str, trunk_cache: bool, progress: bool,
             allow_download: bool):
    """``api.run_options`` from the command's options (the resume settings through the context), the
    device it resolved to printed first."""
    from .api.options import run_options
    from .model.device import resolve_device

    chosen = resolve_device(device)
    meta = click.get_current_context().meta
    how = " (auto: " + ("a CUDA device is present)" if chosen.type == "cuda" else "torch sees no CUDA device)") \
        if device == "auto" else ""
    click.echo(f"device: {chosen}{how}", err=True)
    chosen_options = run_options(results_dir, device, precision=meta.get("bench.precision"),
                       cpu_kernels=meta.get("bench.cpu_kernels") or "fast", overrides=overrides,
                       trunk_cache=trunk_cache, progress=progress, allow_download=allow_download,
                       restart=bool(meta.get("bench.restart")), checkpoint_every=meta.get("bench.checkpoint_every"),
                       wait=not meta.get("bench.no_wait"), gpu_decode=meta.get("bench.gpu_decode", True),
                       hook_time_limit=meta.get("bench.hook_time_limit"))
    _set_imports_aside()
    return chosen_options


def _set_imports_aside() -> None:
    """In a process of its own, the objects imported so far (torch, timm, the harness: about 400,000) leave
    the cyclic collector's reach. Every full collection would walk them again and could never free one: a
    reduced tiny_cil run spent 1.8 s of its 16 s of CPU in collections. A Python caller's process keeps its
    collector as it was, since frozen objects are never freed."""
    if main.whole_process:
        import gc

        gc.freeze()


@main.command()
@click.option("--protocol", "-p", default=DEFAULT_PROTOCOL, show_default=True, help="built-in name or YAML path")
@click.option("--method", "-m", default=DEFAULT_METHOD, show_default=True, help="base(+modifier)*, e.g. vanilla+sgm")
@click.option("--seed", "-s", default=0, show_default=True, type=int)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a method setting")
@click.option("--tuned", is_flag=True, help="run the settings `bench tune` stored for METHOD on PROTOCOL "
                                            "(same --results-dir); the row is named by the tuning ruleset")
@click.option("--save-predictions", is_flag=True,
              help="also store the per-sample predictions of every eval point, in <result>.predictions.npz")
@click.option("--rerun", is_flag=True, help="train again when an identical run (same spec, method, settings, seed "
                                            "and precision) is stored already [default: report the stored one]")
@_run_options
def run(protocol: str, method: str, seed: int, overrides: tuple[str, ...], tuned: bool, save_predictions: bool,
        rerun: bool, results_dir: Path | None, device: str, trunk_cache: bool, progress: bool, allow_download: bool,
        tracking_uri: str | None, no_mlflow: bool) -> None:
    """Run METHOD on PROTOCOL (default: vanilla on the embedded tiny_cil) and print its gap metrics. With no
    --set, the method runs its published settings (methods/defaults.yaml); --tuned runs its tuned ones."""
    from .api.execute import Tracking
    from .api.requests import RunRequest
    from .api.running import answer
    from .run.announce import plan_line

    # the torch-free checks first (a refusal stays one paragraph), then what the run is about to do, then an
    # identical stored run answered from its file: all before anything imports torch (seconds when loaded)
    request = RunRequest.checked(protocol, method, seed, overrides, results_dir, Tracking(tracking_uri, not no_mlflow),
                                 tuned=tuned, rerun=rerun, save_predictions=save_predictions)
    if device not in ("auto", "cpu"):  # only torch can tell whether this device is here: ask it before announcing
        from .model.device import resolve_device

        resolve_device(device)
    click.echo(plan_line(request.protocol, method, seed, request.results_dir), err=True)
    meta = click.get_current_context().meta
    outcome = answer(request, lambda: _options(request.settings, results_dir, device, trunk_cache, progress,
                                               allow_download),
                     device, meta.get("bench.precision"), meta.get("bench.cpu_kernels") or "fast", echo=click.echo,
                     summary=print_summary)
    if outcome.reused:  # said first, before the stored run's summary
        return
    click.echo(resource_note())


@main.command()
@click.argument("sweep", required=False)
@click.option("--schema", is_flag=True, help="print the sweep file's JSON schema (every key, typed) and exit")
@click.option("--seeds", default=None, metavar="0,1,2", help="run these seeds instead of the sweep's")
@click.option("--dry-run", is_flag=True, help="list the runs (and which are already done), run nothing",
              callback=lambda ctx, _p, value: ctx.meta.__setitem__(DRY_RUN, value) or value)
@click.option("--table", "table_path", type=click.Path(path_type=Path), default=None,
              help="also write the final Markdown table to this file (never a folder, the sweep file, or a file in a "
                   "results folder or leaderboard site; checked before any run)")
@click.option("--format", "fmt", type=click.Choice(["brief", "markdown", "text", "latex", "json"]), default="brief",
              show_default=True, help="the closing table: brief (the gaps and the paired difference with vanilla in "
                                      "120 columns) or a format of bench leaderboard table")
@click.option("--columns", "extra", default=None, metavar="KEYS",
              help="markdown/text/latex/json: columns to add or remove, as bench leaderboard table --columns")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: one run after another in this process; ray: each run a Ray task (pip install '.[ray]')")
@click.option("--address", default=None, metavar="HOST:PORT",
              help="ray: join this cluster [default: start a local one sized to this machine]")
@click.option("--cpus-per-run", type=float, default=None,
              help="ray: CPUs each task reserves (a CPU run computes on the harness's "
                   "fixed thread count all the same) [default: 1]")
@click.option("--gpus-per-run", type=float, default=None,
              help="ray: GPUs each task reserves, fractions share one [default: 0]")
@click.option("--max-retries", type=int, default=None, help="ray: retries of a task whose worker died [default: 3]")
@_run_options
def sweep(sweep: str | None, schema: bool, seeds: str | None, dry_run: bool, table_path: Path | None, fmt: SweepFormat,
          extra: str | None, executor: str, address: str | None,
          cpus_per_run: float | None, gpus_per_run: float | None, max_retries: int | None, results_dir: Path | None,
          device: str, trunk_cache: bool, progress: bool, allow_download: bool, tracking_uri: str | None,
          no_mlflow: bool) -> None:
    """Run a grid of protocols x methods x seeds from SWEEP (a built-in name or a YAML file), skipping
    runs already in the results folder, then print the mean ± std table of what it covers. Shared
    prerequisites (deployed model, joint and A_best references of each seed) are built once, first.
    Protocol paths in a sweep file are read relative to the file; --schema prints what the file may hold."""
    from .api.execute import Tracking
    from .api.requests import SweepRequest
    from .api.sweeping import run_sweep, sweep_table
    from .paths import check_output_file
    from .paths import results_dir as resolve_results
    from .sweep.plan import Sweep

    if schema:
        click.echo(json.dumps(Sweep.model_json_schema(), indent=2))
        return
    if sweep is None:
        raise BenchError("bench sweep needs SWEEP: a built-in sweep's name or a sweep YAML file "
                         "(bench sweep --schema prints what the file may hold).")
    ray_plan = _ray_plan(executor, address, cpus_per_run, gpus_per_run, max_retries, device, "sweep")
    columns = _sweep_columns(fmt, extra)
    if table_path is not None:
        table_path = check_output_file(table_path, "--table", resolve_results(results_dir),
                                       [Path(sweep)] if Path(sweep).is_file() else [])
    try:
        chosen = [int(s) for s in seeds.split(",")] if seeds is not None else None  # an empty one is refused
    except ValueError:
        raise BenchError(f"--seeds {seeds!r} must be comma-separated integers, e.g. 0,1,2.") from None
    request = SweepRequest.checked(sweep, chosen, results_dir, Tracking(tracking_uri, not no_mlflow), dry_run=dry_run)
    options = _options({}, results_dir, device, trunk_cache, progress, allow_download)
    outcome = run_sweep(request, options, ray_plan=ray_plan, echo=click.echo, summary=print_summary)
    if dry_run:
        return
    spec = request.spec
    _report_ray_tasks(outcome)
    click.echo("\n" + sweep_table(spec, outcome.runs, options.results_dir, fmt, columns), nl=False)
    if table_path is not None:
        from .atomic import atomic_write_text

        atomic_write_text(table_path, sweep_table(spec, outcome.runs, options.results_dir, "markdown", columns))
        click.echo(f"Table written to {table_path}")
    if (hung := outcome.hung_error()) is not None:  # after the table of what finished
        raise hung


def _sweep_columns(fmt: str, extra: str | None) -> list[str]:
    """--columns' keys, checked before any run (the brief table has its columns fixed)."""
    if extra is None:
        return []
    from ..leaderboard.aggregate import table_columns

    keys = [k.strip() for k in extra.split(",") if k.strip()]
    if not keys:
        raise BenchError(f"--columns {extra!r} names no column: give comma-separated keys, e.g. bwt,fwt or -wall.")
    if fmt == "brief":
        raise BenchError("--columns chooses the columns of --format markdown, text, latex or json; the brief table "
                         "always shows the gaps and the paired difference with vanilla.")
    table_columns(keys)
    return keys


@main.command()
@click.argument("protocol")
@click.argument("method")
@click.option("--trials", type=int, default=None, help="trials per method [default: the protocol's tuning ruleset]")
@click.option("--objective", default=None, help="metric scored on the validation split, e.g. CK_delta "
                                                "[default: the protocol's tuning ruleset]")
@click.option("--seed", "-s", default=0, show_default=True, type=int,
              help="run seed of every trial (and the sampler's)")
@click.option("--storage", default=None, metavar="URL",
              help="Optuna storage (a database URL for teams) [default: sqlite in <results-dir>/tuning]")
@click.option("--space", "space_file", type=click.Path(path_type=Path), default=None,
              help="YAML search space {setting: {low, high, log} | {choices: [...]}} instead of the method's own")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: trials in this process, pruned live; ray: each trial's runs as Ray tasks")
@click.option("--address", default=None, metavar="HOST:PORT", help="ray: join this cluster")
@click.option("--cpus-per-run", type=float, default=None, help="ray: CPUs each task reserves [default: 1]")
@click.option("--gpus-per-run", type=float, default=None, help="ray: GPUs each task reserves [default: 0]")
@_run_options
def tune(protocol: str, method: str, trials: int | None, objective: str | None, seed: int, storage: str | None,
         space_file: Path | None, executor: str, address: str | None, cpus_per_run: float | None,
         gpus_per_run: float | None, results_dir: Path | None, device: str, trunk_cache: bool, progress: bool,
         allow_download: bool, tracking_uri: str | None, no_mlflow: bool) -> None:
    """Tune METHOD on PROTOCOL's validation split (never its test split): an Optuna study of the protocol's
    ruleset (trials, objective) over the search space the method declares, then the best settings
    written as a tuned entry (bench run --tuned runs them on the test split)."""
    from .api.requests import TuneRequest
    from .api.tuning import run_tune
    from .errors import read_file
    from .results.tuned import entry_path
    from .spec.specfile import decode_spec, safe_yaml
    from .tools.preflight import check_backbone

    given: dict[str, Any] | None = None
    if space_file is not None:
        read = safe_yaml(decode_spec(read_file(space_file, "--space"), "--space", str(space_file)), "--space",
                         str(space_file))
        if read is None or read == {}:
            raise BenchError(f"--space {space_file} is empty: name at least one setting to tune, as "
                             f"{{setting: {{low, high[, log]}} | {{choices: [...]}}}}.")
        if not isinstance(read, dict):
            raise BenchError(f"--space {space_file} must hold a mapping of setting -> range.")
        given = read
    request = TuneRequest.checked(protocol, method, trials=trials, objective=objective, seed=seed, storage=storage,
                                  space=given, results_dir=results_dir)
    ray_plan = _ray_plan(executor, address, cpus_per_run, gpus_per_run, None, device, "study")
    check_backbone(request.study.protocol)
    options = _options({}, results_dir, device, trunk_cache, progress, allow_download)
    entry = run_tune(request, options, ray_plan, click.echo)
    click.echo(f"\nBest of {entry.trials} trial(s) ({entry.objective} on validation {entry.value:.4f}, trial "
               f"{entry.best_trial}): " + " ".join(f"--set {k}={v}" for k, v in entry.settings.items()))
    click.echo(f"Tuned entry: {entry_path(options.results_dir, request.study.protocol.name, method)}")


def _ray_plan(executor: str, address: str | None, cpus: float | None, gpus: float | None, retries: int | None,
              device: str, what: str):
    """The Ray settings, checked before anything runs (None for the local executor); ``what`` runs: a sweep
    or a study."""
    given = {"--address": address, "--cpus-per-run": cpus, "--gpus-per-run": gpus, "--max-retries": retries}
    if executor == "local":
        extra = [k for k, v in given.items() if v is not None]
        if extra:
            raise BenchError(f"{only_with(extra, '--executor ray')} (without it, this {what} runs locally).")
        return None
    cpus, gpus, retries = (1.0 if cpus is None else cpus, 0.0 if gpus is None else gpus,
                           3 if retries is None else retries)
    if cpus <= 0 or gpus < 0 or retries < 0:
        raise BenchError(f"--cpus-per-run must be > 0, --gpus-per-run and --max-retries >= 0 (got {cpus:g}, "
                         f"{gpus:g}, {retries}).")
    if gpus > 0 and not device.startswith(("cuda", "auto")):
        raise BenchError(f"--gpus-per-run {gpus:g} reserves GPUs, but --device is {device}: give --device cuda.")
    if device.startswith("cuda") and gpus == 0:
        raise BenchError(f"--device {device} on Ray needs --gpus-per-run (e.g. 1, or 0.5 for two runs per GPU): "
                         f"Ray hides the GPUs from a task that reserved none.")
    from .sweep.ray_executor import RayPlan  # the one import of Ray: a clear error when the extra is missing

    return RayPlan(address, cpus, gpus, retries)


def _report_ray_tasks(outcome) -> None:
    """A Ray sweep's retried and unfinished tasks; exit 1 when some did not finish."""
    for state in outcome.states.values():
        if state.attempts > 1:
            click.echo(f"Retried: {state.label} (a worker died; attempt {state.attempts} finished it, its first "
                       f"update: {state.went_on_from or 'none'})")
    for state in outcome.failed:
        click.echo(f"{state.status.capitalize()}: {state.label}: {state.note}", err=True)
    if outcome.failed:
        click.echo(f"{len(outcome.failed)} of {len(outcome.states)} task(s) did not finish; re-run the same command to "
                   f"retry them (finished runs are skipped).", err=True)
        click.get_current_context().exit(1)


@main.command(name="ls")
@click.argument("what", type=click.Choice(["protocols", "methods"]))
def ls(what: str) -> None:
    """List built-in and installed protocols or methods (with the package that supplied each)."""
    if what == "protocols":
        from .spec.protocol import builtin_protocol_names, load_protocol

        for name in builtin_protocol_names():
            p = load_protocol(name)
            tag = "embedded" if p.embedded else "needs data"
            click.echo(f"{name:<28} v{p.version}  {tag:<10}  {p.description}")
        return
    from ..methods.registry import METHOD_GROUP, MODIFIER_GROUP, entries
    from ..methods.registry import summary as summary_of

    for title, group in (("methods", METHOD_GROUP), ("modifiers (compose as base+modifier)", MODIFIER_GROUP)):
        click.echo(f"{title}:")
        for name, entry in sorted(entries(group).items()):
            try:  # read from the source: a catalogue imports no method (and so no torch)
                summary = summary_of(entry)
            except BenchError as err:
                summary = f"[fails to import] {err}"
            click.echo(f"  {name:<14} {entry.distribution} {entry.version:<8} {summary}")
    click.echo("reference (the harness's own; no modifiers or --set):\n"
               "  joint          upper bound A_joint: retrained on S1..Sj per session "
               "with the protocol's joint section")


@main.command(name="check-method")
@click.argument("name")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="override a method setting")
@click.option("--seed", "-s", default=0, show_default=True, type=int)
@click.option("--precision", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="arithmetic of the check's runs (on the CPU: fp32, or bf16 autocast)")
def check_method_cmd(name: str, overrides: tuple[str, ...], seed: int, precision: str) -> None:
    """Run the method contract on NAME (base(+modifier)*, any installed method) on two tiny embedded
    protocols: budget, storage, test isolation, determinism, state round-trip, resume, each loss term
    reaching a trainable parameter under the modifiers. Exit 2 on a breach."""
    from ..methods.registry import check_method as check_request
    from ..methods.registry import parse_overrides
    from .spec.protocol import load_protocol
    from .tools.preflight import check_seed

    # the name and settings against tiny_cil, whose reduced copies the checks run on, before torch is imported:
    # a typo or a bad --set is answered in a second, as bench run answers it
    check_request(name, load_protocol("tiny_cil"), parse_overrides(list(overrides)))
    check_seed(seed)
    from .tools.check_method import check_method

    _set_imports_aside()
    mark = {True: "PASS", False: "FAIL", None: "----"}
    outcomes = check_method(name, parse_overrides(list(overrides)), seed, precision=precision,
                            say=lambda o: click.echo(f"{mark[o.passed]}  {o.check}: {o.detail}"))
    failed = [o for o in outcomes if o.passed is False]
    if failed:
        raise BenchError(f"Method {name!r} fails the contract ({len(failed)} check(s)): "
                         + " | ".join(f"{o.check}: {o.detail}" for o in failed))
    click.echo(f"{name}: passes the contract.")


@main.command()
@results_dir_option("results folder to mirror [default: ./bench-results]", envvar="BENCH_RESULTS_DIR")
@click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
              help="MLflow tracking URI [default: sqlite in the results folder]")
def sync(results_dir: Path | None, tracking_uri: str | None) -> None:
    """Mirror stored results that are not yet in MLflow (after a tracking failure, or --no-mlflow), and
    add to mirrored ones the tags and artifacts every mirror carries that they lack. Idempotent: a result
    mirrored whole is left alone."""
    from .paths import results_dir as resolve_results
    from .results.tracking import Store
    from .sweep.mirror import sync as sync_results
    from .tools.preflight import check_store

    root = resolve_results(results_dir)
    if not (root / "runs").is_dir():
        raise BenchError(f"Results folder {root} holds no runs/ folder: nothing to sync.")
    try:
        check_store(root, tracking_uri)
    except BenchError as err:  # the run commands' way out, --no-mlflow, is no option of a command that mirrors
        raise BenchError(re.sub(r",? or (pass )?--no-mlflow; nothing has run\.", "; nothing was synced.", str(err))) \
            from None
    report = sync_results(root, tracking_uri)
    for path, rid in report.added:
        click.echo(f"  mirrored {path} -> MLflow run {rid}")
    for path, rid, added in report.repaired:
        click.echo(f"  repaired MLflow run {rid} of {path}: added {', '.join(added)}")
    if report.replaced:
        click.echo(f"  deleted {len(report.replaced)} unfinished mirror(s), "
                   f"logged again whole: {', '.join(report.replaced)}")
    for path, why in report.skipped:
        click.echo(f"  skipped {path}: {shorten(why)}", err=True)
    click.echo(f"Synced {root} to {Store(root, tracking_uri).uri}: {len(report.added)} added, "
               f"{report.present} already there" + (f" ({len(report.repaired)} repaired)" if report.repaired else "")
               + (f", {len(report.skipped)} skipped (named above)." if report.skipped else "."))


@main.command()
@click.argument("result", type=click.Path(path_type=Path))
@click.option("--scratch", type=click.Path(path_type=Path), default=None,
              help="folder to make the run again in [default: a new temporary folder]")
@click.option("--reuse-caches", is_flag=True,
              help="reuse the cached deployed model and trunk features instead of making them again")
def reproduce(result: Path, scratch: Path | None, reuse_caches: bool) -> None:
    """Make the stored run RESULT (its JSON) again from what it records (protocol spec by hash, method and
    its code hash, settings, seed, precision, kernels, machine arithmetic) and compare every recorded value:
    "identical", or the first eval point and measure that differ and the identity fields that differ
    (another CPU's arithmetic, another torch). Exit 0 when identical, 1 when not, 2 when it cannot be made
    here (the spec or method code at the recorded hash is not installed)."""
    from .tools.reproduce import reproduce as make_again

    report = make_again(result, scratch, reuse_caches=reuse_caches, echo=lambda m: click.echo(m, err=True))
    for line in report.lines():
        click.echo(line)
    if not report.identical:
        sys.exit(1)


@main.group()
def show() -> None:
    """Show a protocol's full spec."""


@show.command(name="protocol")
@click.argument("name")
def show_protocol(name: str) -> None:
    """Print the validated spec (defaults filled in), its hash, and its distance from the paper's setting."""
    import yaml

    from ..methods.sgm.settings_view import sgm_settings
    from .spec.paper import describe, distance
    from .spec.protocol import load_protocol

    p = load_protocol(name)
    click.echo(f"# {p.name} v{p.version}  hash {p.spec_hash}")
    click.echo(yaml.safe_dump(p.model_dump(mode="json"), sort_keys=False))
    click.echo(describe(*distance(p, sgm_settings(p))))  # comment lines: the output stays valid YAML


@main.command()
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--build", is_flag=True, help="protocols: also build the network in random init and split it as a run "
                                            "would, check the backbone's weights file and price the FLOP budget "
                                            "(imports torch and timm: tens of seconds on a loaded machine)")
def validate(file: Path, build: bool) -> None:
    """Validate a protocol YAML file (or a result JSON) without running anything. A protocol's fields,
    data sources and reference methods are checked at once; --build checks what needs its network too."""
    from .errors import not_a_file

    kind = "Result" if file.suffix == ".json" else "Protocol"
    if (problem := not_a_file(file)) is not None:
        raise BenchError(f"{kind} file {file} {problem}.")
    if file.suffix == ".json":
        from ..leaderboard.recheck import recomputed_problem
        from .results.comparability import result_problem, value_problem
        from .results.schema import load_result

        r = load_result(file)
        if (bad := value_problem(r) or recomputed_problem(file, r)) is not None:
            raise BenchError(f"Result file {file} is refused: {bad}. The leaderboard never ranks it and "
                             f"`bench sync` never mirrors it.")
        apart = result_problem(r)
        click.echo(f"OK: result {r.run_id} ({r.protocol.name}, {r.method.spec}, seed {r.seed}, {r.status})"
                   + (f"; never ranked: {apart}" if apart else ""))
        return
    from .spec.protocol import load_protocol

    p = load_protocol(str(file))
    from .tools.preflight import check_references, weights_file

    check_references(p)
    weights_file(p)
    if not build:  # the network's checks import torch and timm: asked for, never a catalogue's cost
        click.echo(f"OK: protocol {p.name} v{p.version}, hash {p.spec_hash} (fields, data and reference methods; "
                   f"--build also builds the network and checks the backbone"
                   + (" and the FLOP budget" if p.training.budget is not None else "") + ")")
        return
    from .tools.preflight import architecture, check_backbone, check_flop_budget

    check_backbone(p)
    architecture(p)  # the parts split and connect as a run will split them
    click.echo(f"OK: protocol {p.name} v{p.version}, hash {p.spec_hash} (network built and split)")
    if (most := check_flop_budget(p)) is not None and p.training.budget is not None:
        click.echo(f"training.budget.tflops {p.training.budget.tflops:g} buys at most {most:,} updates a session "
                   f"(output-only training, the cheapest method; a method whose updates cost more makes fewer).")


def _register_subcommands() -> None:
    """Command groups that live beside their package (the leaderboard builder, the perf benchmark)."""
    from ..leaderboard.cli import leaderboard
    from .tools.perf import perf

    main.add_command(leaderboard)
    main.add_command(perf)


_register_subcommands()


def entry() -> None:
    """The ``bench`` command (its console script, and ``python -m``): ``main`` as the whole life of this
    process, which ends once the command is done, refused or not, as a stopped one does (``_end_now``).
    A Python caller of ``main`` gets the exit as an exception and its process goes on."""
    try:
        main()
    except SystemExit as done:  # click's standalone mode ends every command so; a crash keeps its traceback
        _end_now(_exit_code(done.code), wait_for_threads=True)


if __name__ == "__main__":
    entry()
