"""Where the leaderboard reads RunResult JSON from: a results folder, or an MLflow tracking store.

A file that is corrupt or not a bench result is skipped with a warning that names it; nothing here
raises for one bad file. Tuning trials (scored on the validation split) and tuned entries are read as
what they are, never as runs to rank. A missing folder or an unusable tracking store is a ``BenchError``.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..harness.errors import BenchError, without_foreign_page
from ..harness.results.schema import RunResult, iter_results, load_result, scan_results, scored_on
from ..harness.results.tuned import entry_problem, is_entry_path
from .aggregate import Entry, MlflowLink

Warn = Callable[[str], None]


@dataclass
class Loaded:
    """The runs found, and what was skipped (``(source, reason)``) on the way."""

    origin: str
    entries: list[Entry] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    tracking_uri: str | None = None
    trials: list[str] = field(default_factory=list)  # tuning trials read (scored on validation), never entries
    _by_id: dict[str, Entry] = field(default_factory=dict, repr=False)

    def add(self, entry: Entry, warn: Warn) -> None:
        """Keep the first copy of a run id; a second file with the same run is skipped (and said)."""
        other = self._by_id.get(entry.run_id)
        if other is not None:
            self.skip(entry.source, f"duplicate of run {entry.run_id} already read from {other.source}", warn)
            return
        self._by_id[entry.run_id] = entry
        self.entries.append(entry)

    def skip(self, source: str, reason: str, warn: Warn) -> None:
        self.skipped.append((source, reason))
        warn(f"skipped {source}: {reason}")


def _ignore(_: str) -> None:
    return None


# ------------------------------------------------------------------------------- results folder


def _mlflow_index(db: Path) -> dict[str, MlflowLink]:
    """bench run id -> MLflow run, read from the sqlite store ``bench run`` writes beside the results.

    Read-only and best effort: the leaderboard must build without MLflow, so any problem (no store,
    another schema) just means no links.
    """
    if not db.is_file():
        return {}
    try:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=2)
        try:
            rows = con.execute(
                "SELECT t.value, r.run_uuid, r.experiment_id FROM tags t JOIN runs r ON r.run_uuid = t.run_uuid "
                "WHERE t.key = 'bench.run_id' AND r.lifecycle_stage = 'active' ORDER BY r.start_time"
            ).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return {}
    uri = f"sqlite:///{db.resolve()}"
    return {str(bench_id): MlflowLink(str(run), str(exp), uri) for bench_id, run, exp in rows}


def load_folder(root: Path, warn: Warn = _ignore, with_trials: bool = False) -> Loaded:
    """Every ``*.json`` under ``root/runs`` (the layout ``bench run`` writes), else under ``root``. Tuning
    trials are listed apart (``Loaded.trials``), or read as entries ``with_trials`` (to recompute a
    trial's metrics against the references beside it, never to rank it)."""
    root = Path(root).expanduser()
    if not root.is_dir():
        what = "is a file, not a folder" if root.exists() else "does not exist"
        raise BenchError(f"Results folder {root} {what}: run `bench run ...` first, or name the folder that holds "
                         f"the results.")
    loaded = Loaded(origin=f"results folder {root.resolve()}")
    # the layout bench run writes, else a folder of JSON files copied from somewhere; junk (symlinks,
    # folders named *.json, unreadable entries) is skipped with a warning naming it
    found = scan_results(root / "runs" if (root / "runs").is_dir() else root,
                         lambda path, reason: loaded.skip(str(path), reason, warn))
    links = _mlflow_index(root / "mlflow.db")
    if links:
        loaded.tracking_uri = next(iter(links.values())).tracking_uri
    for path, item in found:
        if isinstance(item, RunResult) and not with_trials and scored_on(item, path) == "validation":
            loaded.trials.append(str(path))  # never an entry: ``set_trials_apart`` says what they are
        elif isinstance(item, RunResult):
            loaded.add(Entry(result=item, source=str(path), mlflow=links.get(item.run_id)), warn)
        elif is_entry_path(path):  # the folder's tuned settings (bench tune), which are no run result
            if (why := entry_problem(path)) is not None:
                loaded.skip(str(path), why, warn)
        else:
            loaded.skip(str(path), _reason(item, path), warn)
    return loaded


def set_trials_apart(loaded: Loaded, root: Path, warn: Warn = _ignore) -> None:
    """Tuning trials are scored on the validation split to pick settings: ranked as a board they would read as
    test results. A folder of nothing else (what bench tune leaves in a fresh results folder, or its trials
    folder itself) is refused, naming it; beside test runs they are left out, said once."""
    if not loaded.trials:
        return
    if not loaded.entries:
        raise BenchError(f"{root} holds only tuning trials ({len(loaded.trials)} run(s) that bench tune scored on "
                         f"the validation split to pick settings, e.g. {loaded.trials[0]}), and the leaderboard never "
                         f"ranks those as a board. Give the results folder whose runs/ bench run or bench sweep wrote "
                         f"(the tuned settings run on the test split with `bench run --tuned`).")
    folders = sorted({str(Path(t).parent.parent.parent) for t in loaded.trials})
    warn(f"left out {len(loaded.trials)} tuning trial(s) under {', '.join(folders)}: bench tune scored them on the "
         f"validation split, and they are never ranked")


def _reason(err: BaseException, path: Path) -> str:
    """The error without the file name repeated (the warning names it already)."""
    text = str(err)
    prefix = f"Result file {path} is corrupt or not a bench result: "
    return f"corrupt or not a bench result ({text[len(prefix):]})" if text.startswith(prefix) else text


# ------------------------------------------------------------------------------------- MLflow


def load_mlflow(tracking_uri: str, warn: Warn = _ignore) -> Loaded:
    """The RunResult JSON artifact of every MLflow run tagged ``bench.json``.

    ``bench run`` logs the CL run but not the joint reference it trained (that is cached as a JSON
    file); a joint run named by a CL run's ``references.joint_run`` that is not in MLflow is read from
    the results folder the CL run's ``bench.json`` tag points into, when that folder is reachable.
    """
    from ..harness.results.tracking import import_mlflow

    mlflow = import_mlflow()  # configured to fail fast: a dead server errors in seconds, not minutes
    from mlflow.entities import Run, ViewType
    from mlflow.tracking import MlflowClient

    loaded = Loaded(origin=f"MLflow tracking store {tracking_uri}", tracking_uri=tracking_uri)
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///"):])
        if not db.is_file():  # MLflow would create an empty store there: say it instead
            raise BenchError(f"MLflow tracking store {tracking_uri}: no database file at {db}.")
    try:
        client = MlflowClient(tracking_uri=tracking_uri)
        experiments = client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
        runs: list[Run] = []
        token = None
        ids = [e.experiment_id for e in experiments]
        while ids:
            page = client.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                break
    except mlflow.exceptions.MlflowException as exc:
        raise BenchError(f"MLflow tracking store {tracking_uri} cannot be read: "
                         f"{without_foreign_page(exc.message)}") from None
    except Exception as exc:  # noqa: BLE001 - MLflow raises many kinds for a bad URI
        raise BenchError(f"MLflow tracking store {tracking_uri} cannot be read: "
                         f"{without_foreign_page(str(exc))}") from None

    local_roots: set[Path] = set()
    with tempfile.TemporaryDirectory(prefix="bench-leaderboard-") as tmp:
        for run in sorted(runs, key=lambda r: r.info.start_time or 0):
            tags = run.data.tags
            if "bench.json" not in tags:
                continue
            rid = run.info.run_id
            source = f"mlflow run {rid}"
            try:
                names = [a.path for a in client.list_artifacts(rid) if a.path.endswith(".json") and not a.is_dir]
            except Exception as exc:  # noqa: BLE001
                loaded.skip(source, f"its artifacts cannot be listed: {exc}", warn)
                continue
            if not names:
                loaded.skip(source, "tagged bench.json but has no JSON artifact", warn)
                continue
            try:
                local = Path(client.download_artifacts(rid, names[0], os.path.join(tmp, rid)))
            except Exception as exc:  # noqa: BLE001
                loaded.skip(source, f"its JSON artifact cannot be downloaded: {exc}", warn)
                continue
            source = f"mlflow run {rid} artifact {names[0]}"
            try:
                result = load_result(local)
            except BenchError as err:
                loaded.skip(source, _reason(err, local), warn)
                continue
            link = MlflowLink(rid, run.info.experiment_id, tracking_uri)
            loaded.add(Entry(result=result, source=source, mlflow=link), warn)
            tag_path = Path(tags["bench.json"])
            if len(tag_path.parents) >= 4 and tag_path.parents[2].name == "runs":
                local_roots.add(tag_path.parents[3])

    _add_local_joints(loaded, local_roots, warn)
    return loaded


def _add_local_joints(loaded: Loaded, roots: set[Path], warn: Warn) -> None:
    have = {e.run_id for e in loaded.entries}
    wanted = {e.result.references.joint_run for e in loaded.entries
              if e.result.references and e.result.references.joint_run} - have
    protocols = {e.result.protocol.name for e in loaded.entries}
    if not wanted:
        return
    for root in sorted(roots):
        if not (root / "runs").is_dir():
            continue
        for protocol in sorted(protocols):
            for path, item in iter_results(root, protocol, lambda p, why: loaded.skip(str(p), why, warn)):
                if isinstance(item, RunResult) and item.is_reference and item.run_id not in have:
                    have.add(item.run_id)
                    loaded.add(Entry(result=item, source=str(path),
                                     note="joint reference read from the results folder "
                                          "(bench run does not log it to MLflow)"),
                               warn)


def load(results: Path | None = None, tracking_uri: str | None = None, warn: Warn = _ignore) -> Loaded:
    """Results from exactly one place: a folder (default ./bench-results) or an MLflow store."""
    if results is not None and tracking_uri is not None:
        raise BenchError("Give either --results DIR or --tracking-uri URI, not both.")
    if tracking_uri is not None:
        return load_mlflow(tracking_uri, warn)
    from ..harness.paths import results_dir

    root = results_dir(results)
    loaded = load_folder(root, warn)
    set_trials_apart(loaded, results or root, warn)
    return loaded
