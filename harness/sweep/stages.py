"""A sweep as a graph of stages, the one description both executors (local, Ray) run.

A run needs the protocol's deployed model, then the joint reference of its seed, then the seed's A_best
reference runs; a grid shares them. Each shared prerequisite becomes one stage, built once, that the
stages needing it wait for:

    deployed (per protocol spec) -> joint (per seed) -> references (per seed) -> method runs (per row)

A cluster may split a joint stage into its independent models (``split_joint``): one ``joint-part``
stage per model, each stored in its own checkpoint, which the joint stage then combines.

Executors only order and place stages; what a stage computes is ``run_stage``, the same code whichever
executor calls it, so the same grid gives the same result JSONs. A row that *is* a reference run (a
reference method with default settings) is made by the references stage, never run twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..results.comparability import Selection
from ..results.schema import RunResult, TunedStamp, format_setting, row_label
from ..run.hook_clock import HookTimedOut
from ..run.options import RunOptions
from ..run.workbench import Workbench
from ..spec.protocol import Protocol
from .plan import PlannedRun

Kind = Literal["deployed", "joint", "joint-part", "references", "run"]
Stored = tuple[RunResult, Path]


@dataclass(frozen=True)
class Stage:
    kind: Kind
    protocol: Protocol
    seed: int
    method: str = ""  # run stages: the method string
    overrides: dict[str, Any] = field(default_factory=dict)  # run stages: the --set overrides
    needs: tuple[str, ...] = ()  # keys of the stages that must have finished first
    tuned: TunedStamp | None = None  # run stages: the overrides came from bench tune
    part: int = 0  # joint-part stages: which joint model (0-based)

    @property
    def key(self) -> str:
        spec = f"{self.protocol.name}@{self.protocol.spec_hash}"
        if self.kind == "deployed":
            return f"deployed:{spec}"
        if self.kind in ("joint", "references"):
            return f"{self.kind}:{spec}:{self.seed}"
        if self.kind == "joint-part":
            return f"{self.kind}:{spec}:{self.seed}:{self.part}"
        return f"run:{spec}:{self.seed}:{row_label(self.method, self.overrides, self.tuned)}"

    @property
    def work(self) -> float | None:
        """The samples this stage trains on, as the plan knows them (updates x batch, every session and
        model): the unit a sweep's ETA prices with the speed it measured, so the first stage finished is
        enough to go by. None where the count is not known ahead (a FLOP budget's updates)."""
        p = self.protocol
        if self.kind == "deployed":
            return float(p.pretrain.updates * p.pretrain.batch_size)
        if self.kind in ("joint", "joint-part"):
            joint = p.joint
            if not isinstance(joint.updates, int):
                return None
            models = 1 if self.kind == "joint-part" or joint.mode == "final" else p.sessions
            return float(models * joint.updates * joint.batch_size)
        per_session = _session_updates(p)
        if per_session is None:
            return None
        runs = len(p.best_new_reference) if self.kind == "references" else 1
        return float(runs * p.sessions * per_session * p.training.batch.size)

    @property
    def label(self) -> str:
        """What a person reads in the progress display: protocol, method (or stage), seed."""
        if self.kind == "deployed":
            return f"{self.protocol.name} deployed model"
        if self.kind == "joint":
            return f"{self.protocol.name} joint seed {self.seed}"
        if self.kind == "joint-part":
            return f"{self.protocol.name} joint model {self.part + 1} seed {self.seed}"
        if self.kind == "references":
            return (f"{self.protocol.name} {'+'.join(self.protocol.best_new_reference)} (A_best reference) "
                    f"seed {self.seed}")
        extra = f" [{self.tuned.ruleset}]" if self.tuned else "".join(
            f" --set {k}={format_setting(v)}" for k, v in self.overrides.items())
        return f"{self.protocol.name} {self.method} seed {self.seed}{extra}"


def _session_updates(protocol: Protocol) -> int | None:
    """A learning session's updates: the count, or one per arriving sample online (a session's new
    samples: its classes x the stream's training images per class); None under a FLOP budget."""
    updates = protocol.training.updates
    if isinstance(updates, int):
        return updates
    if updates == "per_sample":
        per_class = max(source.train_per_class or 0 for source in protocol.stream_data)
        return (protocol.classes_per_session or 0) * per_class or None  # all of a source's images: not known ahead
    return None


def made_by_references(run: PlannedRun, counted: Selection) -> bool:
    """A row the references stage makes: one of the protocol's A_best methods, with default settings, that
    has no stored run yet (a stored one made with other settings is rerun as a row of its own)."""
    return (not run.overrides and run.method in run.protocol.best_new_reference and
            (run.method, run.seed) not in counted.runs)


def stage_graph(runs: list[PlannedRun], results_dir: Path, options: RunOptions | None = None) -> list[Stage]:
    """The stages still to do for ``runs``, in an order that runs every stage after those it needs (the
    runs' own order otherwise, so a local sweep goes seed by seed as before). A joint or references stage
    whose results are already stored is left out; the deployed-model stage stays (when cached, it loads)."""
    from ..run.options import RunOptions
    from ..run.pipeline import selection

    graph: dict[str, Stage] = {}
    chosen = {}  # protocol key -> the stored runs that count (the one rule, results.comparability.select_runs)

    def add(stage: Stage) -> str:
        graph.setdefault(stage.key, stage)
        return stage.key

    for run in runs:
        if run.done is not None:
            continue
        p, seed = run.protocol, run.seed
        spec = f"{p.name}@{p.spec_hash}"
        if spec not in chosen:
            chosen[spec] = selection(p, options or RunOptions(results_dir=results_dir))
        counted = chosen[spec]
        needs = (add(Stage("deployed", p, seed)),)
        if seed not in counted.joints:
            needs = (add(Stage("joint", p, seed, needs=needs)),)
        if any((m, seed) not in counted.runs for m in p.best_new_reference):
            needs = (add(Stage("references", p, seed, needs=needs)),)
        if not made_by_references(run, counted):
            add(Stage("run", p, seed, run.method, dict(run.overrides), needs=needs, tuned=run.tuned))
    return list(graph.values())


def split_joint(graph: list[Stage]) -> list[Stage]:
    """``graph`` with each joint stage of several models preceded by one ``joint-part`` stage per model
    (needing what the joint stage needed), and the joint stage needing those parts instead: a cluster
    then trains the models side by side, and the joint stage only combines them."""
    from ..run.joint import joint_parts

    out: list[Stage] = []
    for stage in graph:
        n = joint_parts(stage.protocol.reference) if stage.kind == "joint" else 1
        if n > 1:
            parts = [dataclasses.replace(stage, kind="joint-part", part=i) for i in range(n)]
            out += parts
            stage = dataclasses.replace(stage, needs=tuple(s.key for s in parts))
        out.append(stage)
    return out


def run_stage(stage: Stage, options: RunOptions, bench: Workbench | None = None) -> list[Stored]:
    """Compute one stage and return the results it stored (none for the deployed model, which is cached).
    ``bench``: a workbench already prepared for this protocol and seed, reused when given."""
    from ..run.pipeline import ensure_references, execute, selection
    from ..run.workbench import prepare

    p = stage.protocol
    if stage.kind == "deployed":
        if bench is None:  # prepares the stream and input stores, trains and caches the deployed model
            prepare(p, stage.seed, options)
        return []
    if stage.kind == "joint-part":
        from ..run.pipeline import joint_reference_part

        joint_reference_part(p, stage.seed, stage.part, options, bench or prepare(p, stage.seed, options))
        return []
    if stage.kind == "joint":
        if any(k.startswith("joint-part:") for k in stage.needs):  # its parts ran first, --restart included
            options = dataclasses.replace(options, restart=False)
        return [execute(p, "joint", stage.seed, options, bench)]
    if stage.kind == "references":
        before = {r.run_id for _, r in selection(p, options).reference_runs(stage.seed)}
        ensure_references(p, stage.seed, options, bench)
        return [(r, path) for path, r in selection(p, options).reference_runs(stage.seed) if r.run_id not in before]
    return [execute(p, stage.method, stage.seed, dataclasses.replace(options, overrides=dict(stage.overrides)), bench,
                    tuned=stage.tuned)]


def run_local(graph: list[Stage], options: RunOptions, on_start: Callable[[Stage], None],
              method_run: Callable[[Stage, Workbench], None], on_stored: Callable[[Stage, list[Stored]], None],
              on_hung: Callable[[Stage, HookTimedOut], None] | None = None) -> None:
    """Today's executor: every stage in order in this process. The stages of a protocol spec and seed share
    one workbench, prepared once (as one ``execute`` shares it with its references): the shared stages hand
    what they stored to ``on_stored``; a method run is ``method_run``'s (the CLI's, with live tracking),
    which gets that workbench, finds those references stored and runs the method alone. A method run whose
    call into the method ran past its time limit goes to ``on_hung`` and the sweep goes on with the others
    (without ``on_hung`` it ends the sweep): one bad method never stalls a grid."""
    from ..run.workbench import prepare

    current: tuple[str, str, int] | None = None
    bench: Workbench | None = None
    for stage in graph:
        on_start(stage)
        where = (stage.protocol.name, stage.protocol.spec_hash, stage.seed)
        if where != current:
            bench, current = None, where  # one workbench in memory at a time
            bench = prepare(stage.protocol, stage.seed, options)
        assert bench is not None  # the first stage and every change of protocol or seed prepared one above
        if stage.kind != "run":
            on_stored(stage, run_stage(stage, options, bench))
            continue
        try:
            method_run(stage, bench)
        except HookTimedOut as hung:
            if on_hung is None:
                raise
            on_hung(stage, hung)
            current = None  # a call stopped half-way may have left the workbench mid-batch: the next prepares anew
