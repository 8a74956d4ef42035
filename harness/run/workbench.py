"""Stage 1 of a run: the workbench, everything a run builds once and its references share.

The stream (class order, sessions), the input stores (images decoded once, frozen-trunk outputs cached),
and the deployed model (trained on S1 once per protocol spec and cached: ``run.pretrain``; or the
protocol's weights). Also what a method is lent for a run (its context).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from ...methods.base import Context, Method, TrainBatch
from ..data.datapath import DataPathPlan, plan_data_path
from ..data.inputs import InputStore, Preprocess, feature_cache_key, gpu_decodable
from ..data.old_mix import plan_old_mix
from ..data.stream import Session, Stream, build_stream, check_batch_sizes
from ..errors import BenchError
from ..model.backbone import SplitModel, create_network, split_network, weights_digest
from ..model.compute import ComputeEnv
from ..model.cpu import cache_tag
from ..model.device import autocast, resolve_device, to_device, use_channels_last
from ..paths import cache_dir
from ..results.schema import git_commit
from ..spec.protocol import Protocol
from .isolation import (
    LentInputs,
    MemoryView,
    RandomStreams,
    ServedIds,
    sample_shape,
    train_view,
)
from .memory import Memory
from .options import RunOptions, run_precision
from .pretrain import deploy
from .report import say


@dataclass
class Lending:
    """What one CL run lends its method, and what the referee's checks on what it keeps read."""

    ctx: Context
    memory: Memory
    shape: tuple[int, ...]
    served: ServedIds
    """The session whose train ids ``ctx.inputs`` serves: the harness's, not lent."""
    unused: tuple[nn.Module, ...] = ()
    """Parts of the run's model nothing reads again (its trunk, once its features are cached): an eval
    copy shares them instead of copying them, and still checks that predict left them unchanged."""

    @property
    def shared(self) -> list[object]:
        """The harness's objects a method is lent: shared with, never copied into, an eval copy."""
        c = self.ctx
        return [c.protocol, c.stream, c.device, c.memory, c.inputs]

    def begin_session(self, session: Session) -> None:
        self.served.ids = session.train_ids



@dataclass
class Workbench:
    """Everything a run builds once: stream, input stores, deployed model."""

    protocol: Protocol
    stream: Stream
    train_inputs: InputStore
    test_inputs: InputStore
    deployed: SplitModel
    data_path: DataPathPlan | None = None  # how the inputs are held (printed, stamped on the result)
    weights: str = ""  # backbone.weights_digest: what the weights are, whatever path they came from
    compute: ComputeEnv = field(default_factory=ComputeEnv.now)  # the process settings, lent as ctx.compute

    @property
    def device(self) -> torch.device:
        return self.compute.device

    @property
    def precision(self) -> str:
        """``run_precision``: what every training and evaluation pass computes in."""
        return self.compute.precision

    def batch(self, ids: np.ndarray, n_new: int) -> TrainBatch:
        """The batch of ``ids``, the first ``n_new`` of them new, on the device (no copy waits for the GPU)."""
        labels = self.stream.train.labels[ids]
        return TrainBatch(self.train_inputs.get(ids), to_device(torch.from_numpy(labels), self.device), ids,
                          torch.arange(len(ids), device=self.device) < n_new, labels, np.arange(len(ids)) < n_new)

    def context(self, memory: Memory, rng: np.random.Generator, generator: torch.Generator,
                method_name: str = "harness", served: ServedIds | None = None) -> Context:
        """What a method is lent for a run: the stream without its test split, the memory read-only, train
        inputs for the memory and the session in progress (``served``, which the caller keeps to open each
        session; S1 until the first session begins), and ``rng``/``generator``, which must be the method's
        own (``isolation.random_streams``)."""
        served = served if served is not None else ServedIds(self.stream.pretrain_ids)
        inputs = LentInputs(self.train_inputs, memory, method_name, served)
        return Context(self.protocol, train_view(self.stream, method_name), self.device, MemoryView(memory), inputs,
                       rng, generator, self.compute)

    def lend(self, memory: Memory, method: Method, streams: RandomStreams, model: SplitModel) -> Lending:
        """The context for ``method`` (its own random streams, views without test data) and its checks;
        ``model``: the run's copy of the deployed model."""
        served = ServedIds(self.stream.pretrain_ids)
        ctx = self.context(memory, streams.method, streams.method_torch, method.name, served)
        unused = (model.trunk,) if model.trunk_cached else ()
        return Lending(ctx, memory, sample_shape(self.train_inputs), served, unused)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        b = self.protocol.backbone
        return (b.in_chans, b.input_size, b.input_size)


def prepare(protocol: Protocol, seed: int, options: RunOptions) -> Workbench:
    """Open the data, build the network, cache trunk features, and train or load the deployed model."""
    device = resolve_device(options.device)
    precision = run_precision(protocol, options)
    compute = ComputeEnv.for_run(device, options.cpu_kernels, precision)
    compute.apply()  # before the first float op: the trunk pass, the deployed model and the run inherit it
    git_commit()  # the commit this process's code came from, read before it computes (it is read once)
    stream = build_stream(protocol, seed)
    check_batch_sizes(stream)  # counts the spec could not fix are known now, before any compute
    torch.manual_seed(protocol.pretrain.seed)
    net = create_network(protocol.backbone, options.allow_download)
    num_classes = None if protocol.pretrain.mode == "weights" else stream.pretrain_classes
    model = split_network(net, protocol.backbone, num_classes).to(device)
    if device.type == "cuda" and precision == "bf16":  # before the trunk pass that fills the cache
        model = model.to(memory_format=torch.channels_last)
    if model.head.num_classes != stream.pretrain_classes:
        raise BenchError(
            f"Protocol {protocol.name}: the pretrained head has {model.head.num_classes} outputs but the "
            f"pre-training data ({protocol.pretrain_data.source}) has {stream.pretrain_classes} classes."
        )
    sources = [protocol.pretrain_data, *protocol.stream_data]
    root = cache_dir() / "trunk"
    root.mkdir(parents=True, exist_ok=True)
    trunk = model.trunk if options.trunk_cache else None
    pre = {"test": Preprocess(protocol.backbone),
           "train": Preprocess(protocol.backbone, augment=protocol.training.augment)}
    amp = precision == "bf16" and device.type == "cuda"  # the trunk pass under bf16 autocast (CUDA only)
    gpu = {split: options.gpu_decode and gpu_decodable(getattr(stream, split), pre[split], device) for split in pre}
    weights = weights_digest(protocol.backbone)
    arithmetic = f"cuda-{precision}" if device.type == "cuda" and precision != "fp32" else ""  # the trunk pass's
    # the tuning view evaluates on held-out train samples: their features are cached apart from the test split's
    names = {"train": "train", "test": "test" if protocol.scored_on == "test" else f"validation-{protocol.validation}"}
    keys = {split: feature_cache_key(protocol.backbone, sources, names[split],  # what the trunk saw differs by decoder
                                     "-".join(v for v in (arithmetic, "nvjpeg" if gpu[split] else "",
                                                          cache_tag(device, options.cpu_kernels))
                                              if v),
                                     weights) for split in pre}
    plan = plan_data_path(protocol, stream, trunk, device, amp, root, keys)  # before any trunk pass
    plan = dataclasses.replace(plan,
                               gpu_decode=tuple(n for n, split in (("eval", "test"), ("train", "train")) if gpu[split]))
    plan = dataclasses.replace(plan, old_mix=tuple(plan_old_mix(protocol, stream)))  # each session's batch by source
    say(options, plan.describe())
    t0 = time.perf_counter()
    with autocast(device, "fp32" if precision == "bf16" else precision):  # the TF32 switches; bf16: the store's own
        test_inputs = InputStore(stream.test, pre["test"], trunk, device, keys["test"], root, desc="trunk (eval)",
                                 amp=amp, progress=options.progress, mode=plan.test.mode, gpu_decode=gpu["test"])
        t1 = time.perf_counter()
        train_inputs = InputStore(stream.train, pre["train"], trunk, device, keys["train"], root, desc="trunk (train)",
                                  amp=amp, progress=options.progress, mode=plan.train.mode, gpu_decode=gpu["train"])
    say(options, f"inputs ready: eval {t1 - t0:.1f} s, train {time.perf_counter() - t1:.1f} s")
    model.trunk_cached = options.trunk_cache
    bench = Workbench(protocol, stream, train_inputs, test_inputs, model, plan, weights, compute)
    if protocol.pretrain.mode == "train":
        deploy(bench, options)
    use_channels_last(model, device, precision)  # after pre-training: the deployed model is as before
    return bench
