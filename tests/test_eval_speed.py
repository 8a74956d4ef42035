"""The CPU evaluation's speed levers change neither a FLOP nor a prediction: the chunk follows the
widest activation, the FLOP tally counted once per row shape equals the tally hooked on every
forward, and the logits are those of the old path."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bench_stability_gap.harness.data.inputs import InputStore, Preprocess
from bench_stability_gap.harness.model import cpu as CPU
from bench_stability_gap.harness.model.cpu import cpu_forward_chunk, widest_row_bytes
from bench_stability_gap.harness.data.sources import ArraySplit
from bench_stability_gap.harness.data.stream import Catalog
from bench_stability_gap.harness.model import flops as FL
from bench_stability_gap.harness.model.backbone import GrowingHead, SplitModel
from bench_stability_gap.harness.run.evaluation import EvalPlan, evaluate
from bench_stability_gap.harness.spec.protocol import load_protocol


def _tiny_split(width: int = 4) -> SplitModel:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU())
    body = nn.Sequential(nn.Conv2d(width, 6, 3, stride=2, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten())
    return SplitModel(trunk, body, GrowingHead(6, 5)).eval()


def _store(n: int) -> InputStore:
    """``n`` random 32-px images, preprocessed once and kept (the ``images`` input mode)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, n)
    split = ArraySplit(rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), labels, [str(k) for k in range(5)])
    return InputStore(Catalog((split,), labels.astype(np.int64)), Preprocess(load_protocol("tiny_cil").backbone),
                      None, torch.device("cpu"), progress=False)


def _plan(store: InputStore) -> EvalPlan:
    labels = store.catalog.labels
    old = labels < 3
    return EvalPlan(ids=np.arange(len(labels)), labels=torch.from_numpy(labels), old=old, new=~old,
                    task=(~old).astype(np.int64), tasks=2)


def test_chunk_follows_the_widest_activation_per_row():
    # conv to 64 channels at 32 x 32 px: 64 * 32 * 32 * 4 B = 256 KiB per row, the widest output
    wide = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    narrow = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
    x = torch.randn(8, 3, 32, 32)
    assert widest_row_bytes(wide, x) == 64 * 32 * 32 * 4  # weights (64 x 3 x 3 x 3) are not rows
    assert widest_row_bytes(narrow, x) == 4 * 32 * 32 * 4
    assert cpu_forward_chunk(64 * 32 * 32 * 4) == CPU.CPU_ACTIVATION_BUDGET // (256 << 10) == 64
    assert cpu_forward_chunk(4 * 32 * 32 * 4) == CPU.CPU_FORWARD_CHUNK_MAX  # 1024 rows fit: capped
    assert cpu_forward_chunk(3 << 20) == CPU.CPU_FORWARD_CHUNK  # wider than the budget allows: the floor
    assert cpu_forward_chunk(100_000) == 128  # 167 rows fit: the largest power of two below


def test_tiny_cil_body_gets_bigger_chunks_than_its_trunk_pass():
    """The embedded protocol's body over cached 2 x 2 trunk features is narrow (43 KB per row at its widest,
    the depthwise tap table's product): 256 rows per forward, where a constant 16 made its tiny GEMMs thin;
    the trunk pass keeps 16 (its features are stored)."""
    from bench_stability_gap.harness.model.backbone import network_or_random_init, split_network

    spec = load_protocol("tiny_cil")
    net, backbone, _ = network_or_random_init(spec, False)
    model = split_network(net, backbone, 25).eval()
    feats = model.trunk(torch.randn(2, 3, 32, 32))
    assert cpu_forward_chunk(widest_row_bytes(lambda f: model.head(model.body(f)), feats)) == 256
    assert CPU.TRUNK_PASS_CHUNK == 16


def test_once_per_shape_tally_equals_the_hooked_tally_and_logits_the_old_path():
    """Evaluation counted by hooks on every 16-row forward (as before) and counted once per row shape
    with the chosen chunk: the same tally to the last bit, the same predictions and the same logits."""
    store = _store(70)  # 70 rows in batches of 32: row counts 32, 32, 6 and chunks of 16 in the old path
    plan = _plan(store)
    for cached in (False, True):
        model = _tiny_split()
        if cached:
            model.trunk_cached = True
            feats = model.trunk(store.get(plan.ids)).detach()
            store.table, store.row_of = feats, None  # the store now holds trunk features, row by id
            store.cached = True
        logits: dict[str, list[torch.Tensor]] = {"old": [], "new": []}
        tallies = {}
        for path in ("old", "new"):
            meter = FL.FlopMeter(model, (3, 32, 32), cached)

            def predict(x: torch.Tensor, path=path) -> torch.Tensor:
                out = model(x)
                logits[path].append(out)
                return out

            with meter.attached(), meter.evaluating():
                if path == "old":
                    acc = evaluate(predict, store, plan, 32, chunk=16)
                else:
                    acc_new = evaluate(predict, store, plan, 32, meter=meter)
            tallies[path] = meter.tally
        assert [len(t) for t in logits["old"]] == [16, 16, 16, 16, 6]
        assert [len(t) for t in logits["new"]][-3:] == [32, 32, 6]  # after the 2-row probe: whole batches
        assert torch.equal(torch.cat(logits["old"]), torch.cat(logits["new"][1:]))
        assert (acc.old, acc.new, acc.all, acc.tasks) == (acc_new.old, acc_new.new, acc_new.all, acc_new.tasks)
        old, new = tallies["old"], tallies["new"]
        assert new.fwd_samples == old.fwd_samples and new.macs == old.macs
        assert new.fwd_samples["eval"] == {"trunk": 70, "body": 70, "head": 70}  # uncached-equivalent when cached
        assert new.macs["eval"] > 0 and new.macs["train"] == 0


def test_once_per_shape_counts_by_hooks_where_it_cannot_replay():
    """A forward whose output will be back-propagated is counted by the hooks on every call."""
    model = _tiny_split()
    meter = FL.FlopMeter(model, (3, 8, 8))
    counted = meter.once_per_shape(model)
    x = torch.randn(3, 3, 8, 8)
    with meter.attached():
        for _ in range(2):
            counted(x).sum().backward()
    hooked = FL.FlopMeter(model, (3, 8, 8))
    with hooked.attached():
        for _ in range(2):
            model(x).sum().backward()
    assert meter.tally == hooked.tally and meter.tally.bwd_samples["train"]["body"] == 6
