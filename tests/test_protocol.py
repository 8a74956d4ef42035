from __future__ import annotations

import pytest
import yaml

from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import Evaluation, builtin_protocol_names, load_protocol, parse_protocol

PAPER_PROTOCOLS = {"cil_places_lt", "iid_places_lt", "cil_places_lt_balanced", "cil_places_std_192k",
                   "cil_places_std_24k", "online_cub_80k", "online_cub_20k", "cil_places_lt_norehearsal"}


def test_every_issue_protocol_ships_and_validates():
    names = set(builtin_protocol_names())
    assert PAPER_PROTOCOLS | {"tiny_cil", "tiny_iid"} <= names
    for name in names:
        p = load_protocol(name)
        assert p.name == name
        assert len(p.spec_hash) == 16


def test_paper_protocols_carry_the_papers_numbers():
    main = load_protocol("cil_places_lt")
    assert (main.sessions, main.classes_per_session, main.training.updates) == (5, 73, 600)
    assert main.training.batch.size == 128 and main.eval.every == 100
    assert main.backbone.model == "convnextv2_femto" and main.backbone.trunk == ["stem", "stages.0", "stages.1", "stages.2.downsample"]
    std = load_protocol("cil_places_std_24k")
    assert (std.training.updates, std.training.batch.size, std.memory.capacity) == (1200, 256, 24000)
    online = load_protocol("online_cub_20k")
    assert online.training.updates == "per_sample"
    assert (online.training.batch.new, online.training.batch.old, online.memory.capacity) == (1, 50, 20000)
    assert load_protocol("cil_places_lt_norehearsal").training.batch.old == 0


def test_hash_changes_with_content_and_not_with_formatting():
    text = (load_protocol("tiny_cil").model_dump_json())
    data = yaml.safe_load(text)
    a = parse_protocol(yaml.safe_dump(data), "a")
    b = parse_protocol(yaml.safe_dump(data, default_flow_style=True), "b")
    assert a.spec_hash == b.spec_hash
    data["training"]["updates"] = 101
    assert parse_protocol(yaml.safe_dump(data), "c").spec_hash != a.spec_hash


def test_unknown_field_is_named():
    data = yaml.safe_load(load_protocol("tiny_cil").model_dump_json())
    data["training"]["updatez"] = 3
    with pytest.raises(BenchError, match=r"training\.updatez"):
        parse_protocol(yaml.safe_dump(data), "bad.yaml")


def test_bad_value_is_named_with_its_value():
    data = yaml.safe_load(load_protocol("tiny_cil").model_dump_json())
    data["ordering"] = "random"
    with pytest.raises(BenchError, match=r"ordering.*'random'"):
        parse_protocol(yaml.safe_dump(data), "bad.yaml")


def test_malformed_yaml_and_non_mapping():
    with pytest.raises(BenchError, match="not valid YAML"):
        parse_protocol("name: [unclosed", "x.yaml")
    with pytest.raises(BenchError, match="mapping"):
        parse_protocol("- a\n- b\n", "x.yaml")


def test_unknown_protocol_suggests_nearest():
    with pytest.raises(BenchError, match="Did you mean: tiny_cil"):
        load_protocol("tiny_cll")


def test_memory_capacity_must_match_policy():
    data = yaml.safe_load(load_protocol("tiny_cil").model_dump_json())
    data["memory"] = {"policy": "reservoir"}
    with pytest.raises(BenchError, match="capacity is required"):
        parse_protocol(yaml.safe_dump(data), "x")


def test_eval_points_cadence_plus_dense_start():
    ev = Evaluation(every=10, dense_every=2, dense_until=6)
    assert ev.points(25) == [0, 2, 4, 6, 10, 20, 25]
    assert Evaluation(every=50).points(100) == [0, 50, 100]
    assert [u for u in range(26) if ev.due(u)] == [0, 2, 4, 6, 10, 20]  # the schedule without its last point


def test_a_field_added_later_changes_no_hash_until_it_is_set():
    import hashlib
    import json

    from bench_stability_gap.harness.spec.protocol import ComputeBudget, Memory, TuningRules, Validation

    spec = load_protocol("tiny_cil")
    data = spec.model_dump(mode="json")
    data["memory"].pop("pretrain_share")  # the spec as hashed before the fields existed
    data["memory"].pop("arrival")
    for name in ("validation", "tuning", "scored_on", "class_order", "hook_time_limit"):
        data.pop(name)
    data["backbone"].pop("registered_first")
    data["backbone"].pop("head_units")
    data["training"].pop("budget")
    data["training"].pop("old_mix")
    data["training"].pop("source_draw")
    data["eval"].pop("tflops")
    before = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    assert spec.spec_hash == before
    split = spec.model_copy(update={"memory": Memory(policy="split", capacity=500, pretrain_share=0.8)})
    other = spec.model_copy(update={"memory": Memory(policy="split", capacity=500, pretrain_share=0.75)})
    assert len({spec.spec_hash, split.spec_hash, other.spec_hash}) == 3
    # a validation split and a tuning ruleset change no test run, hence not its hash; the tuning view differs
    tunable = spec.model_copy(update={"validation": Validation(per_class=5), "tuning": TuningRules(trials=3)})
    assert tunable.spec_hash == spec.spec_hash != tunable.tuning_view().spec_hash
    # how long a call into a method may take changes no number either
    assert spec.model_copy(update={"hook_time_limit": 5.0}).spec_hash == spec.spec_hash
    body = spec.backbone.body
    ordered = spec.model_copy(update={"backbone": spec.backbone.model_copy(update={"registered_first": body[-1:]})})
    assert ordered.spec_hash != spec.spec_hash
    assert ordered.backbone.registration_order() == [len(body) - 1, *range(len(body) - 1)]
    flops = spec.model_copy(update={"training": spec.training.model_copy(
        update={"updates": None, "budget": ComputeBudget(tflops=0.5)})})
    assert flops.spec_hash != spec.spec_hash


def test_a_flop_budget_is_the_updates_alternative_named_when_wrong():
    """training.budget (TFLOPs per session) replaces training.updates; both, neither, zero or a negative
    budget are refused naming the field."""
    data = yaml.safe_load(load_protocol("tiny_cil").model_dump_json())
    data["training"].pop("budget")
    both = {**data, "training": {**data["training"], "budget": {"tflops": 0.5}}}
    with pytest.raises(BenchError, match=r"training.*exactly one of updates .* and budget .*not both"):
        parse_protocol(yaml.safe_dump(both), "both.yaml")
    del both["training"]["updates"]
    with pytest.raises(BenchError, match=r"eval\.tflops is required under training\.budget"):
        parse_protocol(yaml.safe_dump(both), "update-schedule.yaml")
    both["eval"] = {"tflops": {"every": 0.05}}
    p = parse_protocol(yaml.safe_dump(both), "flops.yaml")
    assert p.training.budget.tflops == 0.5 and p.training.session_updates(40) is None and not p.training.online
    for bad in (0, -1.5):
        both["training"]["budget"]["tflops"] = bad
        with pytest.raises(BenchError, match=r"training\.budget\.tflops.*greater than 0"):
            parse_protocol(yaml.safe_dump(both), "bad.yaml")
    neither = {**data, "training": {k: v for k, v in data["training"].items() if k != "updates"}}
    with pytest.raises(BenchError, match=r"exactly one of updates"):
        parse_protocol(yaml.safe_dump(neither), "neither.yaml")


def test_a_compute_schedule_evaluates_where_an_update_crosses_one_of_its_points():
    """eval.tflops: points every 0.1 TFLOPs and every 0.025 until 0.05; an update is followed by an eval
    when the session's TFLOPs crossed a point during it (hand-counted)."""
    from bench_stability_gap.harness.spec.protocol import ComputeSchedule

    s = ComputeSchedule(every=0.1, dense_every=0.025, dense_until=0.05)
    assert [s.marks(x) for x in (0.0, 0.02, 0.025, 0.05, 0.07, 0.1, 0.26)] == [0, 0, 1, 2, 2, 3, 4]
    assert s.due(0.02, 0.03) and not s.due(0.03, 0.045) and s.due(0.045, 0.05) and not s.due(0.05, 0.09)
    assert s.due(0.09, 0.1) and not s.due(0.1, 0.19) and s.due(0.19, 0.26)
    assert s.scaled(2) == ComputeSchedule(every=0.2, dense_every=0.05, dense_until=0.1)


def test_a_schedule_must_match_the_budget_kind():
    data = yaml.safe_load(load_protocol("tiny_cil").model_dump_json())
    data["eval"]["tflops"] = {"every": 0.05}
    with pytest.raises(BenchError, match=r"eval needs exactly one schedule"):
        parse_protocol(yaml.safe_dump(data), "two-schedules.yaml")
    data["eval"] = {"tflops": {"every": 0.05}}
    with pytest.raises(BenchError, match=r"eval\.tflops places eval points by compute, which needs training\.budget"):
        parse_protocol(yaml.safe_dump(data), "compute-schedule-on-updates.yaml")


def test_name_at_k_x_scales_the_budget_and_schedule_and_shares_the_references():
    base = load_protocol("tiny_cil_flops")
    scaled = load_protocol("tiny_cil_flops@0.5x")
    assert scaled.name == "tiny_cil_flops@0.5x" and scaled.spec_hash != base.spec_hash
    assert scaled.training.budget.tflops == pytest.approx(base.training.budget.tflops / 2)
    assert scaled.eval.tflops.every == pytest.approx(base.eval.tflops.every / 2)
    assert scaled.reference.spec_hash == base.spec_hash and base.reference is base
    assert scaled.model_copy(update={}).reference.spec_hash == base.spec_hash
    with pytest.raises(BenchError, match=r"tiny_cil has no FLOP budget"):
        load_protocol("tiny_cil@2x")
