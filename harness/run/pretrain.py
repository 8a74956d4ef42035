"""The models a run trains offline: the deployed model, fitted on S1 once per protocol spec and kept in
a verified cache that later runs load, and plain offline training with uniform batches (``OfflineTraining``,
a stage: the deployed model's and, as ``joint.JointModel``, each joint reference model's)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...methods.base import MethodConfig, StandardMethod
from ..atomic import atomic_write, atomic_write_text
from ..data.stream import Cycler
from ..identity import recorded_precision
from ..model.backbone import SplitModel
from ..model.cpu import cache_tag
from ..model.device import autocast, seed_everything
from ..paths import cache_dir
from .checkpoint import Checkpointer
from .loop import Stretch, train_stretch
from .memory import Memory
from .options import RunOptions
from .report import say
from .stage import Stage
from .stopped import stage

if TYPE_CHECKING:
    from .workbench import Workbench


def deploy(bench: Workbench, options: RunOptions) -> None:
    """Fit the deployed model on S1 once per protocol spec, weights and CPU thread count; later runs load
    it from the cache.

    The cache file carries a sidecar with its sha256 and the spec hash it was made for: a file that fails
    verification is named, moved aside and rebuilt, never loaded. Concurrent runs build it once (a file
    lock, re-checked after taking it). The training checkpoints beside it, so a killed pre-training resumes.
    """
    from filelock import FileLock

    from ..atomic import move_aside
    from ..model.backbone import file_sha256

    p = bench.protocol.reference  # NAME@Kx trains on S1 exactly as NAME does
    tag = cache_tag(bench.device, options.cpu_kernels)  # a model trained with another thread count or kernels differs
    apart = "" if bench.precision == "fp32" else f"-{bench.precision}"  # trained in another precision: its own file
    path = (cache_dir() / "deployed"
            / f"{p.name}-{p.spec_hash}-{bench.weights.rpartition(':')[2][:16]}{apart}{'-' * bool(tag)}{tag}.pt")
    sidecar = path.with_name(path.name + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if path.is_file():
            try:
                meta = json.loads(sidecar.read_text())
                # one trained in another precision is never loaded as this one
                made_in = recorded_precision(meta.get("precision"), bench.device.type)
                # bf16 models trained before autocast was entered per update are near chance: never reused
                stale = made_in == "bf16" and meta.get("autocast") != "per-update"
                ok = (meta.get("spec_hash") == p.spec_hash and made_in == bench.precision and not stale
                      and meta.get("sha256") == file_sha256(path))
            except (OSError, ValueError):
                ok = False
            if ok:
                bench.deployed.load_state_dict(torch.load(path, map_location=bench.device, weights_only=True))
                return
            aside = move_aside(path)
            say(options, f"Deployed-model cache {path} failed verification (its sha256, spec hash or precision does "
                         f"not match {sidecar.name}, or it is a bf16 model trained before autocast was entered per "
                         f"update); moved to {aside} and rebuilt.")
        saver = Checkpointer(path.with_name(f"{path.stem}-{options.device_key}.ckpt"), options.checkpoint_every,
                             options.checkpoint_seconds)
        if options.restart:
            saver.discard()
        config = MethodConfig(lr=p.pretrain.lr, weight_decay=p.pretrain.weight_decay, layer_decay=1.0,
                              trainable=p.pretrain.trainable)
        generator = seed_everything(p.pretrain.seed)
        with stage(f"training the deployed model of {p.name} on S1", [saver]):
            training = OfflineTraining(bench, bench.deployed, config, bench.stream.pretrain_ids, p.pretrain.updates,
                                       p.pretrain.batch_size, np.random.default_rng(p.pretrain.seed), generator,
                                       "pretrain S1", options, saver)
            resumed = training.resume()
            say(options, f"Training the deployed model on S1 ({p.pretrain.updates} updates, cached for later runs)"
                         + (f": resuming at update {training.loop.update}" if resumed else ""))
            training.train()
        atomic_write(path, lambda fh: torch.save(bench.deployed.state_dict(), fh))
        atomic_write_text(sidecar, json.dumps({"sha256": file_sha256(path), "spec_hash": p.spec_hash,
                                               "weights": bench.weights, "precision": bench.precision,
                                               "autocast": "per-update"}))
        saver.discard()


class OfflineTraining(Stage):
    """Plain offline training of ``model`` on ``ids`` with uniform batches: the deployed model's pre-training,
    and (as ``joint.JointModel``) each joint model's. One stretch, checkpointed in one file that each
    periodic checkpoint replaces; its own part is the learner (optimizer and schedule) and its batch order."""

    name = "pretrain"
    mid_apart = False

    def __init__(self, bench: Workbench, model: SplitModel, config: MethodConfig, ids: np.ndarray, updates: int,
                 batch_size: int, rng: np.random.Generator, generator: torch.Generator, desc: str,
                 options: RunOptions, checkpoint: Checkpointer | None = None) -> None:
        super().__init__(checkpoint)
        self.bench, self.model, self.options, self.desc = bench, model, options, desc
        self.updates, self.batch_size = updates, batch_size
        self.streams = (rng, generator)
        self.learner = StandardMethod(config)
        memory = Memory(bench.protocol.memory.model_copy(update={"policy": "none", "capacity": None}),
                        bench.stream.train.labels, bench.stream.train.sample_bytes, rng)
        self.learner.setup(model, bench.context(memory, rng, generator))
        self.learner.optimizer, self.learner.scheduler = self.learner.build_optimizer(updates)
        self.cycler = Cycler(ids, rng)
        # One autocast region per update, never one around the stretch: autocast caches its bf16 copies of
        # the weights until its region ends, so a region spanning many updates trains every forward on the
        # weights of its first one (the joint model and the deployed model came out at chance under bf16).
        self.accel = autocast(bench.device, bench.precision)

    def own_state(self) -> dict[str, Any]:
        return {"learner": self.learner.state_dict(), "cycler": (self.cycler.order, self.cycler.pos)}

    def load_own(self, own: dict[str, Any]) -> None:
        self.learner.load_state_dict(own["learner"])
        self.cycler.order, self.cycler.pos = own["cycler"]

    def resume(self) -> bool:
        """Put back this training's stored mid-training checkpoint, if there is one (True: resumed)."""
        state = self.stored()
        if state is None or state["kind"] != "mid":
            return False
        self.load_state_dict(state)
        return True

    def _step(self, u: int, ids: np.ndarray) -> None:
        with self.accel:
            self.learner.observe(self.bench.batch(ids, self.batch_size))

    def train(self) -> None:
        """The updates left, from where the loop state stands."""
        stretch = Stretch(self.desc, self.name, self.updates, draw=lambda: self.cycler.take(self.batch_size),
                          step=self._step, start=self.loop.update, pending=self.loop.pending,
                          save=None if self.checkpoint is None else self.save_at)
        train_stretch(stretch, self.checkpoint, self.bench.train_inputs, self.options)
