"""Summarizing scores copies of the stored runs it is given: the entries passed in come back as they went in,
so a caller (the site, ``load_results``, a second summary) never reads an earlier board's scores off them."""

from __future__ import annotations

import copy

from results_factory import joint_run, two_session_run

from bench_stability_gap.leaderboard.aggregate import Entry, scored_entries, summarize, summarize_protocol


def _entries() -> list[Entry]:
    runs = [joint_run("j0", 0), joint_run("j1", 1), two_session_run("v0", "vanilla", 0),
            two_session_run("v1", "vanilla", 1, lift=0.05), two_session_run("lonely", "lwf", 5)]
    # two runs of one row made with different code: the board splits the row by code hash
    for run_id, code in (("s0", "a" * 16), ("s1", "b" * 16)):
        r = two_session_run(run_id, "vanilla+sgm", int(run_id[1]))
        runs.append(r.model_copy(update={"method": r.method.model_copy(update={"code_hash": code})}))
    return [Entry(r, source=f"{r.run_id}.json", slug=r.run_id) for r in runs]


def _state(entries: list[Entry]) -> list[dict]:
    return [copy.copy(vars(e)) for e in entries]  # every attribute, the cached row name included


def test_summarize_protocol_leaves_the_entries_passed_in_unchanged() -> None:
    entries = _entries()
    before = _state(entries)
    board = summarize_protocol("hand", entries)
    assert _state(entries) == before
    assert all(e.reason is None and e.metrics is None and e.joint is None and e.p_delta_paper is None
               for e in entries)
    assert "method" not in vars(entries[-1])  # the row name the code split gives lives on the board's copy
    # the board holds new objects, one per entry in the same order, and those carry the scores
    assert [e.run_id for e in board.entries] == [e.run_id for e in entries]
    assert not {id(e) for e in board.entries} & {id(e) for e in entries}
    scored = {e.run_id: e for e in board.entries}
    assert scored["v0"].metrics is not None and scored["v0"].joint is scored["j0"]
    assert scored["lonely"].reason.startswith("no joint reference for seed 5")
    assert {scored["s0"].method, scored["s1"].method} == {"vanilla+sgm #aaaaaaaa", "vanilla+sgm #bbbbbbbb"}
    assert [e.slug for e in board.entries] == [e.slug for e in entries]  # where the site put each run's page


def test_summarizing_twice_gives_the_same_scores() -> None:
    entries = _entries()
    first, second = summarize(entries), summarize(entries)
    assert [(e.run_id, e.reason, e.metrics, e.method) for e in scored_entries(first)] == \
        [(e.run_id, e.reason, e.metrics, e.method) for e in scored_entries(second)]
    assert sorted(e.run_id for e in scored_entries(first)) == sorted(e.run_id for e in entries)  # each run once


def test_a_tuned_row_never_averages_seeds_that_ran_different_tuned_settings() -> None:
    """A study run again (another seed, more trials) replaces the tuned entry; runs made before and after
    it share the ruleset's row name, and the board averaged their different settings into one row."""
    from bench_stability_gap.harness.results.schema import TunedStamp

    stamp = TunedStamp(trials=1, objective="CK_delta", value=0.2, validation_per_class=5, study="s",
                       tuning_hash="h")
    runs = [joint_run("j0", 0), joint_run("j1", 1), two_session_run("v0", "vanilla", 0),
            two_session_run("v1", "vanilla", 1)]
    for run_id, seed, lr in (("t0", 0, 4.4e-4), ("t1", 1, 1.8e-4)):
        r = two_session_run(run_id, "vanilla", seed)
        runs.append(r.model_copy(update={"tuned": stamp, "overrides": {"lr": lr}}))
    board = summarize_protocol("hand", [Entry(r, source=f"{r.run_id}.json", slug=r.run_id) for r in runs])
    rows = {e.run_id: e.method for e in board.entries}
    assert rows["t0"] == "vanilla [tuned (1 trials, CK_delta)] (lr=0.00044)", rows
    assert rows["t1"] == "vanilla [tuned (1 trials, CK_delta)] (lr=0.00018)", rows
    same = summarize_protocol("hand", [Entry(r, source=f"{r.run_id}.json", slug=r.run_id) for r in runs[:-1]] + [
        Entry(runs[-1].model_copy(update={"overrides": {"lr": 4.4e-4}}), source="t1.json", slug="t1")])
    assert {e.method for e in same.entries if e.run_id in ("t0", "t1")} == {"vanilla [tuned (1 trials, CK_delta)]"}
