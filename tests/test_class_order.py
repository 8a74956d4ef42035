"""Class orders as data: the paper's published Places365 orders, orders from a file, and the seeded draw.

The six sha256 values below are facts about the public repository (yousuf907/SGM at commit 05aa8a6,
``imagenet_files/places_LT_class_order_seed_S.txt``): the digest of each file's bytes (365 names, one per
line, each line ending in a newline), computed from the files as read there. The test checks that the
rule (names sorted ignoring '-' and '_', then CPython's random.seed(S); random.shuffle) rebuilds every
one of them from the 365 names shipped with bench.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from bench_stability_gap.harness.cli import main
from bench_stability_gap.harness.data.stream import build_stream
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.class_order import PUBLISHED_SEEDS, places365_names, published_order
from bench_stability_gap.harness.spec.protocol import load_protocol, parse_protocol

PUBLISHED_FILE_SHA256 = {
    1: "288bf03300cdb987e697b95ea98d71c6e70173a6a2aaded369c2d7b19cbcc83c",
    74: "7d271865d678e8ce967d52449386fe563938bc8e4b6cbdb622a3c602e01d69b7",
    1444: "b7b898e6ba705382cafc243521c6d57fa031eae2125b83452c43a8d14349cd19",
    1883: "587ae17c8dea57dfc955b9f6f9579911b84671a3d2d10f8397bcd8a7e104bbed",
    1993: "fa58c804e293c9198481f292f73138754a5a2295a717ff1a286d8fddbbb838c7",
    2023: "8435d5f2b4b2a55aeef8a24097c0c2ca5727a83508b3db5b083181e8a8799777",
}
# the first names of two files, as read in the repository: a check that the digests are not of something else
FIRST_NAMES = {1993: ["amphitheater", "airport_terminal", "artists_loft"], 1: ["stadium-soccer", "cliff", "rice_paddy"]}


def _digest(names: list[str]) -> str:
    return hashlib.sha256("".join(f"{n}\n" for n in names).encode()).hexdigest()


@pytest.mark.parametrize("run_seed", range(len(PUBLISHED_SEEDS)))
def test_the_rule_rebuilds_every_published_order_file(run_seed):
    paper_seed = PUBLISHED_SEEDS[run_seed]
    names = published_order(run_seed)
    assert len(names) == len(set(names)) == 365
    assert _digest(names) == PUBLISHED_FILE_SHA256[paper_seed]
    if paper_seed in FIRST_NAMES:
        assert names[:3] == FIRST_NAMES[paper_seed]


def test_run_seed_zero_is_table_1s_order_and_seeds_0_to_5_are_table_3s():
    assert PUBLISHED_SEEDS[0] == 1993  # train_sgm.sh: SEED=1993
    assert sorted(PUBLISHED_SEEDS) == sorted(PUBLISHED_FILE_SHA256)


def test_the_shipped_names_are_places365s_id_order():
    names = places365_names()
    assert len(names) == 365 and names[:3] == ("airfield", "airplane_cabin", "airport_terminal")
    assert names[8] == "apartment_building-outdoor" and names[22] == "artists_loft"  # '/' and '_' sort before letters


def _small(tmp_path, **top) -> str:
    """cil_places_lt_synthetic with tiny counts (the same 365 unnamed stream classes), as a file."""
    spec = {"extends": "cil_places_lt_synthetic", "name": "small_places",
            "pretrain_data": {"source": "synthetic", "root": None,
                              "synthetic": {"classes": 4, "train_per_class": 3, "test_per_class": 1, "image_size": 8}},
            "stream_data": [{"source": "synthetic",
                             "synthetic": {"classes": 365, "train_per_class": 2, "test_per_class": 1, "image_size": 8}}],
            "training": {"batch": {"new": 4, "old": 4}}, "joint": {"batch_size": 8}, **top}
    path = tmp_path / "small_places.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _arrival_names(stream) -> list[str]:
    """The stream's classes in introduction order, as Places365 names (raw class k of the source is id k)."""
    k = stream.pretrain_classes
    names = places365_names()
    return [names[int(n.removeprefix("class_"))] for n in stream.class_names[k:]]


def test_cil_places_lt_seed_0_takes_seed_1993s_order(tmp_path):
    assert load_protocol("cil_places_lt").class_order == "published"
    assert load_protocol("cil_places_lt_synthetic").class_order == "published"  # inherited
    protocol = load_protocol(_small(tmp_path))
    assert _arrival_names(build_stream(protocol, 0)) == published_order(0)
    assert _digest(_arrival_names(build_stream(protocol, 0))) == PUBLISHED_FILE_SHA256[1993]
    assert _digest(_arrival_names(build_stream(protocol, 3))) == PUBLISHED_FILE_SHA256[1444]
    stream = build_stream(protocol, 0)
    first = set(published_order(0)[:73])
    assert {_arrival_names(stream)[c - stream.pretrain_classes] for c in stream.sessions[0].classes} == first


def test_seeded_orders_are_unchanged_and_differ_from_the_published(tmp_path):
    protocol = load_protocol(_small(tmp_path, class_order="seeded"))
    stream = build_stream(protocol, 0)
    rng = np.random.default_rng(0)
    expected = rng.permutation(365)  # the draw bench has always made
    assert [int(n.removeprefix("class_")) for n in stream.class_names[4:]] == expected.tolist()
    assert _arrival_names(stream) != published_order(0)


def test_a_file_order_is_followed(tmp_path):
    order = list(reversed(published_order(2)))
    (tmp_path / "order.txt").write_text("\n".join(n.replace("-", "/") for n in order) + "\n")  # '/' reads as '-'
    protocol = load_protocol(_small(tmp_path, class_order=f"file:{tmp_path / 'order.txt'}"))
    assert _arrival_names(build_stream(protocol, 5)) == order


def _refused(out, *words):
    assert out.exit_code == 2, out.output
    text = " ".join(out.output.split())
    for w in words:
        assert w in text, (w, out.output)


def test_an_unknown_order_is_refused_naming_the_field(tmp_path):
    out = CliRunner().invoke(main, ["validate", _small(tmp_path, class_order="alphabetical")])
    _refused(out, "class_order 'alphabetical' is not an order", "seeded, published or file:PATH")


def test_a_file_naming_a_class_twice_is_refused_at_validation(tmp_path):
    names = published_order(0)
    (tmp_path / "twice.txt").write_text("\n".join(names + [names[5]]) + "\n")
    out = CliRunner().invoke(main, ["validate", _small(tmp_path, class_order=f"file:{tmp_path / 'twice.txt'}")])
    _refused(out, "class_order", f"names {names[5]} more than once")


@pytest.mark.parametrize("change", ["miss", "foreign"])
def test_a_file_that_misses_a_class_or_names_one_the_data_lacks_is_refused(tmp_path, change):
    names = published_order(0)
    names = names[1:] if change == "miss" else names[:-1] + ["moon_base"]
    (tmp_path / "order.txt").write_text("\n".join(names) + "\n")
    protocol = load_protocol(_small(tmp_path, class_order=f"file:{tmp_path / 'order.txt'}"))
    with pytest.raises(BenchError) as err:
        build_stream(protocol, 0)
    assert err.value.exit_code == 2
    assert "class_order" in str(err.value)
    assert ("misses 1 of its classes" if change == "miss" else "lacks (moon_base)") in str(err.value)


@pytest.mark.parametrize("case", ["seed past the list", "file misses a class", "file names a foreign class"])
def test_bench_run_exits_2_naming_class_order_before_compute(tmp_path, case):
    results, seed, top = tmp_path / "r", "0", {}
    if case == "seed past the list":
        seed, words = "6", ("class_order 'published' has 6 orders", "seed 6 has none")
    else:
        names = published_order(0)[1:] + (["moon_base"] if case.endswith("foreign class") else [])
        (tmp_path / "order.txt").write_text("\n".join(names) + "\n")
        top = {"class_order": f"file:{tmp_path / 'order.txt'}"}
        words = ("class_order", "misses 1 of its classes") + (("lacks (moon_base)",) if "foreign" in case else ())
    out = CliRunner().invoke(main, ["run", "-p", _small(tmp_path, **top), "--seed", seed, "--results-dir",
                                    str(results), "--no-mlflow", "--no-progress"])
    _refused(out, *words)
    assert "joint" not in out.output.lower() and "trunk" not in out.output and not list(results.rglob("*.json"))


def test_a_fixed_order_needs_cil_sessions():
    text = load_protocol("iid_places_lt").model_dump_json()
    data = yaml.safe_load(text)
    data["class_order"] = "published"
    with pytest.raises(BenchError, match="class_order 'published' orders CIL sessions"):
        parse_protocol(yaml.safe_dump(data), "iid")


def test_unset_orders_keep_their_hash_and_a_file_order_hashes_its_names(tmp_path):
    tiny = load_protocol("tiny_cil")
    assert tiny.class_order is None
    assert tiny.model_copy(update={"class_order": None}).spec_hash == tiny.spec_hash
    (tmp_path / "a.txt").write_text("\n".join(published_order(0)) + "\n")
    a = load_protocol(_small(tmp_path, class_order=f"file:{tmp_path / 'a.txt'}"))
    before = a.spec_hash
    (tmp_path / "a.txt").write_text("\n".join(published_order(1)) + "\n")
    assert a.spec_hash != before


def test_the_table_3_sweep_runs_three_methods_over_the_six_published_orders():
    from bench_stability_gap.harness.sweep.plan import load_sweep

    sweep = load_sweep("table3_places_lt")
    assert sweep.seeds == list(range(len(PUBLISHED_SEEDS)))
    assert [(g.protocol, list(g.methods)) for g in sweep.runs] == [
        ("cil_places_lt", ["output_only", "vanilla", "vanilla+sgm"])]
    assert load_protocol("cil_places_lt").class_order == "published"


def test_the_published_order_leaves_pythons_global_random_state_alone():
    import random

    random.seed(5)
    expected = random.random()
    random.seed(5)
    published_order(0)
    assert random.random() == expected
