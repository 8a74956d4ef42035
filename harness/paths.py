"""Where things go: results in the working directory, caches in the user's cache directory."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from .atomic import check_writable_folder
from .errors import BenchError


def results_dir(override: str | Path | None = None) -> Path:
    """Results and the MLflow store: --results-dir, else $BENCH_RESULTS_DIR, else ./bench-results."""
    folder = resolve_folder(results_dir_given(override), "results folder")
    site = site_root(folder)
    if site is not None:
        raise BenchError(f"The results folder {folder} is {'' if site == folder else 'inside '}a leaderboard site "
                         f"({site}, which `bench leaderboard build` rebuilds from scratch); a site and a results "
                         f"folder are never the same place: pass another --results-dir. Nothing was read or written.")
    return folder


def results_dir_given(override: str | Path | None = None) -> Path:
    """The results folder as given (--results-dir, $BENCH_RESULTS_DIR or ./bench-results), unchecked."""
    return Path(override or os.environ.get("BENCH_RESULTS_DIR") or "bench-results")


def cache_dir_path() -> Path:
    """Deployed models and trunk features, keyed by spec hash: $BENCH_CACHE_DIR, else ~/.cache/bench."""
    base = os.environ.get("BENCH_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")) / "bench"
    return Path(base).expanduser()


def cache_dir() -> Path:
    """``cache_dir_path()``, created if needed."""
    path = cache_dir_path()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchError(f"The cache folder {path} cannot be created ({exc.strerror or exc}); set "
                         f"BENCH_CACHE_DIR to a writable folder.") from None
    return path


SITE_MARKER = ".bench-leaderboard"  # the file a leaderboard site carries: it lists the files the build wrote
# files only a results folder holds (its MLflow store, its studies); generic folder names such as
# checkpoints/ are no evidence, as many projects have one
RESULT_PARTS = ("mlflow.db", "tuning/optuna.db")


def bytes_under(root: Path) -> int:
    """Bytes in the files under ``root``, counted while other processes may write there: a run sharing the
    cache renames its temporary files and folders into place, so an entry listed a moment ago may be gone;
    what vanished (or cannot be read) is not counted, and the count never fails for it."""
    total = 0
    for folder, _, files in os.walk(root):  # a folder that vanished before it was read is skipped
        for name in files:
            try:
                st = os.stat(os.path.join(folder, name))  # a link counts what it points to, as a file does
            except OSError:  # gone since the folder was listed, a link to nothing, or unreadable
                continue
            total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


def resolve_folder(path: Path, what: str) -> Path:
    """``path`` made absolute with its links followed; a symlink loop (or a name the system refuses) is
    named as what it is instead of surfacing as Python's RuntimeError."""
    try:
        return Path(path).expanduser().resolve(strict=False)
    except (RuntimeError, OSError) as exc:
        reason = "is a symlink loop" if "loop" in str(exc).lower() else f"cannot be used ({exc})"
        raise BenchError(f"The {what} {path} {reason}; pass a real folder. Nothing was read or written.") from None


def site_root(folder: Path) -> Path | None:
    """The leaderboard site ``folder`` is or lies inside (the nearest folder carrying the site marker)."""
    for candidate in (folder, *folder.parents):
        try:
            if (candidate / SITE_MARKER).is_file():
                return candidate
        except OSError:  # a name the system refuses (too long): no site there; the folder checks name it
            continue
    return None


def results_content(folder: Path) -> str | None:
    """What in ``folder`` shows it holds results (an MLflow store, a study database, stored run JSONs), else
    None: a leaderboard site holds only its flat ``runs/<slug>.json`` copies, a results folder
    ``runs/<protocol>/<method>/*.json``. A folder that cannot be listed shows nothing."""
    try:
        for name in RESULT_PARTS:
            if (folder / name).is_file():
                return f"{folder / name}"
        for protocol in (folder / "runs").iterdir():
            if protocol.is_dir() and not protocol.is_symlink():
                for method in protocol.iterdir():
                    if method.is_dir() and any(method.glob("*.json")):
                        return f"stored results in {method}"
    except OSError:
        pass
    return None


def check_output_file(path: Path, option: str, results: Path | None = None, inputs: Sequence[Path] = ()) -> Path:
    """A file a command writes beside its results (a table, a figure) may replace an earlier one of its
    kind, but never a folder, a file in a results folder or a leaderboard site (bench's own stores, which
    hold what runs computed), or one of the command's own ``inputs``. Checked before any compute; returns
    the path with links followed."""
    given, path = path, resolve_folder(path, option)
    if path.is_dir():
        raise BenchError(f"{option} {given} is a folder; name the file to write (nothing has run).")
    stores = [resolve_folder(results, "results folder")] if results is not None else []
    for folder in path.parents:
        content = results_content(folder)
        found = (f"a results folder ({content})" if content is not None
                 else f"a leaderboard site ({folder})" if site_root(folder) == folder
                 else f"the results folder {folder}" if folder in stores else None)
        if found is not None:
            raise BenchError(f"{option} {given} lies inside {found}, which keeps bench's stored work; write it "
                             f"somewhere else (nothing has run).")
    for source in inputs:
        if resolve_folder(source, "input") == path:
            raise BenchError(f"{option} {given} is the command's own input {source}; name another file "
                             f"(nothing has run).")
    check_writable_folder(path.parent, f"folder of {option}", 0)
    return path


_announced: set[Path] = set()  # new stores said once per process (a sweep checks its store per run)


def check_store_place(path: Path, what: str, shown: str, remedy: str) -> bool:
    """The one rule for a store a command writes and the user named (an MLflow tracking store, an Optuna
    study database; ``path``: its file, or a file store's folder): the folder it lies in must exist. bench
    makes no folder for a store the user names, because a typo in the path would start a new, empty store
    there, and every run mirrored into it would be missing from the store the user reads. A new store in
    a folder that exists is how one asks for a new store: allowed, and said (``announce_new_store``, once
    the caller's other checks of it pass). ``shown``: the option as given, which begins the refusal;
    ``remedy``: what the user can do instead, ending the paragraph. Returns whether the store is new. The
    stores bench picks itself, inside the results folder it writes anyway, are not checked here: they are
    created as needed."""
    folder = Path(os.path.abspath(path.expanduser())).parent
    if not folder.exists():
        raise BenchError(f"{shown}: the folder {folder} does not exist. bench makes no folder for a {what} you name "
                         f"(a typo in the path would start a new, empty store and scatter the runs into it); "
                         f"{remedy}")
    return not os.path.lexists(path.expanduser())


def announce_new_store(path: Path, what: str, shown: str) -> None:
    """One line on stderr, once per process (a sweep checks its store for every run): a store the user
    named is not there yet and is created, so a misspelt file name is seen before the runs go into it."""
    if path not in _announced:
        _announced.add(path)
        print(f"Note: a new {what} {path} is created ({shown} names none that exists yet).", file=sys.stderr)
