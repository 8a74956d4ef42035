"""Contract tests, parametrized over the built-in methods (the specs are ``bench check-method``'s).

Every built-in method (except the reference method ``joint``), alone and with ``+sgm``, must: complete its updates on a tiny stream, make exactly one optimizer step per ``observe`` (the
runner enforces it; we check the totals), keep the memory within the protocol's storage cap, and give
the same numbers twice under one seed. A combination a method cannot support must be a clear
``BenchError`` naming it, never a silent no-op. Installed third-party plugins are not collected here
(``bench check-method`` checks them), so none can turn this suite red. Kept cheap: a reduced protocol
(harness/tools/check_method.py), one deployed model per module, a few updates per session.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import torch

from bench_stability_gap.harness.tools.check_method import CAP, online_spec
from bench_stability_gap.harness.errors import BenchError
from bench_stability_gap.harness.spec.protocol import Protocol
from bench_stability_gap.methods.registry import METHOD_GROUP, build_method, entries
from bench_stability_gap.harness.run.continual import run_cl
from bench_stability_gap.harness.run.workbench import prepare
from bench_stability_gap.harness.run.options import RunOptions

try:
    importlib.import_module("bench_stability_gap.methods.sgm.combined")
    SGM_MISSING = None
except Exception as exc:  # the SGM modifiers are developed beside the methods
    SGM_MISSING = f"methods.sgm.combined is not importable yet ({type(exc).__name__}: {exc})"

# Combinations that cannot work, and the words their error must contain.
UNSUPPORTED = {"output_only+sgm": "trains only the head"}

# Settings that only scale a method's own extra passes, lowered for the contract: what it checks (updates,
# optimizer steps, the memory cap, same seed same numbers) holds whatever they are, and at EWC's default
# 200 per-sample Fisher gradients per estimate its two capped cases took 80 of the module's seconds.
CONTRACT_SETTINGS = {"ewc": {"fisher_samples": 8}}


def _base_names() -> list[str]:
    """The built-ins only: an installed third-party plugin is checked by ``bench check-method``, and can
    never turn this suite red (the example plugins have their own tests)."""
    return sorted(n for n, e in entries(METHOD_GROUP).items() if n != "joint" and e.distribution == "bench-stability-gap")


def _cases() -> list:
    out = []
    for name in _base_names():
        out.append(pytest.param(name, id=name))
        marks = [pytest.mark.skip(reason=SGM_MISSING)] if SGM_MISSING else []
        out.append(pytest.param(f"{name}+sgm", id=f"{name}+sgm", marks=marks))
    return out


@pytest.fixture(scope="module")
def options(tmp_path_factory) -> RunOptions:
    return RunOptions(results_dir=tmp_path_factory.mktemp("contract-results"), progress=False, log=False)


@pytest.fixture(scope="module")
def capped(capped_workbench):
    """The session's capped workbench (conftest.py), shared with the other modules that run on it."""
    return capped_workbench


@pytest.fixture(scope="module")
def online(bench_cache, options):
    return prepare(Protocol.model_validate(online_spec()), 0, options)


def run(bench, text: str, seed: int, options: RunOptions, **overrides):
    _, method = build_method(text, bench.protocol.name, overrides)
    curves, budget, params = run_cl(bench, method, seed, options)
    return method, curves, budget, params


def expect_unsupported(bench, text: str, options: RunOptions) -> None:
    base = text.split("+")[0]
    with pytest.raises(BenchError) as err:
        run(bench, text, 0, options)
    assert base in str(err.value) and UNSUPPORTED.get(text, base) in str(err.value)


def unsupported(text: str) -> bool:
    if text in UNSUPPORTED:
        return True
    base, *mods = text.split("+")
    return bool(mods) and not getattr(entries(METHOD_GROUP)[base].load(), "uses_standard_step", False)


def check_contract(bench, method, curves, budget, params) -> None:
    p = bench.protocol
    sessions = bench.stream.sessions
    expected_u = [len(s.train_ids) if p.training.updates == "per_sample" else p.training.updates for s in sessions]
    assert budget.updates_per_session == expected_u
    assert budget.optimizer_steps == sum(expected_u)
    batch = p.training.batch.new + p.training.batch.old
    if method.rehearsal:
        assert (budget.batch_new, budget.batch_old) == (p.training.batch.new, p.training.batch.old)
    else:
        assert (budget.batch_new, budget.batch_old) == (batch, 0)
    assert budget.samples_trained <= sum(expected_u) * batch
    assert budget.memory_peak_samples <= p.memory.capacity
    assert budget.memory_peak_bytes > 0 or not method.rehearsal
    assert params > 0
    for curve, u in zip(curves, expected_u):
        assert curve.updates[0] == 0 and curve.updates[-1] == u
        assert all(0.0 <= a <= 1.0 for a in curve.all)


@pytest.mark.parametrize("text", _cases())
def test_contract_capped_offline(text, capped, options):
    """A few offline updates per session under a storage cap; same seed, same numbers."""
    if unsupported(text):
        expect_unsupported(capped, text, options)
        return
    settings = CONTRACT_SETTINGS.get(text.split("+")[0], {})
    method, curves, budget, params = run(capped, text, 0, options, **settings)
    check_contract(capped, method, curves, budget, params)
    _, again, budget2, _ = run(capped, text, 0, options, **settings)
    assert again == curves, "same seed must give the same curves"
    assert budget2 == budget


@pytest.mark.parametrize("text", _cases())
def test_contract_online_per_sample(text, online, options):
    """One update per arriving sample (the online setting), under a storage cap."""
    if unsupported(text):
        expect_unsupported(online, text, options)
        return
    method, curves, budget, params = run(online, text, 1, options, **CONTRACT_SETTINGS.get(text.split("+")[0], {}))
    check_contract(online, method, curves, budget, params)


# -- method-specific guarantees of the paper's other base methods ----------------------------------

def test_remind_stores_pq_codes_and_counts_their_bytes(online, options):
    method, _, budget, _ = run(online, "remind", 0, options)
    c, h, w = method.feature_shape
    code_bytes = h * w * method.config.pq_subquantizers * method.config.pq_bits // 8
    assert method.sample_bytes(0) == code_bytes
    assert budget.memory_peak_bytes == budget.memory_peak_samples * code_bytes  # every stored sample is a code
    assert set(method.codes) >= set(method.ctx.memory.ids)
    counters = method.ctx.counters
    assert counters["remind_reconstruct_samples"] == budget.samples_trained
    # per-class lr, REMIND's default: a step every 100 samples of a class, so a class seen once keeps lr
    c0 = int(online.stream.sessions[0].new_classes[0])
    assert method.class_seen[c0] == method.class_total[c0] == 1
    assert method.class_lr(c0) == pytest.approx(method.config.lr)
    # the decay over the class's own samples: lr_end once it has been seen as often as it occurs
    method.config = method.config.model_copy(update={"lr_step": 1, "lr_decay_samples": None})
    assert method.class_lr(c0) == pytest.approx(method.config.lr_end)
    method.class_seen[c0] = 0
    assert method.class_lr(c0) == pytest.approx(method.config.lr)


def test_remind_reconstruction_is_close_and_deterministic(capped, options):
    _, method = build_method("remind", capped.protocol.name)
    from bench_stability_gap.harness.run.memory import Memory
    from bench_stability_gap.harness.run.budget_guards import memory_spec

    rng = np.random.default_rng(0)
    memory = Memory(memory_spec(capped.protocol, method), capped.stream.train.labels,
                    capped.stream.train.sample_bytes, rng)
    import copy
    method.setup(copy.deepcopy(capped.deployed), capped.context(memory, rng, torch.Generator().manual_seed(0)))
    x = capped.train_inputs.get(capped.stream.sessions[0].train_ids[:16])
    r1, r2 = method.reconstruct(x), method.reconstruct(x)
    assert torch.equal(r1, r2) and r1.shape == x.shape
    err = ((r1 - x) ** 2).mean() / (x**2).mean()
    assert err < 0.5  # a codebook fitted on pre-training features still describes stream features
    assert method.memory_policy == "class_balanced"


def test_remind_per_class_lr_scales_one_step_and_is_restored(capped, options):
    import copy

    from bench_stability_gap.harness.run.memory import Memory
    from bench_stability_gap.harness.run.budget_guards import memory_spec

    # the decay over a class's own samples (not REMIND's default), so one class's stream count ends it
    _, method = build_method("remind", capped.protocol.name, {"lr_step": 1, "lr_decay_samples": None})
    rng = np.random.default_rng(0)
    memory = Memory(memory_spec(capped.protocol, method), capped.stream.train.labels,
                    capped.stream.train.sample_bytes, rng)
    model = copy.deepcopy(capped.deployed)
    session = capped.stream.sessions[0]
    model.head.grow(len(session.new_classes))
    method.setup(model, capped.context(memory, rng, torch.Generator().manual_seed(0)))
    method.begin_session(session)
    base = [g["lr"] for g in method.optimizer.param_groups]
    seen: list[list[float]] = []
    method.optimizer.register_step_pre_hook(lambda opt, *_: seen.append([g["lr"] for g in opt.param_groups]))
    method._lr_factor = 0.01
    method.optimizer.step()
    assert seen[0] == pytest.approx([b * 0.01 for b in base])
    assert [g["lr"] for g in method.optimizer.param_groups] == base
    c = int(session.new_classes[0])
    assert method.lr_factor(np.array([c])) == pytest.approx(1.0)
    method.class_seen[c] = method.class_total[c]
    assert method.lr_factor(np.array([c])) == pytest.approx(method.config.lr_end / method.config.lr)


def test_remind_on_images_runs_the_trunk_itself_and_matches_the_cached_run(online, bench_cache, tmp_path):
    """Trunk not cached: inputs are images, REMIND runs the trunk on arriving samples only."""
    opts = RunOptions(results_dir=tmp_path, progress=False, log=False, trunk_cache=False)
    images = prepare(online.protocol, 0, opts)
    method, curves, budget, _ = run(images, "remind", 0, opts)
    n_new = sum(len(s.train_ids) for s in online.stream.sessions)
    assert method.ctx.counters["remind_trunk_forward_samples"] >= n_new
    assert "trunk_feature_samples" not in method.ctx.counters  # the hooks saw those trunk passes
    _, cached, cached_budget, _ = run(online, "remind", 0, opts)
    for a, b in zip(curves, cached):
        assert a.all == pytest.approx(b.all, abs=0.02)
    # the cached run is charged the trunk passes it skipped (codebook fit, encoding): same FLOPs either way
    assert cached_budget.train_flops == pytest.approx(budget.train_flops, rel=0.01)


def test_remind_rejects_a_codebook_that_does_not_divide_the_channels(capped, options):
    with pytest.raises(BenchError, match="pq_subquantizers=7"):
        run(capped, "remind", 0, options, pq_subquantizers=7)


def test_derpp_stores_logits_on_first_sight_and_pads_a_grown_head(capped, options):
    method, _, _, _ = run(capped, "derpp", 0, options, pretrain_logits="at_setup")
    widths = {method.logits.length(g) for g in method.ctx.memory.ids}
    assert len(widths) > 1  # logits stored before and after the head grew
    pre = [int(g) for g in method.ctx.memory.ids if g < len(capped.stream.pretrain_ids)]
    assert pre and all(method.logits.length(g) == capped.stream.pretrain_classes for g in pre)
    ref, mask = method.stored(np.asarray(pre[:2]), 30, torch.device("cpu"))
    assert ref.shape == (2, 30) and bool(mask.all())
    assert float(ref[:, capped.stream.pretrain_classes:].abs().sum()) == 0
    assert torch.equal(ref[0, : capped.stream.pretrain_classes], torch.from_numpy(method.logits.row(pre[0])))
    method.config = method.config.model_copy(update={"pad_logits": "none"})
    _, mask = method.stored(np.asarray(pre[:2]), 30, torch.device("cpu"))
    assert int(mask.sum()) == 2 * capped.stream.pretrain_classes
    # bytes: the raw sample plus its float32 logits
    g = pre[0]
    assert method.sample_bytes(g) == capped.stream.train.sample_bytes(g) + 4 * capped.stream.pretrain_classes
    assert method.ctx.counters["derpp_logit_forward_samples"] >= len(pre)


def test_derpp_lazy_pretrain_logits_equal_the_setup_pass(capped, options):
    """Deployed-model logits computed when a pre-training sample is first replayed are the values the
    eager setup pass stores, and only replayed samples cost a forward. With one sample per logit
    forward (no batch-size-dependent kernels) the two are bitwise equal and so are the runs; with
    the default batches they agree to float tolerance (this tiny, barely trained protocol flips a
    test prediction on 1e-7 differences, so its curves are compared at one sample per forward)."""
    eager, eager_curves, _, _ = run(capped, "derpp", 0, options, pretrain_logits="at_setup", logit_batch_size=1)
    lazy, lazy_curves, _, _ = run(capped, "derpp", 0, options, logit_batch_size=1)
    assert lazy.config.pretrain_logits == "on_replay"
    n_pre = len(capped.stream.pretrain_ids)
    lazy_pre = [int(g) for g in np.flatnonzero(lazy.logits.row_of >= 0) if g < n_pre]
    assert lazy_pre  # some pre-training samples were replayed and got logits
    assert all(g in eager.logits and np.array_equal(lazy.logits.row(g), eager.logits.row(g)) for g in lazy_pre)
    assert lazy.ctx.counters["derpp_logit_forward_samples"] < eager.ctx.counters["derpp_logit_forward_samples"]
    for a, b in zip(eager_curves, lazy_curves):
        assert (a.all, a.old, a.new) == (b.all, b.old, b.new)
    batched, _, _, _ = run(capped, "derpp", 0, options)  # default logit batches
    for g in [int(g) for g in np.flatnonzero(batched.logits.row_of >= 0) if g < n_pre and g in eager.logits]:
        np.testing.assert_allclose(batched.logits.row(g), eager.logits.row(g), rtol=1e-5, atol=1e-5)


def test_logit_store_reuses_rows_and_pads_short_rows() -> None:
    from bench_stability_gap.methods.derpp import LogitStore

    store = LogitStore(10, 4)
    store.put(np.array([3, 7]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    store.put(np.array([5]), torch.tensor([[5.0, 6.0, 7.0]]))
    out, mask = store.get(np.array([7, 5, 1]), 4)
    assert out.tolist() == [[3.0, 4.0, 0.0, 0.0], [5.0, 6.0, 7.0, 0.0], [0.0] * 4]
    assert mask.tolist() == [[True, True, False, False], [True, True, True, False], [False] * 4]
    assert store.missing(np.array([1, 3, 1, 9])).tolist() == [1, 9]
    store.keep_only(np.array([5]))
    assert len(store) == 1 and 3 not in store and store.row(5).tolist() == [5.0, 6.0, 7.0]
    bytes_before = store.nbytes
    store.put(np.array([2]), torch.tensor([[9.0]]))  # a freed row is reused: the store does not grow
    assert store.nbytes == bytes_before and store.row(2).tolist() == [9.0]
    again = LogitStore(10, 4)
    again.load_state_dict(store.state_dict())
    assert again.row(5).tolist() == [5.0, 6.0, 7.0] and again.row(2).tolist() == [9.0] and 3 not in again


def test_logit_store_grows_by_blocks_and_round_trips_without_sharing() -> None:
    from bench_stability_gap.methods.derpp import LogitStore

    store = LogitStore(20, 3, block_rows=4)
    values = torch.arange(30, dtype=torch.float32).view(10, 3)
    store.put(np.arange(10), values)  # 10 rows: three blocks of 4, none copied or doubled
    assert len(store.blocks) == 3 and store.nbytes == 3 * 4 * 3 * 4
    out, mask = store.get(np.array([9, 0, 5, 15]), 3)
    assert torch.equal(out[:3], values[[9, 0, 5]]) and out[3].tolist() == [0.0] * 3 and not mask[3].any()
    store.keep_only(np.arange(2, 10))
    store.put(np.array([12, 13]), torch.ones(2, 2))  # the two freed rows, before any new block
    assert sorted(int(store.row_of[g]) for g in (12, 13)) == [0, 1] and len(store.blocks) == 3
    again = LogitStore(20, 3)
    again.load_state_dict(store.state_dict())
    assert all(np.array_equal(again.row(g), store.row(g)) for g in (2, 9, 12, 13)) and 0 not in again
    again.put(np.array([14]), torch.full((1, 3), 7.0))  # the copy takes a free row of its own...
    assert 14 not in store and again.row(14).tolist() == [7.0] * 3
    assert store.blocks[0].data_ptr() != again.blocks[0].data_ptr()  # ...in blocks it does not share


def test_gdumb_memory_is_class_balanced(capped, options):
    method, _, budget, _ = run(capped, "gdumb", 0, options)
    labels = capped.stream.train.labels[np.asarray(method.ctx.memory.ids)]
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    assert budget.memory_peak_samples == CAP and counts.max() - counts.min() <= 1


def test_lwf_trains_on_new_samples_only_and_declares_teacher_forwards(capped, options):
    method, _, budget, _ = run(capped, "lwf", 0, options)
    assert budget.batch_old == 0 and budget.batch_new == 16
    assert method.ctx.counters["teacher_forward_samples"] == budget.samples_trained


def test_contract_covers_the_zoo():
    names = set(_base_names())
    assert {"derpp", "gdumb", "lwf", "remind", "vanilla", "finetune"} <= names
    assert "joint" not in names
    assert Path(__file__).name == "test_contract.py"


@pytest.mark.parametrize("text", ["vanilla", "gdumb"])
def test_split_memory_keeps_its_s1_share_through_a_run(capped, options, text):
    """The runner offers S1 as such: a split cap of 40 at share .75 holds 30 S1 samples all run long,
    the stream part (10) stays class-balanced, and GDumb's own policy does not replace the split."""
    import dataclasses

    from bench_stability_gap.harness.spec.protocol import Memory as MemorySpec

    spec = MemorySpec(policy="split", capacity=CAP, pretrain_share=0.75, include_pretrain=True)
    bench = dataclasses.replace(capped, protocol=capped.protocol.model_copy(update={"memory": spec}))
    method, curves, budget, _ = run(bench, text, 0, options)
    memory = method.ctx.memory
    assert memory.spec.policy == "split" and len(memory) == CAP == budget.memory_peak_samples
    s1 = set(int(g) for g in bench.stream.pretrain_ids)
    assert sum(int(g) in s1 for g in memory.ids) == 30 and memory.pretrain <= s1
    stream_labels = bench.stream.train.labels[[g for g in memory.ids if int(g) not in s1]]
    counts = np.bincount(stream_labels)[np.unique(stream_labels)]
    assert counts.max() - counts.min() <= 1  # 10 stream slots over the classes seen
