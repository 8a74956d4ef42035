"""Cheats, each a small change to the standard step; see tests/test_fair_play.py for what catches them."""

from __future__ import annotations

import numpy as np
import torch

import json as foreign  # a module of another package: no eval-point check reads its globals

from bench_stability_gap.methods.base import StandardMethod, TrainBatch

from . import stash

STASH: list[torch.Tensor] = []  # module state a predict() could leave test inputs in


class KeepTestInputs(StandardMethod):
    """Keeps the eval inputs predict() receives, labels them with its own argmax and replays them."""

    name = "cheat_keep_test"

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.kept: list[tuple[torch.Tensor, torch.Tensor]] = []

    def predict(self, x):
        logits = super().predict(x)
        self.kept.append((x.detach().clone(), logits.argmax(1)))
        return logits

    def observe(self, batch: TrainBatch):
        if self.kept:
            x, y = self.kept[-1]
            batch = TrainBatch(torch.cat([batch.x, x[:4]]), torch.cat([batch.y, y[:4]]), batch.ids, batch.is_new)
        return super().observe(batch)


class GlobalTestStash(StandardMethod):
    """Leaves the eval inputs in a module-level list, out of the method's own state."""

    name = "cheat_global_test"

    def predict(self, x):
        STASH.append(x.detach().clone())
        return super().predict(x)


class StreamTestSplit(StandardMethod):
    """Reads the test split through ctx.stream at setup."""

    name = "cheat_stream_test"

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.test_labels = ctx.stream.test.labels


class AdaptInPredict(StandardMethod):
    """Test-time adaptation: predict() in train mode, so batch-norm statistics follow the test data."""

    name = "cheat_adapt_in_predict"

    def predict(self, x):
        self.model.train()
        return self.model(x)


class PrivateIds(StandardMethod):
    """Keeps every sample id it sees in its own list and replays from it, beyond the memory's cap."""

    name = "cheat_private_ids"

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.every_id: list[int] = []

    def observe(self, batch: TrainBatch):
        self.every_id.extend(int(i) for i in batch.ids)
        old = int((~batch.is_new).sum())
        if old:
            ids = np.asarray(self.every_id[:old], dtype=np.int64)  # the oldest ids, long evicted
            x = torch.cat([batch.x[batch.is_new], self.ctx.inputs.get(ids)])
            y = torch.cat([batch.y[batch.is_new], torch.as_tensor(self.ctx.stream.train.labels[ids], device=batch.y.device)])
            batch = TrainBatch(x, y, batch.ids, batch.is_new)
        return super().observe(batch)


class PrivateData(StandardMethod):
    """Keeps a copy of every input it trains on (its own replay buffer, uncounted by the memory)."""

    name = "cheat_private_data"

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.hoard: list[torch.Tensor] = []

    def observe(self, batch: TrainBatch):
        self.hoard.append(batch.x.detach().clone())
        return super().observe(batch)


class RewindRng(StandardMethod):
    """Rewinds the generator it is lent before every update, hoping to replay one memory batch forever.
    It records the batch ids the harness gave it, so a test can compare them with vanilla's."""

    name = "cheat_rewind_rng"

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.start = ctx.rng.bit_generator.state
        self.seen_ids: list[list[int]] = []

    def observe(self, batch: TrainBatch):
        self.ctx.rng.bit_generator.state = self.start
        self.ctx.rng.integers(0, 10, 3)
        self.seen_ids.append([int(i) for i in batch.ids])
        return super().observe(batch)


class LossyState(StandardMethod):
    """Counts its updates but forgets the count when loaded: a resumed run would differ."""

    name = "cheat_lossy_state"

    def observe(self, batch: TrainBatch):
        self.updates = getattr(self, "updates", 0) + 1
        return super().observe(batch)

    def state_dict(self):
        return {**super().state_dict(), "updates": getattr(self, "updates", 0)}


class HelperModuleStash(StandardMethod):
    """Leaves the eval inputs in a helper module of its package, neither its class's nor its own module."""

    name = "cheat_helper_stash"

    def predict(self, x):
        stash.KEPT.append(x.detach().clone())
        return super().predict(x)


class TrainOriginal(StandardMethod):
    """Test-time training of the model the run goes on with: a closure leads the eval copy back to the
    original method (deepcopy copies functions by reference), whose head it nudges through ``.data``."""

    name = "cheat_train_original"

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self.original = (lambda me: lambda: me)(self)

    def predict(self, x):
        head = self.original().model.head.fc
        head.bias.data.add_(0.01 * x.float().mean())
        return super().predict(x)


class FutureIds(StandardMethod):
    """Reads the next session's inputs early by writing its ids over the session in progress's."""

    name = "cheat_future_ids"

    def begin_session(self, session) -> None:
        super().begin_session(session)
        later = [s for s in self.ctx.stream.sessions if s.index > session.index]
        if later:
            session.train_ids[:4] = later[0].train_ids[:4]
            self.early = self.ctx.inputs.get(np.asarray(later[0].train_ids[:4]))


class ForeignStash(StandardMethod):
    """Leaves what predict saw (the mean of the test images) in another package's module and trains on it:
    no eval-point check looks there; evaluating on other test images changes its training."""

    name = "cheat_foreign_stash"

    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        foreign.__dict__["_bench_seen"] = []  # one run's only: its repeat is deterministic

    def predict(self, x):
        foreign.__dict__["_bench_seen"].append(float(x.float().mean()))
        return super().predict(x)

    def observe(self, batch: TrainBatch):
        seen = foreign.__dict__.get("_bench_seen")
        if seen:
            batch = TrainBatch(batch.x + 1e-3 * seen[-1], batch.y, batch.ids, batch.is_new)
        return super().observe(batch)
