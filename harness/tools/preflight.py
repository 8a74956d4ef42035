"""Checks run before any compute: a bad folder, a full disk, a tracking URI that cannot work, a typo in a
method string or a setting must cost the user a second, not an hour of training and a traceback.

The cheap checks (``check_run``) import neither torch nor MLflow; ``check_backbone`` needs timm and
torch and runs after them, still before any data is opened or a model trained. The CLI calls both;
the sweep calls them once per planned run.
"""

from __future__ import annotations

import json
import numbers
import os
import socket
import sqlite3
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from ..atomic import check_writable_folder  # noqa: F401 - the probe lives with the writes it protects
from ..errors import BenchError, not_a_file
from ..paths import announce_new_store, check_store_place
from ..results.tracking import default_tracking_uri, import_mlflow, sqlite_path
from ..spec.protocol import MAX_SEED, MAX_UPDATES, Protocol

if TYPE_CHECKING:
    from ..model.backbone import SplitModel

# Space the outputs need at least: a result JSON is tens of KB and the MLflow store grows by about as
# much per run, so the floor for results is generous; a cache holds a deployed model and trunk-feature
# tables (tens of MB for the embedded protocols; more for paper scale, which its own guard checks).
RESULTS_MIN_FREE = 64 << 20
CACHE_MIN_FREE = 256 << 20
REACH_TIMEOUT_S = 5.0
# schemes MLflow's tracking stores accept (plain paths are a file store)
# the joint upper bound: where the harness trains it itself rather than as an entry-point method, the
# pipeline checks a request for it (no modifiers, no --set)
REFERENCE = "joint"
TRACKING_SCHEMES = ("sqlite", "file", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def check_seed(seed: int, what: str = "--seed") -> None:
    """A seed is an integer in numpy's range. From Python a str, float or bool would pass a range check (or
    fail deep in numpy's seeding), and True would even train, as seed 1 under another name."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise BenchError(f"{what} {seed!r} is a {type(seed).__name__}; a seed is an integer, e.g. 0.")
    if not 0 <= seed <= MAX_SEED:
        raise BenchError(f"{what} {seed} is outside 0..{MAX_SEED} (numpy's seeding range, with room for the "
                         f"per-session offsets of the joint reference).")




# how a refusal of a tracking store ends (``bench sync`` words it for itself: it has no --no-mlflow)
STORE_REMEDY = ("create the folder first for a new store or pass another --tracking-uri, or --no-mlflow; "
                "nothing has run.")


def _check_sqlite(uri: str, given: bool) -> None:
    db = sqlite_path(uri)
    if db.is_dir():
        raise BenchError(f"Tracking URI {uri!r} points at the folder {db}; it must name a database file, "
                         f"e.g. sqlite:///{db / 'mlflow.db'}.")
    new = given and check_store_place(db, "MLflow store", f"Tracking URI {uri!r}", STORE_REMEDY)
    check_writable_folder(db.parent, "folder of the MLflow database", RESULTS_MIN_FREE)
    if db.exists():
        try:
            con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=REACH_TIMEOUT_S)
            try:
                con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise BenchError(f"Tracking URI {uri!r}: {db} is not an SQLite database ({exc}). Move it aside, pass "
                             f"another --tracking-uri, or --no-mlflow; nothing has run.") from None
    if new:
        announce_new_store(db, "MLflow store", f"Tracking URI {uri!r}")


def _check_file_store(uri: str, folder: Path) -> None:
    """A file store's folder can be written, and this MLflow writes file stores: MLflow 3 refuses them unless
    MLFLOW_ALLOW_FILE_STORE=true, which a run found only when it mirrored its result, after training. Always
    one the user named: its parent folder must exist (``check_store_place``)."""
    new = check_store_place(folder, "MLflow file store", f"Tracking URI {uri!r}", STORE_REMEDY)
    mlflow = import_mlflow()
    from mlflow.store.tracking.file_store import FileStore

    try:  # MLflow refuses in the constructor, before it touches the disk: a refusal leaves no folder behind
        FileStore(str(folder), str(folder))
    except OSError:
        pass  # a folder it cannot make: the writable check below says why
    except mlflow.exceptions.MlflowException as exc:
        reason = exc.message.strip().split(". ")[0]
        raise BenchError(f"Tracking URI {uri!r}: MLflow {mlflow.__version__} does not write this file store "
                         f"({reason}). Use a database store, e.g. sqlite:///{folder / 'mlflow.db'} (`mlflow "
                         f"migrate-filestore` moves an existing one), set MLFLOW_ALLOW_FILE_STORE=true, or pass "
                         f"--no-mlflow; nothing has run.") from None
    check_writable_folder(folder, "MLflow file store", RESULTS_MIN_FREE)
    if new:
        announce_new_store(folder, "MLflow file store", f"Tracking URI {uri!r}")


def _check_server(uri: str, timeout: float) -> None:
    """An MLflow server answers within ``timeout``, and it is MLflow: an API call (experiment lookup by
    name) must answer in MLflow's JSON, so a web server that is something else is refused before compute,
    not after it. A server asking for credentials (401/403) is taken as it is: the MLflow client sends them."""
    url = uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - http(s) only, checked above
            status, body = answer.status, answer.read(1 << 16)
    except urllib.error.HTTPError as err:
        status, body = err.code, err.read(1 << 16) if err.fp else b""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise BenchError(f"The MLflow server {uri} cannot be reached within {timeout:.0f} s ({reason}). Start it, "
                         f"pass another --tracking-uri, or --no-mlflow; nothing has run.") from None
    if status in (401, 403):
        return
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not (isinstance(data, dict) and ("experiment" in data or "error_code" in data)):
        raise BenchError(f"{uri} answers HTTP ({status}) but is not an MLflow tracking server: its MLflow API "
                         f"(/api/2.0/mlflow/experiments/get-by-name) gave no MLflow answer. Check the host and "
                         f"port, pass another --tracking-uri, or --no-mlflow; nothing has run.")


def _check_host(uri: str, parsed: urllib.parse.ParseResult, timeout: float) -> None:
    if parsed.hostname:
        try:
            socket.create_connection((parsed.hostname, parsed.port or 5432), timeout=timeout).close()
        except OSError as exc:
            raise BenchError(f"The tracking database server of {uri!r} cannot be reached within {timeout:.0f} s "
                             f"({exc.strerror or exc}); nothing has run.") from None


def check_tracking_uri(uri: str | None, timeout: float = REACH_TIMEOUT_S, given: bool = True) -> None:
    """A tracking URI MLflow can use, reachable now (None: the sqlite store in the results folder,
    which ``check_writable_folder`` covers). ``given``: the user named it (not the results folder's default
    store), so a database file must lie in a folder that exists (``check_store_place``)."""
    if uri is None:
        return
    if not uri.strip() or any(c.isspace() for c in uri):
        raise BenchError(f"Tracking URI {uri!r} is empty or contains whitespace.")
    parsed = urllib.parse.urlparse(uri)
    scheme = parsed.scheme.split("+", 1)[0]  # postgresql+psycopg2://
    if scheme == "" or (len(scheme) == 1 and uri[1:3] in (":\\", ":/")):  # a plain path (or C:\ path)
        _check_file_store(uri, Path(uri).expanduser())
        return
    if scheme not in TRACKING_SCHEMES:
        raise BenchError(f"Tracking URI {uri!r} has the unknown scheme {parsed.scheme!r}; use one of "
                         f"{', '.join(s + ':' for s in TRACKING_SCHEMES)} or a folder path.")
    if scheme == "sqlite":
        _check_sqlite(uri, given)
    elif scheme == "file":
        _check_file_store(uri, Path(urllib.parse.unquote(parsed.path)))
    elif scheme in ("http", "https"):
        if not parsed.hostname:
            raise BenchError(f"Tracking URI {uri!r} names no host, e.g. http://127.0.0.1:5000.")
        _check_server(uri, timeout)
    elif scheme in ("postgresql", "mysql", "mssql"):
        _check_host(uri, parsed, timeout)


def check_run(protocol: Protocol, method: str, seed: int, overrides: dict[str, object], results_dir: Path,
              tracking_uri: str | None, mlflow: bool) -> None:
    """Everything about one run that can be checked without torch or MLflow, in the order a user
    would fix them: method and settings, seed, the protocol's reference methods, folders and free space,
    tracking store."""
    _check_method_request(method, protocol, overrides)
    check_seed(seed)
    check_references(protocol)
    check_outputs(results_dir, tracking_uri, mlflow)


def _check_method_request(method: str, protocol: Protocol, overrides: dict[str, object]) -> None:
    from ...methods.registry import METHOD_GROUP, check_method, entries
    from ..run.joint_request import check_joint_request

    if method.split("+")[0] != REFERENCE or REFERENCE in entries(METHOD_GROUP):
        check_method(method, protocol, overrides)
    else:
        check_joint_request(method, overrides)


def check_references(protocol: Protocol) -> None:
    """Every method of ``best_new_reference`` can run here: a run trains the missing ones after the
    deployed model and the joint reference, so a typo found then would have cost both."""
    for method in protocol.best_new_reference:
        try:
            _check_method_request(method, protocol, {})
        except BenchError as exc:
            raise BenchError(f"Protocol {protocol.name}: best_new_reference names {method!r}, which cannot run "
                             f"here: {exc}") from None


def check_outputs(results_dir: Path, tracking_uri: str | None, mlflow: bool) -> None:
    """Where a run writes: results and cache folders writable with room, the tracking store usable."""
    from ..paths import cache_dir_path

    check_writable_folder(results_dir, "results folder", RESULTS_MIN_FREE)
    check_writable_folder(cache_dir_path(), "cache folder ($BENCH_CACHE_DIR)", CACHE_MIN_FREE)
    if mlflow:
        check_store(results_dir, tracking_uri)


def check_store(results_dir: Path, tracking_uri: str | None) -> None:
    """The tracking store a command mirrors ``results_dir`` to can be used. The default one, the results
    folder's mlflow.db, is checked as a given sqlite URI is, and must keep its artifacts in this folder."""
    if tracking_uri is not None:
        check_tracking_uri(tracking_uri)
        return
    check_tracking_uri(default_tracking_uri(results_dir), given=False)
    db = results_dir / "mlflow.db"
    home = (results_dir / "mlartifacts").resolve()
    for name, where in _artifact_locations(db):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(where).path)) if where.startswith("file:") else None
        if path is not None and path.resolve() != home and home not in path.resolve().parents:
            raise BenchError(
                f"The MLflow store {db} keeps the artifacts of experiment {name} in {path}, outside this "
                f"results folder: the folder was copied or moved, and its runs would be written into the other one. "
                f"Move {db.name} aside (the result JSONs are the record: `bench sync --results-dir "
                f"{results_dir}` mirrors them into a new store), or pass --no-mlflow; nothing has run.")


def _artifact_locations(db: Path) -> list[tuple[str, str]]:
    """bench's experiments in an MLflow sqlite store and where each keeps its artifacts (read-only,
    without MLflow, which costs seconds to import)."""
    if not db.is_file():
        return []
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=REACH_TIMEOUT_S)
    try:
        return con.execute("SELECT name, artifact_location FROM experiments WHERE name LIKE 'bench/%'").fetchall()
    except sqlite3.Error:  # a store MLflow has not set up yet: it creates the tables, and the experiments
        return []
    finally:
        con.close()


def weights_file(protocol: Protocol) -> Path | None:
    """The backbone's ``file:`` weights, checked to be a file (None for other weights); the weights' kind is
    checked too. Torch-free: ``bench validate`` answers these without building anything."""
    kind, _, ref = protocol.backbone.weights.partition(":")
    if kind not in ("package", "file", "timm", "none"):
        raise BenchError(f"backbone.weights {protocol.backbone.weights!r} must start with package:, file:, timm: or "
                         f"none:.")
    if kind != "file":
        return None
    path = Path(os.path.expandvars(ref)).expanduser()
    if (problem := not_a_file(path)) is not None:
        raise BenchError(f"backbone.weights file {path} {problem}.")
    return path


def check_backbone(protocol: Protocol) -> None:
    """The backbone exists in timm and ``file:`` weights load as a state dict: needs torch, so it runs
    after the cheap checks, still before any data is read or anything trains."""
    import timm
    import torch

    spec = protocol.backbone
    kind, _, ref = spec.weights.partition(":")
    for field, name in (("backbone.model", spec.model), ("backbone.weights", ref if kind == "timm" else None)):
        if name is not None and not timm.is_model(name):
            import difflib

            close = difflib.get_close_matches(name, timm.list_models(), n=3, cutoff=0.6)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            raise BenchError(f"{field} {name!r} of protocol {protocol.name} is not a timm model.{hint}")
    weights_file(protocol)  # the kind, before the budget's price
    check_flop_budget(protocol)
    if (path := weights_file(protocol)) is None:
        return
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickle, zip and torch errors alike mean "not loadable"
        raise BenchError(f"backbone.weights file {path} cannot be loaded as PyTorch weights "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}).") from None
    if isinstance(state, dict) and "state_dict" in state:
        state = state["state_dict"]
    if not (isinstance(state, dict) and state and all(isinstance(v, torch.Tensor) for v in state.values())):
        raise BenchError(f"backbone.weights file {path} holds a {type(state).__name__}, not a state dict "
                         f"(a mapping of parameter names to tensors).")


def check_flop_budget(protocol: Protocol) -> int | None:
    """A FLOP budget must pay for one update of the cheapest method there is (output-only training, every
    part forward and the head's backward on one batch, priced by the FLOP meter's convention on the
    protocol's network; random init: the price depends on the architecture only), and may buy no more
    of them than ``training.updates`` may ask for. Returns that most a session can make (None: no budget)."""
    budget = protocol.training.budget
    if budget is None:
        return None
    spec = protocol.backbone
    batch = protocol.training.batch.size
    cheapest = _cheapest_update_tflops(protocol)
    if budget.tflops < cheapest:
        raise BenchError(
            f"training.budget.tflops ({budget.tflops:g}) of protocol {protocol.name} is smaller than one update of "
            f"the cheapest method: output-only training on a batch of {batch} costs {cheapest:.3g} TFLOPs on "
            f"{spec.model} at {spec.input_size} px (every part forward, the head backward). Give a budget of at "
            f"least a few updates.")
    most = int(budget.tflops // cheapest)
    if most > MAX_UPDATES:
        raise BenchError(
            f"training.budget.tflops ({budget.tflops:g}) of protocol {protocol.name} buys up to {most:,} updates a "
            f"session (output-only training on a batch of {batch} costs {cheapest:.3g} TFLOPs on {spec.model}), "
            f"more than the {MAX_UPDATES:,} training.updates may ask for; give a smaller budget.")
    return most


_CHEAPEST: dict[str, float] = {}  # by protocol spec hash: the network is built once per process


def architecture(protocol: Protocol) -> SplitModel:
    """The protocol's network in random init, split as a run splits it (a ``SplitModel``): the split's checks
    (the parts exist, connect into one network, the LoRA targets are modules of the body) and the FLOP price
    depend on the architecture only, so neither waits for the weights."""
    from ..model.backbone import create_network, split_network

    spec = protocol.backbone.model_copy(update={"weights": "none:"})
    return split_network(create_network(spec), spec, protocol.pretrain_data.num_classes)


def _cheapest_update_tflops(protocol: Protocol) -> float:
    """TFLOPs of one output-only update on the protocol's network (see ``check_flop_budget``)."""
    if protocol.spec_hash not in _CHEAPEST:
        from ..model import flops as FL

        model = architecture(protocol)
        spec = protocol.backbone
        for part in (model.trunk, model.body):
            part.requires_grad_(False)
        shape: tuple[int, ...] = (spec.in_chans, spec.input_size, spec.input_size)
        per_sample = 0.0
        for name in FL.PARTS:
            cost = FL.part_cost(getattr(model, name), shape)
            per_sample, shape = per_sample + cost.forward + cost.backward, cost.out_shape
        _CHEAPEST[protocol.spec_hash] = FL.flops(protocol.training.batch.size * per_sample) / 1e12
    return _CHEAPEST[protocol.spec_hash]
