"""``bench tune``: equal tuning effort for every method, on data that is not the test split.

A method's tuned settings come from an Optuna study over the search space its ``Config`` declares
(``methods.configs``; a modifier's under its name), with the number of trials and the objective the
protocol's tuning ruleset fixes (``tuning: {trials, objective}``), so every method tuned on a protocol
gets the same budget. Each trial is a run of the protocol's tuning view (``Protocol.tuning_view``:
trained without the validation split, scored on it; the test split is never in its stream), made by the
sweep's stages and executors, stored in ``<results>/tuning`` (apart from the leaderboard's runs), and
resumed like any run. The best trial's settings are written as a tuned entry (``results.tuned``) that
records what they were tuned under; ``bench run --tuned`` and sweep rows with ``tuned: true`` run them
on the test split.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ...methods.registry import method_settings, parse_method, resolve_settings
from ..errors import BenchError
from ..results.schema import TRIALS_FOLDER, load_result
from ..results.tuned import TunedEntry, has_entry, save_entry
from ..spec.protocol import MAX_TRIALS, OBJECTIVES, Protocol, TuningRules
from .study_checks import check_dim, check_storage, check_values, same_space, space_key, typed_range

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from ...methods.configs import SearchSpace
    from ...methods.registry import MethodSpec
    from ..results.schema import RunResult
    from ..run.evaluation import Accuracies
    from ..run.options import RunOptions
    from ..run.workbench import Workbench
    from ..spec.specfile import JSONValue
    from .ray_executor import RayPlan
    from .stages import Stage

    # one trial's run: (tuning view, its overrides, live pruning or None) -> its stored result
    TrialRunner = Callable[[Protocol, dict[str, object], "Reporter | None"], RunResult]

# the curve a trial reports at each eval point for pruning, by objective: the accuracy its metric averages
PRUNING_CURVE = {"S_delta": "old", "P_delta": "new"}  # every other objective: accuracy on all seen classes
# eval points a trial reports before it may be pruned: the first session's update-0 point, its first point
# of training and two more, on either kind of schedule (by updates or by compute)
WARMUP_POINTS = 4


def tuning_root(results_dir: Path) -> Path:
    """The trials' results folder: apart from ``<results>/runs``, so no trial is ever ranked."""
    return results_dir / TRIALS_FOLDER


def default_storage(results_dir: Path) -> str:
    return f"sqlite:///{tuning_root(results_dir) / 'optuna.db'}"


def study_name(view: Protocol, method: str, rules: TuningRules, seed: int, space: str | None = None) -> str:
    """One study per protocol spec, method, ruleset, seed and search space (``space``: the key of a space
    other than the method's own): a changed spec, budget or space starts afresh."""
    return (f"{view.name}-{view.spec_hash}-{method}-{rules.trials}x{rules.objective}-seed{seed}"
            + (f"-space{space}" if space else ""))


def ruleset(protocol: Protocol, trials: int | None, objective: str | None) -> TuningRules:
    """The protocol's tuning ruleset, or the one ``--trials``/``--objective`` give (recorded as such).
    Zero trials or an unknown objective is a BenchError naming the option."""
    if trials is not None and not 1 <= trials <= MAX_TRIALS:
        raise BenchError(f"--trials {trials}: a study needs at least 1 trial (at most {MAX_TRIALS}).")
    if objective is not None and objective not in OBJECTIVES:
        raise BenchError(f"--objective {objective!r} is not a metric tuning can score; use one of "
                         f"{', '.join(OBJECTIVES)}.")
    base = protocol.tuning
    if trials is None:
        if base is None:
            raise BenchError(f"Protocol {protocol.name} declares no tuning ruleset (`tuning: {{trials: N, "
                             f"objective: CK_delta}}`); give --trials N (and --objective) to tune on it anyway.")
        trials = base.trials
    return TuningRules(trials=trials,
                       objective=objective or (base.objective if base is not None else "CK_delta"))


# given: the --space file as YAML read it (its shape is checked here, entry by entry)
def search_space(method: str, protocol: Protocol, given: dict[str, Any] | None = None) -> SearchSpace:
    """The space a study samples: what the method string's base and modifiers declare (modifiers' under
    their names), or ``given`` (``--space FILE``). Every name must be a setting the method has, and every
    range one its values fit (integers for an integer setting): a BenchError names the entry, before
    anything runs."""
    from ...methods.configs import Dim
    from ...methods.registry import config_class

    spec = parse_method(method)
    if given is None:
        space = dict(getattr(config_class(spec.base), "search_space", {}))
        for entry in spec.modifiers:
            space.update({f"{entry.name}.{k}": d for k, d in getattr(config_class(entry), "search_space", {}).items()})
    elif not given:
        raise BenchError("The search space given is empty: name at least one setting to tune, as "
                         "{setting: {low, high[, log]} | {choices: [...]}}.")
    else:
        space = {}
        for key, raw in given.items():
            if not isinstance(key, str):
                raise BenchError(f"Search space entry {key!r} is not a setting's name: name it as text, e.g. lr.")
            try:
                fields: dict[str, Any] = {k: tuple(v) if k == "choices" and isinstance(v, list) else v
                                          for k, v in raw.items()}
                space[key] = Dim(**fields)
            except (TypeError, AttributeError):
                raise BenchError(f"Search space entry {key!r}: "
                                 f"{raw!r} must be {{low, high[, log]}} or {{choices: [...]}}.") from None
    if not space:
        raise BenchError(f"Method {method!r} declares no search space (a `search_space` beside its Config) and none "
                         f"was given with --space: there is nothing to tune.")
    settings = _settings(spec, protocol, {})
    for key, dim in space.items():
        _setting(settings, key, method)
        check_dim(key, dim)
        check_values(key, dim, lambda k, v: resolve_settings(spec, protocol, {k: v}))
        if dim.choices is None:
            space[key] = typed_range(key, dim, _setting(_settings(spec, protocol, {key: dim.low}), key, method))
    return space


def _settings(spec: MethodSpec, protocol: Protocol, overrides: dict[str, object]) -> dict[str, JSONValue]:
    """The method's settings as ``--set`` names them (modifiers' under their names), with ``overrides``."""
    config, mod_configs = resolve_settings(spec, protocol, overrides)
    return {**config.model_dump(mode="json"), **{e.name: c.model_dump(mode="json")
                                                 for e, c in zip(spec.modifiers, mod_configs)}}


def _setting(settings: dict[str, JSONValue], key: str, method: str) -> JSONValue:
    """The value of the setting ``key`` (dotted for a nested one); a name the method lacks is a BenchError."""
    node: JSONValue = settings
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise BenchError(f"The search space names {key!r}, which is not a setting of method {method!r} "
                             f"(its settings: {', '.join(k for k in settings if k not in ('modifiers',))}).")
        node = node[part]
    return node


def _distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Optuna's distribution of each dimension: integer bounds (an integer setting's, as ``search_space``
    leaves them) are sampled as integers."""
    import optuna.distributions as dist

    # a dimension without choices is a range whose bounds search_space checked (check_dim)
    return {key: dist.CategoricalDistribution(list(d.choices)) if d.choices is not None
            else dist.IntDistribution(d.low, d.high, log=d.log) if isinstance(d.low, int)
            else dist.FloatDistribution(cast(float, d.low), cast(float, d.high), log=d.log) for key, d in space.items()}


@dataclasses.dataclass
class TuneRequest:
    protocol: Protocol
    method: str
    rules: TuningRules
    seed: int
    storage: str
    space: SearchSpace

    @property
    def view(self) -> Protocol:
        return self.protocol.tuning_view()

    @property
    def study(self) -> str:
        own = search_space(self.method, self.protocol)
        return study_name(self.view, self.method, self.rules, self.seed,
                          None if space_key(own) == space_key(self.space) else space_key(self.space))


def counted(study: optuna.Study) -> int:
    """Trials that spent the budget: finished or pruned (a failed one, e.g. interrupted, is run again)."""
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def _reopen_interrupted(study: optuna.Study) -> None:
    """A trial left running by a killed ``bench tune`` is marked failed and its settings asked again, so
    the re-run resumes that run from its checkpoint instead of spending a new trial."""
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)


def _sampler(seed: int, stored: int) -> optuna.samplers.TPESampler:
    """The study's sampler, seeded from ``seed`` and the number of trials already ``stored``: a resumed
    study continues with new settings instead of replaying the sequence its first process drew (a fresh
    study, ``stored`` = 0, is seeded exactly by ``seed``)."""
    import optuna

    return optuna.samplers.TPESampler(seed=(seed + 1_000_003 * stored) % 2**32)


class Reporter:
    """Live pruning: at each eval point after update 0, the running mean of the objective's accuracy
    (1 - it for a gap), reported to the trial; a trial the pruner stops raises ``TrialPruned``."""

    def __init__(self, trial: optuna.Trial, objective: str) -> None:
        self.trial, self.curve, self.minimize = (trial, PRUNING_CURVE.get(objective, "all"),
                                                 OBJECTIVES[objective] == "minimize")
        self.seen: list[float] = []

    def __call__(self, session: int, update: int, acc: Accuracies) -> None:
        import optuna

        value = getattr(acc, self.curve)
        if update == 0 or not math.isfinite(value):
            return
        self.seen.append(value)
        mean = sum(self.seen) / len(self.seen)
        self.trial.report(1.0 - mean if self.minimize else mean, len(self.seen))
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at session {session}, update {update}")


def tune(request: TuneRequest, options: RunOptions, run_trial: TrialRunner,
         echo: Callable[[str], None]) -> TunedEntry:
    """Run the study to ``rules.trials`` counted trials (resuming a stored one), then write the tuned entry.
    ``run_trial(view, overrides, reporter)`` makes one trial's run through an executor and returns its
    result (a RunResult); ``reporter`` is None where the executor cannot prune live (Ray)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tuning_root(options.results_dir).mkdir(parents=True, exist_ok=True)
    rules, view = request.rules, request.view
    direction = OBJECTIVES[rules.objective]
    study = optuna.create_study(
        study_name=request.study, storage=request.storage, direction=direction, load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=request.seed),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=WARMUP_POINTS))
    distributions = _distributions(request.space)
    same_space(study, request.study, distributions, request.storage)
    _reopen_interrupted(study)
    study.sampler = _sampler(request.seed, len(study.trials))
    done = counted(study)
    echo(f"Study {request.study} in {request.storage}: {done} of {rules.trials} trial(s) done")
    while done < rules.trials:
        trial = study.ask(distributions)
        overrides = dict(trial.params)
        echo(f"\n[trial {trial.number}: {done + 1}/{rules.trials}] {request.method} "
             + " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in overrides.items()))
        try:
            result = run_trial(view, overrides, Reporter(trial, rules.objective))
        except optuna.TrialPruned as stop:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            echo(f"  {stop}")
        else:
            value = None if result.metrics is None else getattr(result.metrics, rules.objective)
            if value is None or not math.isfinite(value):  # diverged, or a P_Δ with no A_best: spent, not ranked
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                echo(f"  no {rules.objective} (status {result.status}): counted as pruned")
            else:
                trial.set_user_attr("run_id", result.run_id)
                study.tell(trial, value)
                echo(f"  {rules.objective} on validation: {value:.4f}")
        done = counted(study)
    return write_entry(request, study, options.results_dir, echo)


def write_entry(request: TuneRequest, study: optuna.Study, results_dir: Path,
                echo: Callable[[str], None]) -> TunedEntry:
    """The best trial as the method's tuned entry; an entry it replaces is kept beside it, and named."""
    try:
        best = study.best_trial
    except ValueError:
        raise BenchError(f"Study {request.study}: every one of its {counted(study)} trial(s) was pruned or "
                         f"diverged, so there are no best settings to write; widen the search space or add trials "
                         f"(--trials).") from None
    entry = TunedEntry(
        protocol=request.protocol.name, protocol_hash=request.protocol.spec_hash, tuning_hash=request.view.spec_hash,
        method=request.method, settings=dict(best.params), trials=counted(study), objective=request.rules.objective,
        # the best trial is a complete one: it has a value
        direction=OBJECTIVES[request.rules.objective], value=float(cast(float, best.value)), best_trial=best.number,
        best_run=str(best.user_attrs.get("run_id", "")), validation=request.protocol.validation, seed=request.seed,
        study=request.study, storage=request.storage)
    _, kept = save_entry(results_dir, entry)
    if kept is not None:
        echo(f"The tuned entry this replaces is kept as {kept}.")
    return entry


def ensure_tuned(protocol: Protocol, method: str, options: RunOptions, ray_plan: RayPlan | None,
                 echo: Callable[[str], None]) -> None:
    """Tune ``method`` under the protocol's own ruleset unless a tuned entry for this spec exists (what a
    sweep row with ``tuned: true`` needs); a protocol without a ruleset or validation split, an entry that
    cannot be used (never tuned over) and a default study storage that is not Optuna's are refused."""
    if has_entry(options.results_dir, protocol, method):
        return
    rules, storage = ruleset(protocol, None, None), default_storage(options.results_dir)
    check_storage(storage, options.results_dir, given=False)
    request = TuneRequest(protocol, method, rules, 0, storage, search_space(method, protocol))
    request.view  # no validation split: refused before anything runs
    tune(request, options, trial_runner(method, 0, options, ray_plan, echo), echo)


def trial_runner(method: str, seed: int, options: RunOptions, ray_plan: RayPlan | None,
                 echo: Callable[[str], None]) -> TrialRunner:
    """``run_trial`` for ``tune``: one trial as the sweep runs a row (its deployed model, joint and A_best
    references of the tuning view first, each made once), locally with live pruning or as Ray tasks. A
    trial whose settings already have a stored result (asked again) reuses it."""
    from ...methods.registry import build_method
    from ..run.pipeline import execute, selection
    from .plan import PlannedRun, finished
    from .stages import run_local, stage_graph

    opts = dataclasses.replace(options, results_dir=tuning_root(options.results_dir), overrides={})

    def stored(view: Protocol, overrides: dict[str, object], config: dict[str, JSONValue]) -> RunResult | None:
        found = finished(opts.identity(view, method, seed, config, overrides), selection(view, opts))
        return None if found is None else load_result(found)

    def run_trial(view: Protocol, overrides: dict[str, object], reporter: Reporter | None) -> RunResult:
        config = method_settings(build_method(method, view, overrides)[1])
        done = stored(view, overrides, config)
        if done is not None:
            echo("  already stored: reused")
            return done
        graph = stage_graph([PlannedRun(view, method, seed, overrides, config, None)], opts.results_dir)
        if ray_plan is None:
            made: list[RunResult] = []

            def method_run(stage: Stage, bench: Workbench) -> None:
                run_opts = dataclasses.replace(opts, overrides=dict(overrides), on_eval=reporter)
                made.append(execute(view, method, seed, run_opts, bench)[0])

            run_local(graph, opts, lambda stage: echo(f"  {stage.label}"), method_run, lambda stage, results: None)
            if made:
                return made[0]
        else:
            from .ray_executor import run_ray

            states = run_ray(graph, opts, ray_plan, None, False, echo)
            failed = [f"{t.label}: {t.note}" for t in states.values() if t.status in ("failed", "skipped")]
            if failed:
                raise BenchError(f"A trial's Ray task did not finish ({'; '.join(failed)}); re-run the same "
                                 f"`bench tune` to resume the study (the trial is asked again).")
        done = stored(view, overrides, config)
        if done is None:
            raise BenchError(f"The trial of {method} with {overrides} finished but "
                             f"its result is not in {opts.results_dir}.")
        return done

    return run_trial
