"""The Ray executor of ``bench sweep``: each stage of the sweep (``sweep_stages``) is a Ray task with
declared resources, and the stages it needs are its arguments, so Ray, not bench, schedules the grid.

- ``--address`` joins an existing cluster (``ray start --head`` elsewhere, KubeRay, Ray on Slurm);
  without it Ray starts a local cluster sized to this machine.
- A task whose worker dies is retried by Ray (``max_retries``); a re-run sweep skips what is stored.
- Results land in the shared results folder from the worker that computed them; the driver checks
  first that every node sees that folder and the cache folder (``shared_storage``).
- A joint reference of several models runs as one task per model (``split_joint``), each with its own
  checkpoint and resources, and one task that combines them: the same reference as a local run's, in
  about the time of its largest model.
- Each task starts with ``torch_threads(cpus_per_run)`` intra-op threads; a run on the CPU then
  computes with the harness's fixed count (``harness.results.comparability``), so a local sweep and a Ray sweep give
  bit-identical JSONs whatever ``--cpus-per-run`` is.

Ray is an optional extra (``pip install 'bench-stability-gap[ray]'``): only this module imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:  # pragma: no cover - the message is the point
    from ..errors import BenchError

    raise BenchError("--executor ray needs Ray, an optional extra: pip install 'bench-stability-gap[ray]' "
                     "(or --executor local, the default, which runs the sweep in this process).") from None

from ..errors import BenchError
from ..paths import cache_dir
from ..results.comparability import CPU_THREADS
from ..results.schema import load_result
from ..run.options import RunOptions
from .progress import ProgressBoard, TaskState, overall_line, running_lines
from .shared_storage import probe_problems, remove_probes, shared_storage_error, write_probes
from .stages import Stage, run_stage, split_joint

# what a worker must see of the driver's environment: bench's own settings (the cache folder, data
# roots such as $BENCH_DATA), MLflow's, and the OpenMP wait policy the CLI sets before torch loads
FORWARDED_PREFIXES = ("BENCH_", "MLFLOW_")
FORWARDED_NAMES = ("OMP_WAIT_POLICY",)
PROBE_TIMEOUT_S = 300


@dataclass(frozen=True)
class RayPlan:
    address: str | None  # None: a local cluster sized to this machine
    cpus_per_run: float
    gpus_per_run: float
    max_retries: int


def torch_threads(cpus_per_run: float) -> int:
    """Intra-op threads of a task: its whole CPUs, at least one."""
    return max(1, int(cpus_per_run))


def is_server_uri(uri: str | None) -> bool:
    """A tracking server every worker can log to (http(s)); anything else is logged by the driver."""
    return uri is not None and uri.startswith(("http://", "https://"))


def worker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES}
    env["BENCH_CACHE_DIR"] = str(cache_dir().resolve())  # the path the driver checked, absolute
    env.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    return env


@ray.remote(num_cpus=0)
def _probe(folders: dict[str, Path], token: str) -> list[str]:
    return probe_problems(folders, token)


@ray.remote
def _stage_task(stage: Stage, options: RunOptions, threads: int, board, log_uri: str | None,
                *needs) -> list[tuple[str, str | None]]:
    """One stage on a worker: report to the board, compute, log to the tracking server if there is one.
    ``needs``: the stages this one waits for (Ray passes their results once they are done)."""
    import torch

    torch.set_num_threads(threads)
    key = stage.key
    node = f"{ray.util.get_node_ip_address()} {ray.get_runtime_context().get_node_id()[:6]}"
    attempt = ray.get(board.started.remote(key, node))
    last = [0.0]

    def report(phase: str, update: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] >= 1.0 or update in (1, total):  # a phase's first and last update, <= 1/s between
            last[0] = now
            board.at.remote(key, phase, update, total)

    # a retried attempt resumes from the checkpoint the dead one left, even under --restart
    opts = dataclasses.replace(options, progress=False, log=False, on_progress=report,
                               restart=options.restart and attempt == 1)
    out = []
    for result, path in run_stage(stage, opts):
        rid = None
        if log_uri is not None:  # a failure keeps the JSON and says how to mirror it later (bench sync)
            from .mirror import mirror

            rid, _ = mirror(result, path, opts.results_dir, log_uri, stage.protocol)
        out.append((str(path), rid))
    return out


def check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds, not after Ray's minutes of retries, when nothing listens at HOST:PORT."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise BenchError(f"--address {address}: nothing answers there ({exc.strerror or exc}). Start the cluster "
                         f"with `ray start --head --port {port}` on {host} (or give the address KubeRay or your "
                         f"Slurm script printed), or leave --address out to start a local cluster.") from None


def _connect(address: str | None) -> None:
    runtime_env = {"env_vars": worker_env()}
    if address is not None:
        check_reachable(address)
    try:
        if address is None:
            ray.init(address="local", runtime_env=runtime_env, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        else:
            ray.init(address=address, runtime_env=runtime_env, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise BenchError(f"--address {address}: cannot join the Ray cluster there ({exc}). Start one with "
                         f"`ray start --head --port 6379` on the head node and give its ADDRESS:PORT, or leave "
                         f"--address out to start a local cluster on this machine.") from None


def check_shared_storage(results_dir: Path) -> int:
    """Every alive node must see the results and cache folders (a probe task pinned to each node);
    raises the one-paragraph error otherwise. Returns the number of nodes checked."""
    folders = {"results folder": results_dir, "cache folder ($BENCH_CACHE_DIR)": cache_dir().resolve()}
    token = write_probes(folders)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        checks = {f"{n['NodeManagerAddress']} ({n['NodeID'][:8]})": _probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(folders, token)
            for n in nodes}
        try:
            answers = dict(zip(checks, ray.get(list(checks.values()), timeout=PROBE_TIMEOUT_S)))
        except ray.exceptions.GetTimeoutError:
            raise BenchError(f"The shared-storage check did not answer within {PROBE_TIMEOUT_S} s on every Ray "
                             f"node ({', '.join(checks)}); is every node able to start a worker?") from None
    finally:
        remove_probes(folders, token)
    problems = {node: p for node, p in answers.items() if p}
    if problems:
        raise shared_storage_error(problems)
    return len(nodes)


def _failure_note(err: Exception) -> str:
    cause = getattr(err, "cause", None)
    if isinstance(cause, BenchError):
        return str(cause)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(err).strip().splitlines()[0]


class _Display:
    """One overall line and the running tasks: redrawn in place on a terminal; in a log, printed when a
    task changes state or phase (a session, a joint model) and every ``every`` seconds."""

    def __init__(self, echo: Callable[[str], None], every: float = 30.0, work: dict[str, float | None] | None = None
                 ) -> None:
        self.echo, self.every, self.work = echo, every, work
        self.tty = sys.stdout.isatty()
        self.drawn = 0
        self.last_stages: tuple | None = None
        self.last_print = 0.0

    def show(self, states: dict[str, TaskState], elapsed: float) -> None:
        lines = [overall_line(states, elapsed, self.work), *running_lines(states)]
        if self.tty:
            sys.stdout.write("\x1b[1A\x1b[2K" * self.drawn + "\n".join(lines) + "\n")
            sys.stdout.flush()
            self.drawn = len(lines)
            return
        stages = tuple((k, t.status, t.attempts, t.phase) for k, t in states.items())
        now = time.monotonic()
        if stages != self.last_stages or now - self.last_print >= self.every:
            self.last_stages, self.last_print = stages, now
            for line in lines:
                self.echo(line)


def run_ray(graph: list[Stage], options: RunOptions, plan: RayPlan, tracking_uri: str | None, mlflow: bool,
            echo: Callable[[str], None]) -> dict[str, TaskState]:
    """Run the stages on Ray and return each task's final state (failed ones with the reason)."""
    graph = split_joint(graph)
    _connect(plan.address)
    try:
        resources = ray.cluster_resources()
        echo(f"Ray cluster: {len([n for n in ray.nodes() if n.get('Alive')])} node(s), "
             f"{resources.get('CPU', 0):g} CPU(s), {resources.get('GPU', 0):g} GPU(s); each task asks for "
             f"{plan.cpus_per_run:g} CPU(s), {plan.gpus_per_run:g} GPU(s); a run on the CPU "
             f"computes with {CPU_THREADS} intra-op thread(s), on CUDA with {torch_threads(plan.cpus_per_run)}")
        if plan.cpus_per_run > resources.get("CPU", 0) or plan.gpus_per_run > resources.get("GPU", 0):
            raise BenchError(f"Each task asks for {plan.cpus_per_run:g} CPU(s) and {plan.gpus_per_run:g} GPU(s) "
                             f"(--cpus-per-run, --gpus-per-run), but the whole Ray cluster has "
                             f"{resources.get('CPU', 0):g} CPU(s) and {resources.get('GPU', 0):g} GPU(s): no "
                             f"task could ever start.")
        nodes = check_shared_storage(options.results_dir)
        echo(f"Shared storage: results {options.results_dir} and cache {cache_dir().resolve()} are visible "
             f"and writable on all {nodes} node(s)")
        return _submit_and_watch(graph, options, plan, tracking_uri, mlflow, echo)
    finally:
        ray.shutdown()


def _submit_and_watch(graph: list[Stage], options: RunOptions, plan: RayPlan, tracking_uri: str | None,
                      mlflow: bool, echo: Callable[[str], None]) -> dict[str, TaskState]:
    # an actor handle: Ray's types do not give its methods their ``.remote``
    board: Any = ray.remote(num_cpus=0)(ProgressBoard).remote({s.key: s.label for s in graph})
    worker_logs = mlflow and is_server_uri(tracking_uri)
    refs: dict[str, ray.ObjectRef] = {}
    for stage in graph:
        refs[stage.key] = _stage_task.options(
            name=stage.label, num_cpus=plan.cpus_per_run, num_gpus=plan.gpus_per_run,
            max_retries=plan.max_retries, retry_exceptions=False,
        ).remote(stage, options, torch_threads(plan.cpus_per_run), board,
                 tracking_uri if worker_logs else None, *[refs[k] for k in stage.needs])
    stage_of = {ref: s for s, ref in zip(graph, refs.values())}
    failed: set[str] = set()
    # a joint stage whose models are trained by its joint-part stages only combines them: no work of its own
    work = {s.key: 0.0 if s.kind == "joint" and any(n.startswith("joint-part") for n in s.needs) else s.work
            for s in graph}
    display, begun = _Display(echo, work=work), time.monotonic()
    pending = list(refs.values())
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        for ref in ready:
            stage = stage_of[ref]
            try:
                stored = ray.get(ref)
            except ray.exceptions.RayError as err:
                blocked = [k for k in stage.needs if k in failed]
                failed.add(stage.key)
                status, note = (("skipped", f"needs {blocked[0]}, which failed") if blocked
                                else ("failed", _failure_note(err)))
                board.finished.remote(stage.key, status, note)
                continue
            if mlflow and not worker_logs:  # a local store (sqlite): one writer, the driver
                from .mirror import mirror

                for path, _ in stored:
                    mirror(load_result(Path(path)), Path(path), options.results_dir, tracking_uri, stage.protocol)
            board.finished.remote(stage.key, "done")
        display.show(ray.get(board.snapshot.remote()), time.monotonic() - begun)
    states = ray.get(board.snapshot.remote())
    display.show(states, time.monotonic() - begun)
    return states
