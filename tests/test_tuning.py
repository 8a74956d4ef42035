"""Equal tuning: the validation split a tuning run is scored on (never the test split), and ``bench tune``
under a protocol's tuning ruleset, on the reduced embedded protocol (a few trials, seconds each)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from bench_stability_gap.harness.data import stream as stream_module
from bench_stability_gap.harness.data.sources import Split
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.run.isolation import train_view
from bench_stability_gap.harness.spec.protocol import load_protocol, parse_protocol
from bench_stability_gap.harness.data.stream import build_stream
from bench_stability_gap.harness.run.workbench import RunOptions
from support import invoke as run_cli, reduced_tiny


def with_validation(per_class: int = 5, **extra) -> dict:
    spec = reduced_tiny()
    spec["validation"] = {"per_class": per_class}
    spec.update(extra)
    return spec


@pytest.fixture()
def tunable(tmp_path, bench_cache) -> Path:
    path = tmp_path / "tiny_cil_reduced.yaml"
    # two sessions: the head grows once, and a trial takes seconds; eval at updates 0, 3 and 6 (not also at 1
    # and 2): these tests score finished runs, not a curve's shape, and every eval point costs a pass over
    # the validation split and a copy of the method (the run's isolation)
    path.write_text(yaml.safe_dump(with_validation(tuning={"trials": 2, "objective": "CK_delta"}, sessions=2,
                                                   eval={"every": 3, "batch_size": 256})))
    return path


class SealedSplit(Split):
    """A test split whose images may not be read: any read is an error (labels stay, as opening a
    source loads them)."""

    def __init__(self, inner: Split) -> None:
        self.labels, self.class_names, self.source = inner.labels, inner.class_names, inner.source

    @property
    def array(self):
        raise AssertionError(f"the test split of {self.source} was read")

    def image(self, index):
        raise AssertionError(f"the test split of {self.source} was read")

    def sample_bytes(self, index):
        raise AssertionError(f"the test split of {self.source} was read")

    def subset(self, indices):
        raise AssertionError(f"the test split of {self.source} was subset")


@pytest.fixture()
def sealed_test_split(monkeypatch):
    opener = stream_module.open_source
    monkeypatch.setattr(stream_module, "open_source",
                        lambda spec, field: (lambda tr, te: (tr, SealedSplit(te)))(*opener(spec, field=field)))


# ------------------------------------------------------------------ the validation split


def test_validation_is_held_out_of_training_and_scored_in_place_of_the_test_split(bench_cache):
    spec = parse_protocol(yaml.safe_dump(with_validation(5)), "reduced")
    test_run, tuning = build_stream(spec, 0), build_stream(spec.tuning_view(), 0)
    # a test run is what it was: every training sample, the test split, the same spec hash
    plain = {**reduced_tiny(), "validation": None, "tuning": None}
    assert spec.spec_hash == parse_protocol(yaml.safe_dump(plain), "reduced").spec_hash
    assert len(test_run.pretrain_ids) == 10 * 60 and [len(s.train_ids) for s in test_run.sessions] == [200] * 4
    # the tuning view: 5 of every class's samples held out of S1 and each session, and evaluated on instead
    assert spec.tuning_view().spec_hash != spec.spec_hash
    assert len(tuning.pretrain_ids) == 10 * 55 and [len(s.train_ids) for s in tuning.sessions] == [175] * 4
    trained = set(tuning.session_ids(5).tolist())
    assert len(tuning.test) == 30 * 5 and np.array_equal(np.bincount(tuning.test.labels), [5] * 30)
    assert all(split.source for split in tuning.test.splits)
    held = set(range(len(tuning.train))) - trained
    assert len(held) == 150
    # the same images: the validation catalog is the held-out train samples, labels kept
    for gid in sorted(held)[:: 37]:
        pos = sorted(held).index(gid)
        assert tuning.test.labels[pos] == tuning.train.labels[gid]
    # the same held-out samples for every run seed (trials at other seeds see the same split)
    other = build_stream(spec.tuning_view(), 1)
    assert set(other.session_ids(5).tolist()) == trained


def test_a_method_asking_for_the_test_split_in_a_tuning_run_fails_as_in_any_run(bench_cache):
    spec = parse_protocol(yaml.safe_dump(with_validation(5)), "reduced").tuning_view()
    with pytest.raises(BenchError, match="test split is the harness's alone"):
        train_view(build_stream(spec, 0), "peeker").test


def test_a_tuning_run_never_reads_the_test_split(tunable, tmp_path, sealed_test_split, monkeypatch):
    from bench_stability_gap.harness.run.pipeline import execute

    # a cache of its own: trunk features of the test split cached by an earlier test would be read
    # without opening the split, and the seal would have nothing to catch
    monkeypatch.setenv("BENCH_CACHE_DIR", str(tmp_path / "cache"))

    spec = load_protocol(str(tunable))
    options = RunOptions(results_dir=tmp_path / "r", progress=False, log=False)
    # the seal bites: a test run reads the test split at once
    with pytest.raises(AssertionError, match="test split of .* was read"):
        execute(spec, "vanilla", 0, options)
    # a tuning run (its joint and A_best references included) is scored on validation alone
    result, _ = execute(spec.tuning_view(), "vanilla", 0, options)
    assert result.status == "complete" and result.metrics is not None
    assert result.protocol.hash == spec.tuning_view().spec_hash
    assert result.protocol.scored_on == "validation"  # a trial says so itself: never ranked as a test board


def test_a_validation_split_larger_than_a_class_is_refused_naming_the_field(tmp_path, bench_cache):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(with_validation(40)))  # the stream sources hold 40 per class
    out = run_cli("validate", str(path))
    assert out.exit_code == 2 and "validation.per_class (40)" in out.output and "stream_data[0]" in out.output
    # counts the spec does not fix are checked when the data opens, before any training
    data = load_protocol("tiny_cil").model_dump(mode="json")
    data["stream_data"][1]["train_per_class"] = None
    spec = parse_protocol(yaml.safe_dump({**data, "validation": {"per_class": 420}}), "big")
    with pytest.raises(BenchError, match=r"validation\.per_class \(420\) is not smaller than the 400 training "
                                         r"samples of class .* of stream_data\[0\]"):
        build_stream(spec.tuning_view(), 0)
    with pytest.raises(BenchError, match="declares no validation split"):
        load_protocol("tiny_cil_norehearsal").tuning_view()


# ------------------------------------------------------------------ bench tune


def test_bad_tuning_requests_are_refused_before_any_compute(tunable, tmp_path):
    results = str(tmp_path / "r")
    cases = {
        ("--objective", "CK_detla"): "--objective 'CK_detla' is not a metric tuning can score",
        ("--trials", "0"): "--trials 0: a study needs at least 1 trial",
    }
    for args, words in cases.items():
        out = run_cli("tune", str(tunable), "vanilla", *args, "--results-dir", results)
        assert out.exit_code == 2 and words in out.output, out.output
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"lr": {"low": 1e-4, "high": 1e-2, "log": True}, "alpha": {"low": 0.1, "high": 1}}))
    out = run_cli("tune", str(tunable), "vanilla", "--space", str(space), "--results-dir", results)
    assert out.exit_code == 2 and "names 'alpha', which is not a setting of method 'vanilla'" in out.output
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({**reduced_tiny(), "validation": None, "tuning": None}))
    out = run_cli("tune", str(plain), "lwf", "--results-dir", results)
    assert out.exit_code == 2 and "declares no tuning ruleset" in out.output
    out = run_cli("tune", str(plain), "lwf", "--trials", "2", "--results-dir", results)
    assert out.exit_code == 2 and "declares no validation split" in out.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_validation(tuning={"trials": 2, "objective": "accuracy"})))
    out = run_cli("validate", str(bad))
    assert out.exit_code == 2 and "tuning.objective 'accuracy'" in out.output
    assert not (tmp_path / "r" / "tuning").exists()  # nothing ran


def test_the_declared_search_spaces_name_only_settings_their_methods_have():
    from bench_stability_gap.harness.sweep.tuning import search_space

    spec = load_protocol("tiny_cil")
    assert set(search_space("derpp", spec)) == {"lr", "weight_decay", "alpha", "beta"}
    assert set(search_space("lwf", spec)) == {"lr", "weight_decay", "temperature", "distill_weight"}
    assert {"lr", "sgm.lora.rank", "sgm.init.scale", "sgm.onecycle.pct_start"} <= set(search_space("vanilla+sgm", spec))
    # every built-in's declared space checks out against its settings
    for method in ("finetune", "output_only", "vanilla", "gdumb", "remind", "vanilla+soft+init+oocf+lora", "derpp+sgm"):
        assert "lr" in search_space(method, spec)


@pytest.mark.slow
def test_methods_tuned_under_one_ruleset_get_the_same_trials_and_the_entry_reproduces_its_best(tunable, tmp_path):
    import optuna

    from bench_stability_gap.harness.run.pipeline import execute
    from bench_stability_gap.harness.results.tuned import load_entry
    from bench_stability_gap.harness.sweep.tuning import counted

    results = tmp_path / "r"
    common = ("--results-dir", str(results), "--no-progress", "--no-mlflow")
    for method in ("vanilla", "lwf"):
        out = run_cli("tune", str(tunable), method, *common)
        assert out.exit_code == 0, out.output
    spec = load_protocol(str(tunable))
    entries = {m: load_entry(results, spec, m) for m in ("vanilla", "lwf")}
    storage = f"sqlite:///{results / 'tuning' / 'optuna.db'}"
    for method, entry in entries.items():
        assert entry.trials == 2 and entry.objective == "CK_delta" and entry.validation.per_class == 5
        assert entry.protocol_hash == spec.spec_hash and entry.tuning_hash == spec.tuning_view().spec_hash
        assert counted(optuna.load_study(study_name=entry.study, storage=storage)) == 2
        assert entry.ruleset == "tuned (2 trials, CK_delta)"
    assert set(entries["lwf"].settings) == {"lr", "weight_decay", "temperature", "distill_weight"}
    # no trial is a ranked run: the leaderboard's folder holds none
    assert not (results / "runs").exists()
    # re-running resumes the stored study: nothing more runs
    out = run_cli("tune", str(tunable), "vanilla", *common)
    assert out.exit_code == 0 and "2 of 2 trial(s) done" in out.output
    # the stored entry's settings, run again in a fresh folder, give its best trial's validation score
    entry = entries["lwf"]
    options = RunOptions(results_dir=tmp_path / "again", progress=False, log=False, overrides=entry.settings)
    again, _ = execute(spec.tuning_view(), "lwf", entry.seed, options)
    assert again.metrics.CK_delta == pytest.approx(entry.value, abs=1e-12)


@pytest.mark.slow
def test_a_tuned_row_sits_beside_its_default_row_labelled_by_its_ruleset(tunable, tmp_path):
    from bench_stability_gap.leaderboard.aggregate import format_table, summarize
    from bench_stability_gap.leaderboard.sources import load_folder

    results = tmp_path / "r"
    common = ("--results-dir", str(results), "--no-progress", "--no-mlflow")
    out = run_cli("run", "-p", str(tunable), "-m", "lwf", "--tuned", *common)
    assert out.exit_code == 2 and "No tuned settings for lwf" in out.output and "bench tune" in out.output
    assert run_cli("tune", str(tunable), "lwf", "--trials", "1", *common).exit_code == 0
    for extra in ((), ("--tuned",)):
        out = run_cli("run", "-p", str(tunable), "-m", "lwf", *extra, *common)
        assert out.exit_code == 0, out.output
    table = format_table(summarize(load_folder(results).entries))
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in table.splitlines()
            if line.startswith("| lwf")}
    assert rows == {"lwf": "defaults", "lwf [tuned (1 trials, CK_delta)]": "tuned (1 trials, CK_delta)"}


def test_a_trial_falling_below_the_median_at_an_eval_point_is_pruned():
    """Live pruning reads the running accuracy at each eval point (update 0 excluded): 1 - mean for a gap."""
    import optuna
    from types import SimpleNamespace

    from bench_stability_gap.harness.sweep.tuning import Reporter

    study = optuna.create_study(direction="minimize",
                                pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    for good in (0.9, 0.8):  # two finished trials: running mean of A(all) .9 and .8 at each point
        trial = study.ask()
        report = Reporter(trial, "CK_delta")
        for u in (0, 1, 2):
            report(2, u, SimpleNamespace(all=good, old=0.0, new=0.0))
        assert trial.storage.get_trial(trial._trial_id).intermediate_values == {1: pytest.approx(1 - good),
                                                                                2: pytest.approx(1 - good)}
        study.tell(trial, 1 - good)
    trial = study.ask()
    report = Reporter(trial, "CK_delta")
    report(2, 0, SimpleNamespace(all=0.0, old=0.0, new=0.0))  # update 0: not reported, nothing pruned
    with pytest.raises(optuna.TrialPruned, match="session 2, update 1"):
        report(2, 1, SimpleNamespace(all=0.5, old=0.0, new=0.0))
    # S_delta follows the old-class curve
    assert Reporter(study.ask(), "S_delta").curve == "old" and Reporter(study.ask(), "alpha").minimize is False


def test_an_interrupted_trial_is_asked_again_and_not_counted():
    import optuna

    from bench_stability_gap.harness.sweep.tuning import _reopen_interrupted, counted

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    space = {"lr": optuna.distributions.FloatDistribution(1e-5, 1e-2, log=True)}
    done = study.ask(space)
    study.tell(done, 0.5)
    killed = study.ask(space)  # a tune process died while this trial's run was training
    _reopen_interrupted(study)
    assert counted(study) == 1
    again = study.ask(space)
    assert again.params == killed.params and again.number != killed.number


def _study_request(tunable: Path, tmp_path: Path, trials: int, space: dict | None = None):
    from bench_stability_gap.harness.spec.protocol import TuningRules
    from bench_stability_gap.harness.sweep.tuning import TuneRequest, search_space

    spec = load_protocol(str(tunable))
    return TuneRequest(spec, "vanilla", TuningRules(trials=trials, objective="CK_delta"), 0,
                       f"sqlite:///{tmp_path / 'optuna.db'}", search_space("vanilla", spec, space))


def _scored_trial(killed_at: int | None = None):
    """A trial runner that scores the settings by a fixed function of them (the study's logic is what is
    under test), and at trial number ``killed_at`` dies as a killed process does (no clean-up)."""
    from types import SimpleNamespace

    def run_trial(view, overrides, reporter):
        if killed_at is not None and reporter.trial.number == killed_at:
            raise KeyboardInterrupt
        return SimpleNamespace(metrics=SimpleNamespace(CK_delta=float(sum(hash(str(v)) % 97 for v in overrides.values()))),
                               status="complete", run_id=f"r{reporter.trial.number}")
    return run_trial


def test_a_tune_killed_mid_trial_and_resumed_ends_with_exactly_n_distinct_trials(tunable, tmp_path):
    import optuna

    from bench_stability_gap.harness.sweep.tuning import counted, tune

    request = _study_request(tunable, tmp_path, trials=4)
    options = RunOptions(results_dir=tmp_path / "r")
    with pytest.raises(KeyboardInterrupt):
        tune(request, options, _scored_trial(killed_at=1), lambda _: None)
    study = optuna.load_study(study_name=request.study, storage=request.storage)
    killed = study.trials[1].params
    entry = tune(request, options, _scored_trial(), lambda _: None)  # a new process: a fresh sampler
    study = optuna.load_study(study_name=request.study, storage=request.storage)
    counted_trials = [t for t in study.trials if t.state.is_finished() and t.state.name != "FAIL"]
    assert counted(study) == 4 == entry.trials == len(counted_trials)
    settings = [tuple(sorted(t.params.items())) for t in counted_trials]
    assert len(set(settings)) == 4, settings  # none replays an earlier trial's settings
    assert tuple(sorted(killed.items())) in settings  # the interrupted trial was resumed, not dropped


def test_another_space_on_a_stored_study_is_another_study(tunable, tmp_path):
    import optuna

    from bench_stability_gap.harness.sweep.tuning import tune

    options = RunOptions(results_dir=tmp_path / "r")
    first = _study_request(tunable, tmp_path, trials=2)
    tune(first, options, _scored_trial(), lambda _: None)
    narrow = _study_request(tunable, tmp_path, trials=2, space={"lr": {"low": 0.5, "high": 0.6}})
    assert narrow.study != first.study and first.study in narrow.study
    entry = tune(narrow, options, _scored_trial(), lambda _: None)
    assert 0.5 <= entry.settings["lr"] <= 0.6 and set(entry.settings) == {"lr"}
    # a study whose stored trials sampled another space is refused, naming both
    stored = optuna.load_study(study_name=first.study, storage=first.storage)
    from bench_stability_gap.harness.sweep.study_checks import same_space

    with pytest.raises(BenchError, match="was sampled over .* not the space asked for now"):
        same_space(stored, first.study, {"lr": optuna.distributions.FloatDistribution(0.5, 0.6)}, first.storage)


BAD_SPACES = {
    "log flag": ({"lr": {"low": 0.0, "high": 0.1, "log": True}}, "low > 0 on a log scale"),
    "no choices": ({"lr": {"choices": []}}, "non-empty list"),
    "infinite": ({"lr": {"low": 0.001, "high": float("inf")}}, "finite numbers"),
    "a word among numbers": ({"lr": {"choices": [0.001, "abc"]}}, "includes 'abc'"),
    "beyond the setting's range": ({"lr": {"low": 0.001, "high": 100}}, "includes 100"),
    "a string bound": ({"lr": {"low": "abc", "high": 1}}, "finite numbers"),
    "a number as choices": ({"lr": {"choices": 5}}, "needs choices as a non-empty list"),
    "a word as choices": ({"lr": {"choices": "abc"}}, "got choices 'abc'"),
    "choices and a range": ({"lr": {"low": 0.1, "high": 1, "choices": [1]}}, "gives both choices and a range"),
}


@pytest.mark.parametrize("case", list(BAD_SPACES))
def test_a_space_optuna_or_the_settings_refuse_is_refused_before_a_study_exists(tunable, tmp_path, case):
    space, words = BAD_SPACES[case]
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    out = run_cli("tune", str(tunable), "vanilla", "--space", str(path), "--results-dir", str(tmp_path / "r"))
    assert out.exit_code == 2 and words in out.output and "'lr'" in out.output, out.output
    assert "Traceback" not in out.output and not (tmp_path / "r").exists()


def test_a_bad_storage_is_refused_before_anything_is_written(tunable, tmp_path):
    import sqlite3

    results = tmp_path / "r"
    results.mkdir()
    mlflow_db = results / "mlflow.db"
    with sqlite3.connect(mlflow_db) as db:  # an MLflow store's tables, as MLflow creates them
        db.execute("CREATE TABLE experiments (experiment_id INTEGER)")
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT)")
    before = {p: p.read_bytes() for p in (mlflow_db, other)}
    cases = {
        "nonsense": "is not a database URL",
        "postgresql+nodriver://x/y": "no database driver",
        "sqlite://": "in-memory database",
        f"sqlite:///{mlflow_db}": "MLflow store",
        f"sqlite:///{other}": "MLflow's tracking store",
        f"sqlite:///{tmp_path}": "is a folder",
        "sqlite:////proc/nowhere/optuna.db": "the folder /proc/nowhere does not exist",
        "sqlite:////proc/optuna.db": "not writable",
    }
    for url, words in cases.items():
        out = run_cli("tune", str(tunable), "vanilla", "--storage", url, "--results-dir", str(results))
        assert out.exit_code == 2 and words in out.output, (url, out.output)
        assert "Traceback" not in out.output
    assert {p: p.read_bytes() for p in before} == before
    assert sorted(p.name for p in results.iterdir()) == ["mlflow.db"]


def test_a_range_over_an_integer_setting_is_sampled_as_integers_and_needs_integer_bounds():
    """An integer setting given a float range would have Optuna propose 3.7 and fail the trial after its
    compute: integer bounds sample integers, float bounds are refused before a study exists."""
    from optuna.distributions import FloatDistribution, IntDistribution

    from bench_stability_gap.harness.sweep.tuning import _distributions, search_space

    spec = load_protocol("tiny_cil")
    space = search_space("vanilla", spec, {"pointwise_rank": {"low": 1, "high": 8},
                                           "pointwise_alpha": {"low": 1, "high": 4}})
    assert _distributions(space) == {"pointwise_rank": IntDistribution(1, 8),
                                     "pointwise_alpha": FloatDistribution(1.0, 4.0)}
    assert isinstance(space["pointwise_alpha"].low, float)  # a float setting samples floats between its bounds
    for low, high in ((1.0, 8), (1, 8.0)):
        with pytest.raises(BenchError, match="'pointwise_rank' is an integer setting: its range needs integer bounds"):
            search_space("vanilla", spec, {"pointwise_rank": {"low": low, "high": high}})


def test_a_space_file_that_is_empty_or_not_text_is_named(tmp_path):
    results = tmp_path / "r"
    path = tmp_path / "space.yaml"
    for content, words in ((b"{}\n", "is empty"), (b"", "is empty"), (bytes(range(128, 256)), "is not a UTF-8 text")):
        path.write_bytes(content)
        out = run_cli("tune", "tiny_cil", "vanilla", "--space", str(path), "--results-dir", str(results))
        assert out.exit_code == 2 and f"--space {path} {words}" in out.output, out.output
    assert not results.exists()


def test_a_default_study_storage_that_is_not_a_database_is_refused_and_kept(tmp_path):
    results = tmp_path / "r"
    database = results / "tuning" / "optuna.db"
    database.parent.mkdir(parents=True)
    database.write_text("hello\n")
    out = run_cli("tune", "tiny_cil", "vanilla", "--results-dir", str(results))
    assert out.exit_code == 2 and f"{database} is not an SQLite database" in out.output, out.output
    assert "default study storage" in out.output and database.read_text() == "hello\n"
    sweep = tmp_path / "sweep.yaml"  # a sweep's tuned row tunes into the same default storage
    sweep.write_text(yaml.safe_dump({"name": "s", "seeds": [0],
                                     "runs": [{"protocol": "tiny_cil", "methods": ["vanilla"], "tuned": True}]}))
    out = run_cli("sweep", str(sweep), "--results-dir", str(results), "--no-mlflow")
    assert out.exit_code == 2 and f"{database} is not an SQLite database" in out.output, out.output
    assert database.read_text() == "hello\n" and sorted(p.name for p in results.iterdir()) == ["tuning"]
    database.unlink()
    database.mkdir()
    out = run_cli("tune", "tiny_cil", "vanilla", "--results-dir", str(results))
    assert out.exit_code == 2 and f"{database} is a folder" in out.output, out.output


def test_a_storage_whose_driver_is_not_installed_is_refused_naming_it(tmp_path):
    import importlib.util

    from bench_stability_gap.harness.sweep.study_checks import check_storage

    if importlib.util.find_spec("psycopg") is not None:
        pytest.skip("psycopg is installed here")
    with pytest.raises(BenchError, match="--storage postgresql://u@h/db: its database driver 'psycopg' is not "
                                         "installed"):
        check_storage("postgresql://u@h/db", tmp_path)


def test_bad_arguments_of_the_python_tune_are_refused_naming_them(tmp_path):
    from bench_stability_gap.harness.api import tune

    for name, value in (("trials", "3"), ("trials", 2.5), ("trials", True), ("space", [1]), ("storage", 5),
                        ("objective", ["CK_delta"])):
        with pytest.raises(BenchError, match=rf"^{name} takes .*, not .* of type"):
            tune("tiny_cil", "vanilla", results_dir=tmp_path / "r", **{name: value})
    with pytest.raises(BenchError, match="search space given is empty"):
        tune("tiny_cil", "vanilla", results_dir=tmp_path / "r", space={})
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------------ tuned entries


def _entry(protocol) -> dict:
    return {"protocol": protocol.name, "protocol_hash": protocol.spec_hash, "tuning_hash": "t", "method": "vanilla",
            "settings": {"lr": 0.001}, "trials": 2, "objective": "CK_delta", "direction": "minimize", "value": 0.1,
            "best_trial": 0, "best_run": "r0", "validation": {"per_class": 50}, "seed": 0, "study": "s",
            "storage": "sqlite:///x.db"}


BAD_ENTRIES = {
    "negative trials": ({"trials": -5}, "trials: Input should be greater than or equal to 1"),
    "unknown objective": ({"objective": "bogus"}, "objective: objective 'bogus' is not a metric tuning can score"),
    "unknown direction": ({"direction": "sideways"}, "direction: Input should be 'minimize' or 'maximize'"),
    "the objective's other direction": ({"direction": "maximize"}, "direction: CK_delta is tuned to minimize"),
    "NaN value": ({"value": float("nan")}, "value: Input should be a finite number"),
    "settings not a mapping": ({"settings": [1]}, "settings: Input should be a valid dictionary"),
    "another method": ({"method": "derpp"}, "holds the settings of derpp on tiny_cil, not of vanilla on tiny_cil"),
    "another protocol": ({"protocol": "tiny_iid"}, "holds the settings of vanilla on tiny_iid"),
}


@pytest.mark.parametrize("case", list(BAD_ENTRIES))
def test_a_tuned_entry_with_bad_contents_is_refused_naming_the_field(tmp_path, case):
    import json

    from bench_stability_gap.harness.results.tuned import entry_path, load_entry

    change, words = BAD_ENTRIES[case]
    spec = load_protocol("tiny_cil")
    path = entry_path(tmp_path, "tiny_cil", "vanilla")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**_entry(spec), **change}))
    with pytest.raises(BenchError, match="Tuned entry .*vanilla.json") as err:
        load_entry(tmp_path, spec, "vanilla")
    assert words in str(err.value)


def test_only_an_absent_tuned_entry_is_missing_and_a_sweep_never_tunes_over_another(tmp_path):
    import json

    from bench_stability_gap.harness.results.tuned import entry_path, has_entry

    spec = load_protocol("tiny_cil")
    path = entry_path(tmp_path, "tiny_cil", "vanilla")
    assert not has_entry(tmp_path, spec, "vanilla")
    path.parent.mkdir(parents=True)
    for text in ("{", json.dumps({**_entry(spec), "protocol_hash": "other"})):
        path.write_text(text)
        with pytest.raises(BenchError, match=f"Tuned entry {path}"):
            has_entry(tmp_path, spec, "vanilla")
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(yaml.safe_dump({"name": "s", "seeds": [0],
                                         "runs": [{"protocol": "tiny_cil", "methods": ["vanilla"], "tuned": True}]}))
        out = run_cli("sweep", str(sweep), "--dry-run", "--results-dir", str(tmp_path))
        assert out.exit_code == 2 and f"Tuned entry {path}" in out.output and "to tune first" not in out.output
        assert path.read_text() == text


def test_a_tuned_entry_that_is_a_folder_is_named_as_one(tmp_path):
    from bench_stability_gap.harness.results.tuned import entry_path, load_entry

    path = entry_path(tmp_path, "tiny_cil", "vanilla")
    path.mkdir(parents=True)
    with pytest.raises(BenchError, match=f"Tuned entry {path} is a folder, not a file"):
        load_entry(tmp_path, load_protocol("tiny_cil"), "vanilla")
    out = run_cli("tune", "tiny_cil", "vanilla", "--results-dir", str(tmp_path))  # refused before a study runs
    assert out.exit_code == 2 and f"Tuned entry {path} is a folder" in out.output and path.is_dir()
    assert not (tmp_path / "tuning" / "optuna.db").exists()


def test_a_new_tuned_entry_keeps_the_one_it_replaces_beside_it(tunable, tmp_path):
    from bench_stability_gap.harness.results.tuned import entry_path
    from bench_stability_gap.harness.sweep.tuning import tune

    options, said = RunOptions(results_dir=tmp_path / "r"), []
    path = entry_path(options.results_dir, load_protocol(str(tunable)).name, "vanilla")
    path.parent.mkdir(parents=True)
    path.write_text("hand-edited")
    tune(_study_request(tunable, tmp_path, trials=1), options, _scored_trial(), said.append)
    kept = [p for p in path.parent.iterdir() if p != path]
    assert len(kept) == 1 and kept[0].name.startswith("vanilla.json.replaced-") and kept[0].read_text() == "hand-edited"
    assert any(str(kept[0]) in line for line in said)
    first = path.read_text()
    tune(_study_request(tunable, tmp_path, trials=1), options, _scored_trial(), said.append)  # the same entry again
    assert path.read_text() == first and len(list(path.parent.iterdir())) == 2
    tune(_study_request(tunable, tmp_path, trials=2), options, _scored_trial(), said.append)
    assert len(list(path.parent.iterdir())) == 3 and path.read_text() != first
