"""REMIND (Hayes et al., ECCV 2020) as the paper runs it online (Harun & Kanan 2024, Sec. 5.3, appendix).

REMIND stores what the frozen trunk makes of a sample, compressed by product quantisation, and
trains the plastic body and head on reconstructions of it:

- **Codebook.** At ``setup`` a faiss ``ProductQuantizer`` is fitted on trunk features of the
  pre-training data (REMIND fits on its base-initialisation data): every spatial position of a
  C x H x W feature map is one C-dim vector, cut into ``pq_subquantizers`` sub-vectors of
  ``2**pq_bits`` centroids each. The codebook is then fixed for the run.
- **Memory.** The harness keeps the ids (the protocol's cap, counted in samples as the paper does);
  what REMIND holds for each is its PQ code, H*W*M*bits/8 bytes, which ``sample_bytes`` reports
  (a 80x2x2 EfficientNet-Lite0 trunk map with M = 8: 32 bytes instead of 784 for the image). Codes are
  computed once, when a sample arrives (pre-training samples the protocol stores: at ``setup``), and
  dropped when the sample leaves the memory. REMIND's memory is class-balanced: when full, a random
  sample of the largest class makes room (``memory_policy``).
- **Update.** The harness draws the batch (online: 1 new + 50 old). Every sample, the new one too,
  is trained on as decode(code) (REMIND quantises the arriving sample before learning from it), with
  REMIND's feature-level augmentation: a random resized crop of each feature map (area 2/7..1 of the
  map, aspect 3/4..4/3, bilinearly resized back to H x W), then mixup (lambda ~ Beta(0.1, 0.1), one
  per batch) among the replayed samples, whose targets mix with the same lambda. The body and head
  learn with the standard step (AdamW, layer-wise lr decay), so every modifier composes (+sgm).
  Reconstructions are declared in ``ctx.counters["remind_reconstruct_samples"]``; trunk passes made
  here (only when the inputs are images) in ``remind_trunk_forward_samples``. FLOPs: the body's
  forwards of reconstructions are charged no trunk pass (none made them); the arriving sample's is
  charged once, so cached and uncached runs report the same training FLOPs (a test checks it).
- **Per-class learning rate.** REMIND's ``step_lr_per_class`` (tyler-hayes/REMIND,
  REMINDModel.py and its experiment scripts), the schedule the paper asks for ("REMIND's default
  per-class learning rate scheduler", appendix): the lr of an update is set by the class of the
  arriving sample, ``lr * gamma**floor(n / lr_step)`` after ``n`` samples of that class, with
  ``lr_step`` 100 and ``gamma = (lr_end / lr)**(lr_step / lr_decay_samples)``, ``lr_decay_samples``
  1300 (REMIND's constant: an ImageNet class's size), so lr reaches ``lr_end`` after 1300 samples of
  a class and keeps decaying past it, as StepLR does. A class with fewer than 100 samples (CUB: ~30)
  trains at ``lr`` throughout. ``lr_step: 1, lr_decay_samples: null`` is the other reading (decay
  over the class's own samples in the stream, to ``lr_end`` at its last). The factor multiplies the
  group learning rates for that one step (layer-wise decay kept) and composes with a modifier's
  schedule (+sgm's OneCycle) by multiplication, so REMIND and REMIND+SGM use "identical settings".
- **PQ.** On the paper's protocols (online_cub_*, methods/defaults.yaml) REMIND's ImageNet settings:
  32 codebooks (``pq_subquantizers``) of 256 centroids (``pq_bits`` 8); elsewhere 8 codebooks, which
  divide the embedded protocols' 80-channel trunk (32 does not).
- **Prediction.** As REMIND does, test features also pass through the quantiser (the deployed
  system is trunk -> PQ -> body); ``eval_reconstruct: false`` evaluates on raw trunk features.

REMIND needs the trunk to be frozen (it always is) and, for speed, cached: trunk features come from
``ctx.inputs``; when the inputs are images the trunk is run here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import faiss
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..harness.data.stream import Session
from ..harness.errors import BenchError
from .base import StandardMethod, StepStats, TrainBatch
from .configs import REMINDConfig
from .derpp import recount_memory_bytes


@contextmanager
def _features_in(model) -> Iterator[None]:
    """The body gets REMIND's reconstructions whatever the model's cache flag says; no trunk made them,
    so FLOP accounting charges them none (the arriving samples' trunk passes are counted apart)."""
    before = model.trunk_cached, model.charge_trunk
    model.trunk_cached, model.charge_trunk = True, False
    try:
        yield
    finally:
        model.trunk_cached, model.charge_trunk = before


class REMIND(StandardMethod):
    name = "remind"
    summary = "REMIND: PQ-compressed trunk features as memory, replayed reconstructed with crop+mixup; per-class lr."
    Config = REMINDConfig
    config: REMINDConfig
    memory_policy = "class_balanced"

    def __init__(self, config, modifiers=None) -> None:
        super().__init__(config, modifiers)
        self.pq: faiss.ProductQuantizer | None = None
        self.codes: dict[int, np.ndarray] = {}
        self.feature_shape: tuple[int, int, int] | None = None  # C, H, W
        self._mix: tuple[np.ndarray, float] | None = None
        self._lr_factor = 1.0

    # -- setup: codebook from the pre-training data ----------------------------------------------
    def setup(self, model, ctx) -> None:
        super().setup(model, ctx)
        self._inputs_cached = bool(getattr(ctx.inputs, "cached", True))
        self.rng = np.random.default_rng([ctx.generator.initial_seed(), 0x5EED])
        labels = ctx.stream.train.labels
        stream_ids = (np.concatenate([s.train_ids for s in ctx.stream.sessions]) if ctx.stream.sessions
                      else np.empty(0, int))
        self.class_total = np.bincount(labels[stream_ids], minlength=int(labels.max()) + 1) if len(stream_ids) else \
            np.zeros(int(labels.max()) + 1, dtype=np.int64)
        self.class_seen = np.zeros_like(self.class_total)
        self.fit_codebook(ctx.stream.pretrain_ids)
        self.codes = {}
        self.encode_ids(np.asarray(ctx.memory.ids, dtype=np.int64))
        recount_memory_bytes(ctx.memory)

    def trunk_features(self, ids: np.ndarray) -> Tensor:
        """Trunk features of stored or pre-training samples, used without a body forward (codebook
        fit, encoding): cached ones are charged one trunk forward each (``trunk_feature_samples``); on
        images the trunk runs here and the FLOP hooks see it."""
        x = self.ctx.inputs.get(ids)
        if self._inputs_cached:
            self._count("trunk_feature_samples", len(ids))
            return x
        return self._trunk(x)

    def fit_codebook(self, pretrain_ids: np.ndarray) -> None:
        rng = np.random.default_rng(self.config.pq_seed)
        ids = np.sort(rng.choice(pretrain_ids, size=min(self.config.pq_fit_samples, len(pretrain_ids)), replace=False))
        parts = [self._vectors(self.trunk_features(ids[i : i + self.config.chunk]))
                 for i in range(0, len(ids), self.config.chunk)]
        vectors = np.ascontiguousarray(np.concatenate(parts))
        c = vectors.shape[1]  # the trunk's feature channels
        m, bits = self.config.pq_subquantizers, self.config.pq_bits
        if c % m:
            raise BenchError(f"Method remind: pq_subquantizers={m} must divide the trunk's {c} feature channels "
                             f"(protocol {self.ctx.protocol.name}); "
                             f"pick a divisor of {c} with --set pq_subquantizers=N.")
        self.pq = faiss.ProductQuantizer(c, m, bits)
        self.pq.cp.seed = 1234 + self.config.pq_seed
        self.pq.train(vectors)

    def _vectors(self, feats: Tensor) -> np.ndarray:
        """(N, C, H, W) -> (N*H*W, C) float32: one vector per spatial position."""
        n, c, h, w = feats.shape
        self.feature_shape = (c, h, w)
        return feats.detach().float().permute(0, 2, 3, 1).reshape(-1, c).cpu().numpy()

    # -- codes ---------------------------------------------------------------------------------
    def encode(self, feats: Tensor) -> np.ndarray:
        """(N, C, H, W) features -> (N, H*W, code_size) uint8 codes."""
        n = feats.shape[0]
        pq, _ = self._fitted()
        codes = pq.compute_codes(np.ascontiguousarray(self._vectors(feats)))
        return codes.reshape(n, -1, pq.code_size)

    def decode(self, codes: np.ndarray, device: torch.device) -> Tensor:
        """(N, H*W, code_size) codes -> (N, C, H, W) reconstructed features."""
        pq, (c, h, w) = self._fitted()
        n = codes.shape[0]
        # faiss's Python layer replaces the C++ decode(codes, x) with decode(codes) -> x; its stub has the former
        rows = np.ascontiguousarray(codes.reshape(-1, pq.code_size))
        flat = pq.decode(rows)  # type: ignore[call-arg, func-returns-value]
        return torch.from_numpy(flat).view(n, h, w, c).permute(0, 3, 1, 2).contiguous().to(device)

    def _fitted(self) -> tuple[faiss.ProductQuantizer, tuple[int, int, int]]:
        """The codebook and the feature shape it encodes: both set by ``fit_codebook`` (or a checkpoint)."""
        if self.pq is None or self.feature_shape is None:
            raise RuntimeError("remind: features are encoded only after fit_codebook")
        return self.pq, self.feature_shape

    def reconstruct(self, feats: Tensor) -> Tensor:
        return self.decode(self.encode(feats), feats.device).to(feats.dtype)

    def encode_ids(self, ids: np.ndarray, feats: Tensor | None = None) -> None:
        """Codes for samples that have none yet (computed once per sample, when it arrives)."""
        todo = np.asarray([i for i, g in enumerate(ids) if int(g) not in self.codes], dtype=np.int64)
        if len(todo) == 0:
            return
        for start in range(0, len(todo), self.config.chunk):
            pos = todo[start : start + self.config.chunk]
            f = feats[torch.from_numpy(pos).to(feats.device)] if feats is not None else self.trunk_features(ids[pos])
            for gid, code in zip(ids[pos], self.encode(f)):
                self.codes[int(gid)] = code

    def sample_bytes(self, gid: int) -> int | None:
        if self.pq is None or self.feature_shape is None:
            return None
        _, h, w = self.feature_shape
        return h * w * int(self.pq.code_size)

    # -- augmentation --------------------------------------------------------------------------
    def random_resized_crop(self, x: Tensor) -> Tensor:
        """REMIND's feature-map augmentation: crop a random box of each map, resize it back."""
        n, _, h, w = x.shape
        lo, hi = self.config.crop_scale
        log_r = np.log(self.config.crop_ratio)
        out = torch.empty_like(x)
        for i in range(n):
            ch, cw = h, w
            for _ in range(10):
                area = h * w * self.rng.uniform(lo, hi)
                ratio = float(np.exp(self.rng.uniform(*log_r)))
                tw, th = int(round(np.sqrt(area * ratio))), int(round(np.sqrt(area / ratio)))
                if 1 <= tw <= w and 1 <= th <= h:
                    ch, cw = th, tw
                    break
            top = int(self.rng.integers(0, h - ch + 1))
            left = int(self.rng.integers(0, w - cw + 1))
            crop = x[i : i + 1, :, top : top + ch, left : left + cw]
            out[i : i + 1] = crop if (ch, cw) == (h, w) else F.interpolate(crop, size=(h, w), mode="bilinear",
                                                                           align_corners=False)
        return out

    def mixup(self, x: Tensor, old: np.ndarray) -> Tensor:
        """Mix the replayed rows among themselves with one lambda; remembered for the targets."""
        self._mix = None
        if self.config.mixup_alpha <= 0 or len(old) < 2:
            return x
        lam = float(self.rng.beta(self.config.mixup_alpha, self.config.mixup_alpha))
        perm = old[self.rng.permutation(len(old))]
        rows, partners = torch.from_numpy(old).to(x.device), torch.from_numpy(perm).to(x.device)
        x = x.clone()
        x[rows] = lam * x[rows] + (1 - lam) * x[partners]
        self._mix = (np.stack([old, perm]), lam)
        return x

    # -- per-class learning rate ---------------------------------------------------------------
    def class_lr(self, c: int) -> float:
        cfg = self.config
        span = cfg.lr_decay_samples or max(int(self.class_total[c]) if c < len(self.class_total) else 1, 1)
        seen = (int(self.class_seen[c]) // cfg.lr_step) * cfg.lr_step if c < len(self.class_seen) else 0
        return cfg.lr * (cfg.lr_end / cfg.lr) ** (seen / span)  # no floor at lr_end: StepLR keeps decaying

    def lr_factor(self, new_labels: np.ndarray) -> float:
        if self.config.lr_schedule == "none" or len(new_labels) == 0:
            return 1.0
        return float(np.mean([self.class_lr(int(c)) for c in new_labels])) / self.config.lr

    def build_optimizer(self, total_steps: int | None):
        optimizer, scheduler = super().build_optimizer(total_steps)
        saved: list[float] = []

        def scale(opt: torch.optim.Optimizer, *_: object) -> None:  # _: the step's args and kwargs, unread
            saved[:] = [g["lr"] for g in opt.param_groups]
            for g in opt.param_groups:
                g["lr"] = g["lr"] * self._lr_factor

        def restore(opt: torch.optim.Optimizer, *_: object) -> None:
            for g, lr in zip(opt.param_groups, saved):
                g["lr"] = lr

        optimizer.register_step_pre_hook(scale)
        optimizer.register_step_post_hook(restore)
        return optimizer, scheduler

    # -- the step ------------------------------------------------------------------------------
    def observe(self, batch: TrainBatch) -> StepStats:
        ids = np.asarray(batch.ids, dtype=np.int64)
        is_new = batch.host_is_new()
        new_rows = batch.is_new
        # only the arriving samples need the trunk: the replayed ones come from their codes
        if self._inputs_cached:  # cached trunk features: charged as the trunk pass an uncached run makes
            feats_new = batch.x[new_rows]
            self._count("trunk_feature_samples", len(feats_new))
        else:
            feats_new = self._trunk(batch.x[new_rows])
        self.encode_ids(ids[is_new], feats_new)  # arrivals: encoded once, when they arrive
        self.encode_ids(ids[~is_new])  # stored samples have codes already (only misses are encoded)
        x = self.decode(np.stack([self.codes[int(g)] for g in ids]), batch.x.device).to(feats_new.dtype)
        self._count("remind_reconstruct_samples", len(ids))
        if not self.config.reconstruct_new:
            x[new_rows] = feats_new
        self._mix = None
        if self.config.augment:
            x = self.random_resized_crop(x)
            x = self.mixup(x, np.flatnonzero(~is_new))
        labels = batch.host_labels()
        self._lr_factor = self.lr_factor(labels[is_new])
        with _features_in(self.model):
            stats = super().observe(dataclasses.replace(batch, x=x))
        self._lr_factor = 1.0
        for c in labels[is_new]:
            if c >= len(self.class_seen):
                self.class_seen = np.pad(self.class_seen, (0, c + 1 - len(self.class_seen)))
            self.class_seen[c] += 1
        return stats

    def _trunk(self, x: Tensor) -> Tensor:
        with torch.no_grad():
            feats = self.model.trunk(x)
        self._count("remind_trunk_forward_samples", len(x))
        return feats

    def loss(self, batch: TrainBatch, logits: Tensor, targets: Tensor) -> Tensor:
        if self._mix is None:
            return F.cross_entropy(logits, targets)
        (rows, partners), lam = self._mix
        t = targets if targets.is_floating_point() else F.one_hot(targets, logits.shape[1]).to(logits.dtype)
        t = t.clone()
        r, p = torch.from_numpy(rows).to(t.device), torch.from_numpy(partners).to(t.device)
        t[r] = lam * t[r] + (1 - lam) * t[p]  # rhs is evaluated from the unmixed targets first
        return F.cross_entropy(logits, t)

    def predict(self, x: Tensor) -> Tensor:
        feats = self.model.trunk_features(x)
        if self.config.eval_reconstruct:
            feats = self.reconstruct(feats)
        return self.model.head(self.model.body(feats))

    def shared_in_eval_copy(self) -> list:
        return [self.pq] if self.pq is not None else []  # a SWIG object: not copyable, only read by predict

    def begin_session(self, session: Session) -> None:
        keep = set(int(g) for g in self.ctx.memory.ids)
        self.codes = {g: c for g, c in self.codes.items() if g in keep}
        super().begin_session(session)

    def _count(self, key: str, n: int) -> None:
        self.ctx.counters[key] = self.ctx.counters.get(key, 0) + n

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["remind"] = {
            "centroids": None if self.pq is None else faiss.vector_to_array(self.pq.centroids).copy(),
            "feature_shape": self.feature_shape, "codes": {g: c.copy() for g, c in self.codes.items()},
            "class_seen": self.class_seen.copy(), "rng": self.rng.bit_generator.state,
        }
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        own = state.get("remind") or {}
        if own.get("centroids") is not None:
            c, _, _ = own["feature_shape"]
            self.feature_shape = tuple(own["feature_shape"])
            self.pq = faiss.ProductQuantizer(c, self.config.pq_subquantizers, self.config.pq_bits)
            faiss.copy_array_to_vector(np.asarray(own["centroids"], dtype=np.float32), self.pq.centroids)
        self.codes = {int(g): np.asarray(c) for g, c in own.get("codes", {}).items()}
        if "class_seen" in own:
            self.class_seen = np.asarray(own["class_seen"])
        if "rng" in own:
            self.rng.bit_generator.state = own["rng"]
