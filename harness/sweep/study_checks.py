"""What ``bench tune`` checks before an Optuna study is created or opened: the search space (every range a
valid value of the method's settings and a distribution Optuna accepts), the study storage (a URL whose
driver is installed, a writable place, and no other program's database), and that a stored study samples
the same space. A study Optuna cannot read back, or tables written into an MLflow store, would break
every later tune; these checks refuse first, naming what is wrong, and write nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from ..errors import BenchError, shorten

if TYPE_CHECKING:
    import optuna
    from optuna.distributions import BaseDistribution

    from ...methods.configs import Dim, SearchSpace

CHOICE_TYPES = (str, int, float, bool, type(None))  # what Optuna's CategoricalDistribution stores
MLFLOW_TABLES = {"experiments", "runs", "metrics", "params"}


def space_key(space: SearchSpace) -> str:
    """A short hash of the space: part of the study's name, so another space is another study."""
    canon = {k: {"low": d.low, "high": d.high, "log": d.log, "choices": d.choices} for k, d in sorted(space.items())}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_dim(key: str, dim: Dim) -> None:
    """One dimension by Optuna's rules: finite numbers with low < high (low > 0 on a log scale), or a
    non-empty list of plain values, never both (one of them would be silently ignored)."""
    if dim.choices is not None:
        if dim.low is not None or dim.high is not None or dim.log:
            raise BenchError(shorten(f"The search space's {key!r} gives both choices and a range (low={dim.low!r}, "
                                     f"high={dim.high!r}, log={dim.log!r}); give one or the other."))
        listed = isinstance(dim.choices, tuple)  # a given list arrives as a tuple; anything else is not a list
        bad = [c for c in dim.choices
               if not isinstance(c, CHOICE_TYPES) or isinstance(c, float) and not math.isfinite(c)] if listed else []
        if not listed or not dim.choices or bad:
            shown = list(dim.choices) if listed else dim.choices
            raise BenchError(shorten(f"The search space's {key!r} needs choices as a non-empty list of plain values "
                                     f"(numbers, strings, true/false), got choices {shown!r}."))
        return
    if not (_number(dim.low) and _number(dim.high)) or not isinstance(dim.log, bool):
        raise BenchError(shorten(f"The search space's {key!r} needs finite numbers low and high (and log: true or "
                                 f"false), got low={dim.low!r}, high={dim.high!r}, log={dim.log!r}."))
    if not dim.low < dim.high or dim.log and dim.low <= 0:
        raise BenchError(f"The search space's {key!r} needs low < high (and low > 0 on a log scale), got {dim}.")


def typed_range(key: str, dim: Dim, sample: object) -> Dim:
    """The range ``dim`` as the setting's type needs it (``sample``: the setting's value at ``dim.low``, as
    its settings model stores it): integer bounds, sampled as integers, for an integer setting (a float
    bound would let Optuna propose 3.7 and fail the trial after its compute), float bounds for any other;
    a true/false setting takes choices, not a range."""
    if isinstance(sample, bool):
        raise BenchError(f"The search space's {key!r} is a true/false setting: give it choices: [true, false], "
                         f"not a range.")
    if isinstance(sample, int):
        if not (isinstance(dim.low, int) and isinstance(dim.high, int)):
            raise BenchError(f"The search space's {key!r} is an integer setting: its range needs integer bounds, "
                             f"got low={dim.low!r}, high={dim.high!r}.")
        return dim
    # check_dim passed: a range has both bounds
    return dataclasses.replace(dim, low=float(cast(float, dim.low)), high=float(cast(float, dim.high)))


def check_values(key: str, dim: Dim, valid: Callable[[str, object], object]) -> None:
    """Every value the dimension can give is one the method's settings accept: ``valid(key, value)``
    raises the settings' BenchError; it is re-raised naming the space entry."""
    values = list(dim.choices) if dim.choices is not None else [dim.low, dim.high]
    for value in values:
        try:
            valid(key, value)
        except BenchError as err:
            raise BenchError(shorten(f"The search space's {key!r} includes {value!r}, which the method's settings "
                                     f"refuse: {err}")) from None


def same_space(study: optuna.Study, name: str, distributions: Mapping[str, BaseDistribution], storage: str) -> None:
    """A stored study's trials sampled the distributions asked for now; else refuse, naming both."""
    for trial in study.get_trials(deepcopy=False):
        stored = dict(trial.distributions)
        if stored and stored != distributions:
            raise BenchError(shorten(
                f"Study {name} in {storage} was sampled over {_describe(stored)}, not the space asked for now "
                f"({_describe(distributions)}); nothing was changed. Give the study's own space, or another "
                f"--storage for a new study."))
        if stored:
            return


def _describe(distributions: Mapping[str, BaseDistribution]) -> str:
    return "; ".join(f"{k}: {d!r}" for k, d in sorted(distributions.items()))


def check_storage(url: str, results_dir: Path, given: bool = True) -> None:
    """A study storage (``--storage``, or the default one when not ``given``): a database URL SQLAlchemy
    parses, whose driver is installed; for SQLite a file path (not memory) in a writable folder (one that
    exists, when ``given``: ``paths.check_store_place``), never the results folder's MLflow store nor any
    database that is not Optuna's. Nothing is created."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    shown = f"--storage {shorten(url)}" if given else f"The default study storage {shorten(url)}"
    try:
        parsed = make_url(url)
        dialect = parsed.get_dialect()
        # the driver itself is imported only when a study connects: import it now (SQLAlchemy 1.4: dbapi)
        # dynamic: SQLAlchemy 2 types dbapi as a module attribute, where 1.4 has the classmethod called here
        load_driver: Any = dialect.import_dbapi if hasattr(dialect, "import_dbapi") else dialect.dbapi
        load_driver()
    except NoSuchModuleError:  # before ArgumentError, its base class
        raise BenchError(f"{shown}: no database driver for {parsed.drivername!r} is installed; give "
                         f"e.g. sqlite:///path/optuna.db. Nothing was written.") from None
    except (ArgumentError, ValueError) as exc:
        raise BenchError(f"{shown} is not a database URL ({exc}); give e.g. sqlite:///path/optuna.db. "
                         f"Nothing was written.") from None
    except ImportError as exc:
        module = f" {exc.name!r}" if exc.name else ""
        raise BenchError(f"{shown}: its database driver{module} is not installed ({exc}); install the package that "
                         f"provides it, or use sqlite:///path/optuna.db. Nothing was written.") from None
    if parsed.get_backend_name() != "sqlite":
        return
    _check_sqlite_file(shown, parsed.database, results_dir, given)


def _check_sqlite_file(shown: str, database: str | None, results_dir: Path, given: bool) -> None:
    from ..atomic import check_writable_folder
    from ..errors import not_a_file
    from ..paths import announce_new_store, check_store_place, resolve_folder

    if not database or database == ":memory:" or database.startswith("file::memory:"):
        raise BenchError(f"{shown} is an in-memory database: the study would be lost when bench tune "
                         f"ends; give a file, e.g. sqlite:///path/optuna.db.")
    path = resolve_folder(Path(database), "study database")
    if path == resolve_folder(results_dir, "results folder") / "mlflow.db":
        raise BenchError(f"{shown} is the results folder's MLflow store; a study never goes into "
                         f"another program's database: use the default or another file. Nothing was written.")
    if path.exists():
        why = not_a_file(path)
        if why is not None:
            raise BenchError(f"{shown}: {path} {why}; move it aside or pick another storage.")
        _check_tables(shown, path)
    new = given and check_store_place(path, "study database", shown, "create the folder first for a new study or "
                                                                     "give another --storage. Nothing was written.")
    check_writable_folder(path.parent, "folder of the study database", 0)
    if new:
        announce_new_store(path, "study database", shown)


def _check_tables(shown: str, path: Path) -> None:
    """An existing SQLite file is empty or an Optuna study database."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise BenchError(f"{shown}: {path} is not an SQLite database ({exc}); move it aside or pick another "
                         f"storage. Nothing was written.") from None
    if tables and ("studies" not in tables or tables & MLFLOW_TABLES):
        owner = "MLflow's tracking store" if tables & MLFLOW_TABLES else "another program's database"
        raise BenchError(f"{shown}: {path} is {owner}, not an Optuna study database; a study never "
                         f"adds tables to it. Use the default or another file. Nothing was written.")
