"""The requests of a run, a sweep and a study, each made by one constructor (``checked``) that checks every
argument before anything computes, so the Python API and the CLI refuse the same input with the same
paragraph. The checks here import neither torch nor MLflow: a stored identical run is answered without them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BenchError
from .checks import (
    FOLDER_OR_NONE,
    METHOD,
    OBJECTIVE,
    PROTOCOL,
    SPACE,
    STORAGE,
    SWEEP,
    TEXT_OR_NONE,
    TRIALS,
    check_flags,
    check_kinds,
    seed_list,
)
from .execute import Tracking

if TYPE_CHECKING:
    from ..results.tuned import TunedStamp
    from ..spec.protocol import Protocol
    from ..sweep.plan import Sweep
    from ..sweep.tuning import TuneRequest as Study


def _results_root(results_dir: str | Path | None) -> Path:
    from ..paths import results_dir as resolve_results

    return resolve_results(Path(results_dir) if results_dir is not None else None)


@dataclass(frozen=True)
class RunRequest:
    """One run, checked: its protocol loaded, its settings parsed (a tuned entry's where ``tuned``), and the
    method, seed and outputs accepted. The backbone is not checked here: timm and torch load for it, so a
    caller that can answer from a stored run or announce the run does that first."""

    protocol: Protocol
    method: str
    seed: int
    settings: dict[str, object]
    stamp: TunedStamp | None  # the tuned entry the settings came from
    results_dir: Path
    tracking: Tracking
    rerun: bool = False
    save_predictions: bool = False

    @classmethod
    def checked(cls, protocol: str | Path, method: str, seed: int, overrides: Sequence[str],
                results_dir: str | Path | None, tracking: Tracking = Tracking(), *, tuned: bool = False,
                rerun: bool = False, save_predictions: bool = False) -> RunRequest:
        """``overrides``: the method's ``--set`` pairs (``key=value``); with ``tuned`` there must be none."""
        from ...methods.registry import parse_overrides
        from ..environment import check_environment
        from ..spec.protocol import load_protocol
        from ..tools.preflight import check_run

        check_kinds(protocol=(protocol, PROTOCOL), method=(method, METHOD), results_dir=(results_dir, FOLDER_OR_NONE),
                    tracking_uri=(tracking.uri, TEXT_OR_NONE))
        check_flags(tuned=tuned, rerun=rerun, mlflow=tracking.mlflow, save_predictions=save_predictions)
        settings = parse_overrides(list(overrides))
        check_environment()  # a malformed BENCH_* setting is refused with the request, before anything is announced
        spec = load_protocol(str(protocol))
        root = _results_root(results_dir)
        stamp = None
        if tuned:
            from ..results.tuned import load_entry
            from ..results.tuned import stamp as tuned_stamp

            if settings:
                raise BenchError("--tuned runs the tuned entry's settings as they are; drop --set (or tune again).")
            entry = load_entry(root, spec, method, str(protocol))
            settings, stamp = dict(entry.settings), tuned_stamp(entry)
        check_run(spec, method, seed, settings, root, tracking.uri, tracking.mlflow)
        return cls(spec, method, seed, settings, stamp, root, tracking, rerun, save_predictions)


@dataclass(frozen=True)
class SweepRequest:
    """A sweep, checked: its grid loaded, the seeds it runs (None: its own) and, unless a dry run, the outputs."""

    spec: Sweep
    seeds: list[int] | None
    results_dir: Path
    tracking: Tracking
    dry_run: bool = False

    @classmethod
    def checked(cls, sweep: str | Path, seeds: Sequence[int] | None, results_dir: str | Path | None,
                tracking: Tracking = Tracking(), *, dry_run: bool = False) -> SweepRequest:
        from ..sweep.plan import load_sweep
        from ..tools.preflight import check_outputs, check_seed

        check_kinds(sweep=(sweep, SWEEP), tracking_uri=(tracking.uri, TEXT_OR_NONE))
        check_flags(mlflow=tracking.mlflow)
        chosen = seed_list(seeds)
        spec = load_sweep(str(sweep))
        for seed in spec.seeds if chosen is None else chosen:
            check_seed(seed, "seed")
        root = _results_root(results_dir)
        if not dry_run:
            check_outputs(root, tracking.uri, tracking.mlflow)
        return cls(spec, chosen, root, tracking, dry_run)


@dataclass(frozen=True)
class TuneRequest:
    """A study, checked: the ruleset (``trials``, ``objective``: the protocol's own by default), the validation
    split, the method, the search space (``space``: instead of the method's own), the seed, the Optuna storage
    and the results folder. ``study`` is what the tuner runs."""

    study: Study
    results_dir: Path

    @classmethod
    def checked(cls, protocol: str | Path, method: str, *, trials: int | None = None, objective: str | None = None,
                seed: int = 0, storage: str | None = None, space: dict[str, object] | None = None,
                results_dir: str | Path | None = None) -> TuneRequest:
        from ...methods.registry import check_method
        from ..results.tuned import check_replaceable
        from ..spec.protocol import load_protocol
        from ..sweep.study_checks import check_storage
        from ..sweep.tuning import TuneRequest as Study
        from ..sweep.tuning import default_storage, ruleset, search_space
        from ..tools.preflight import check_outputs, check_seed

        check_kinds(protocol=(protocol, PROTOCOL), method=(method, METHOD), trials=(trials, TRIALS),
                    objective=(objective, OBJECTIVE), space=(space, SPACE), storage=(storage, STORAGE))
        spec = load_protocol(str(protocol))
        rules = ruleset(spec, trials, objective)  # before anything else: zero trials, an unknown objective
        spec.tuning_view()  # a protocol without a validation split cannot be tuned
        check_method(method, spec, {})
        chosen = search_space(method, spec, space)
        check_seed(seed)
        root = _results_root(results_dir)
        url = storage or default_storage(root)
        check_storage(url, root, given=storage is not None)
        check_outputs(root, None, False)
        check_replaceable(root, spec.name, method)
        return cls(Study(spec, method, rules, seed, url, chosen), root)
