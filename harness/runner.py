"""The run loop: deployed model, then sessions 2..N with exactly U updates each, evaluated on schedule.

The harness owns the stream, the batch composition, the memory and the budget; the method only sees
batches. Results are written atomically (JSON first, then MLflow) once the run is complete.

Budgets are enforced, not trusted: exactly one optimizer step per ``observe`` and none outside it, at
most the protocol's batch size trained on (backward) per update, the memory cap never exceeded; a
breach fails the run with a BenchError naming the method. FLOPs are measured as ``harness.flops``
describes. On CUDA the run's model is channels_last and updates and evaluation run under bf16
autocast (``RunOptions.amp``). On the CPU the default changes nothing; opt in with
``BENCH_CPU_CHANNELS_LAST=1`` to run the body (not the trunk, so trunk features are the same cached or
not) in channels_last, where oneDNN's depthwise-conv backward on the body's small maps is ~2x faster
(float-level differences that training amplifies: not the default's numbers).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from tqdm.auto import tqdm

from . import flops as FL
from . import metrics as M
from .backbone import SplitModel, create_network, split_network, weights_digest
from .curves import ReferenceSession, SessionCurve
from .datapath import DataPathPlan, plan_data_path
from .errors import BenchError
from .evaluation import EvalPlan, evaluate, eval_plan
from .inputs import InputStore, Preprocess, feature_cache_key
from .memory import Memory
from .paths import cache_dir
from .protocol import Protocol
from .registry import MethodSpec, build_method, method_config, method_settings
from .results import (Budget, MethodStamp, ProtocolStamp, References, RunResult, find_joint, git_commit,
                             iter_results, library_versions, now_iso, save_result)
from .stream import Session, Stream, build_stream
from ..methods.base import Context, Method, MethodConfig, StandardMethod, StepStats, TrainBatch


@dataclass
class RunOptions:
    results_dir: Path
    device: str = "cpu"
    trunk_cache: bool = True
    progress: bool = True
    allow_download: bool = False
    overrides: dict = field(default_factory=dict)
    log: bool = True  # print what the harness is doing (joint reference, caches)
    amp: bool = True  # on CUDA: bf16 autocast and channels_last (no effect on the CPU)
    # opt-in ($BENCH_CPU_CHANNELS_LAST=1): the body in channels_last on a CPU with oneDNN; faster
    # backward, but float-level differences grow over training, so the curves are not the default's
    cpu_channels_last: bool = field(default_factory=lambda: os.environ.get("BENCH_CPU_CHANNELS_LAST") == "1")


def seed_everything(seed: int) -> torch.Generator:
    """Seed every RNG before any model is built, so head and LoRA init are reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise BenchError(f"--device {name} was asked for, but torch sees no CUDA device on this machine.")
    return torch.device(name)


@contextmanager
def count_optimizer_steps() -> Iterator[list[int]]:
    """Count every optimizer step taken anywhere (the budget is enforced, not trusted)."""
    counter = [0]
    handle = register_optimizer_step_post_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    try:
        yield counter
    finally:
        handle.remove()


def use_channels_last(model: SplitModel, device: torch.device, options: RunOptions) -> SplitModel:
    """channels_last where it is faster: the whole model on CUDA (with amp), the body on a CPU with
    oneDNN. Parameters keep their values; only their memory layout changes."""
    if device.type == "cuda" and options.amp:
        return model.to(memory_format=torch.channels_last)
    if device.type == "cpu" and options.cpu_channels_last and torch.backends.mkldnn.is_available():
        model.body.to(memory_format=torch.channels_last)
    return model


def autocast(device: torch.device, amp: bool = True) -> AbstractContextManager:
    """bf16 autocast on CUDA (when ``amp``), nothing on the CPU."""
    if amp and device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def observe_within_budget(method: Method, batch: TrainBatch, steps: list[int], meter: FL.FlopMeter | None,
                          limit: int) -> tuple[StepStats, int]:
    """One ``observe`` under the budget: exactly one optimizer step and at most ``limit`` samples
    trained on (backward through any part). Returns the method's stats and the samples trained."""
    before = steps[0]
    if meter is not None:
        meter.start_update()
    stats = method.observe(batch)
    made = steps[0] - before
    if made != 1:
        raise BenchError(
            f"Method {method.name!r} made {made} optimizer steps in one observe() call; "
            f"the protocol's budget is exactly one update per call."
        )
    trained = 0
    if meter is not None:
        trained, part = meter.end_update()
        if trained > limit:
            raise BenchError(
                f"Method {method.name!r} trained on {trained} samples in one update (backward through the "
                f"{part}); the protocol's batch allows {limit} per update. Extra forward passes without "
                f"gradient (teacher logits, init passes) are allowed and counted as FLOPs; training samples are not."
            )
    return stats, trained


def check_no_stray_steps(method: Method, steps: int, expected: int, where: str) -> None:
    """Optimizer steps outside ``observe`` (session hooks, predict) are updates the budget never granted."""
    if steps != expected:
        raise BenchError(
            f"Method {method.name!r} made {steps - expected} optimizer step(s) outside observe() ({where}); "
            f"the protocol's budget is exactly one update per observe() call and none elsewhere."
        )


def check_memory(method: Method, memory: Memory) -> None:
    """The storage cap is the harness's: a method that overfills the memory fails the run."""
    cap = memory.capacity
    if cap is not None and len(memory) > cap:
        raise BenchError(
            f"Method {method.name!r} overfilled the rehearsal memory: {len(memory)} samples stored, "
            f"the protocol's cap is {cap} (memory.policy {memory.spec.policy!r})."
        )


def add_to_memory(method: Method, memory: Memory, ids: np.ndarray) -> None:
    try:
        memory.add(ids)
    except AssertionError:
        check_memory(method, memory)
        raise
    check_memory(method, memory)


class Cycler:
    """Draws ids without replacement, reshuffling after each pass (epochs over a session)."""

    def __init__(self, ids: np.ndarray, rng: np.random.Generator, shuffle: bool = True) -> None:
        self.ids, self.rng, self.shuffle = ids, rng, shuffle
        self.order, self.pos = self._new_order(), 0

    def _new_order(self) -> np.ndarray:
        return self.rng.permutation(self.ids) if self.shuffle else self.ids

    def take(self, n: int) -> np.ndarray:
        out = []
        while n > 0:
            if self.pos == len(self.order):
                self.order, self.pos = self._new_order(), 0
            k = min(n, len(self.order) - self.pos)
            out.append(self.order[self.pos : self.pos + k])
            self.pos, n = self.pos + k, n - k
        return np.concatenate(out) if out else np.empty(0, dtype=np.int64)


@dataclass
class Workbench:
    """Everything a run builds once: stream, input stores, deployed model."""

    protocol: Protocol
    stream: Stream
    device: torch.device
    train_inputs: InputStore
    test_inputs: InputStore
    deployed: SplitModel
    data_path: DataPathPlan | None = None  # how the inputs are held (printed, stamped on the result)
    weights: str = ""  # backbone.weights_digest: what the weights are, whatever path they came from

    def batch(self, ids: np.ndarray, n_new: int) -> TrainBatch:
        is_new = torch.zeros(len(ids), dtype=torch.bool)
        is_new[:n_new] = True
        labels = torch.from_numpy(self.stream.train.labels[ids]).to(self.device)
        return TrainBatch(self.train_inputs.get(ids), labels, ids, is_new.to(self.device))


def _say(options: RunOptions, msg: str) -> None:
    if options.log:
        tqdm.write(msg)


def prepare(protocol: Protocol, seed: int, options: RunOptions) -> Workbench:
    """Open the data, build the network, cache trunk features, and train or load the deployed model."""
    device = resolve_device(options.device)
    stream = build_stream(protocol, seed)
    torch.manual_seed(protocol.pretrain.seed)
    net = create_network(protocol.backbone, options.allow_download)
    num_classes = None if protocol.pretrain.mode == "weights" else stream.pretrain_classes
    model = split_network(net, protocol.backbone, num_classes).to(device)
    if device.type == "cuda" and options.amp:  # before the trunk pass that fills the cache
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
    train_pre = Preprocess(protocol.backbone, augment=protocol.training.augment)
    amp = options.amp and device.type == "cuda"
    variant = "cuda-bf16" if amp else ""
    weights = weights_digest(protocol.backbone)
    keys = {split: feature_cache_key(protocol.backbone, sources, split, variant, weights) for split in ("test", "train")}
    plan = plan_data_path(protocol, stream, trunk, device, amp, root, keys)  # before any trunk pass
    _say(options, plan.describe())
    t0 = time.perf_counter()
    test_inputs = InputStore(stream.test, Preprocess(protocol.backbone), trunk, device, keys["test"], root,
                             desc="trunk (eval)", amp=amp, progress=options.progress, mode=plan.test.mode)
    t1 = time.perf_counter()
    train_inputs = InputStore(stream.train, train_pre, trunk, device, keys["train"], root,
                              desc="trunk (train)", amp=amp, progress=options.progress, mode=plan.train.mode)
    _say(options, f"inputs ready: eval {t1 - t0:.1f} s, train {time.perf_counter() - t1:.1f} s")
    model.trunk_cached = options.trunk_cache
    bench = Workbench(protocol, stream, device, train_inputs, test_inputs, model, plan, weights)
    if protocol.pretrain.mode == "train":
        _deploy(bench, options)
    use_channels_last(model, device, options)  # after pre-training: the deployed model is as before
    return bench


def _deploy(bench: Workbench, options: RunOptions) -> None:
    """Fit the deployed model on S1 once per protocol spec; later runs load it from the cache."""
    p = bench.protocol
    path = cache_dir() / "deployed" / f"{p.name}-{p.spec_hash}-{bench.weights.rpartition(':')[2][:16]}.pt"
    if path.is_file():
        bench.deployed.load_state_dict(torch.load(path, map_location=bench.device, weights_only=True))
        return
    _say(options, f"Training the deployed model on S1 ({p.pretrain.updates} updates, cached for later runs)")
    config = MethodConfig(lr=p.pretrain.lr, weight_decay=p.pretrain.weight_decay, layer_decay=1.0,
                          trainable=p.pretrain.trainable)
    generator = seed_everything(p.pretrain.seed)
    train_offline(bench, bench.deployed, config, bench.stream.pretrain_ids, p.pretrain.updates,
                  p.pretrain.batch_size, np.random.default_rng(p.pretrain.seed), generator, "pretrain S1", options)
    from .atomic import atomic_write
    atomic_write(path, lambda fh: torch.save(bench.deployed.state_dict(), fh))


def _context(bench: Workbench, memory: Memory, rng: np.random.Generator, generator: torch.Generator) -> Context:
    return Context(bench.protocol, bench.stream, bench.device, memory, bench.train_inputs, rng, generator)


def train_offline(bench: Workbench, model: SplitModel, config: MethodConfig, ids: np.ndarray, updates: int,
                  batch_size: int, rng: np.random.Generator, generator: torch.Generator, desc: str,
                  options: RunOptions) -> None:
    """Plain offline training on ``ids`` with uniform batches (pre-training and the joint model)."""
    learner = StandardMethod(config)
    memory = Memory(bench.protocol.memory.model_copy(update={"policy": "none", "capacity": None}),
                    bench.stream.train.labels, bench.stream.train.sample_bytes, rng)
    learner.setup(model, _context(bench, memory, rng, generator))
    learner.optimizer, learner.scheduler = learner.build_optimizer(updates)
    cycler = Cycler(ids, rng)
    with autocast(bench.device, options.amp):
        for _ in tqdm(range(updates), desc=desc, unit="upd", leave=False, disable=not options.progress):
            learner.observe(bench.batch(cycler.take(batch_size), batch_size))


def _curve_point(curve: dict, update: int, acc) -> None:
    curve["updates"].append(update)
    curve["old"].append(acc.old)
    curve["new"].append(acc.new)
    curve["all"].append(acc.all)
    for k, a in enumerate(acc.tasks):
        curve["tasks"][k].append(a)


def memory_spec(protocol: Protocol, method: Method):
    """The protocol's storage cap, under the method's own eviction policy when it has one (GDumb)."""
    spec = protocol.memory
    if method.memory_policy and spec.policy not in ("unlimited", "none") and method.memory_policy != spec.policy:
        spec = spec.model_copy(update={"policy": method.memory_policy})
    return spec


def _session_updates(protocol: Protocol, session: Session) -> int:
    u = protocol.training.updates
    return len(session.train_ids) if u == "per_sample" else u


def _input_shape(bench: Workbench) -> tuple[int, int, int]:
    b = bench.protocol.backbone
    return (b.in_chans, b.input_size, b.input_size)


def _macs_per_sample(meter: FL.FlopMeter) -> dict[str, float]:
    return {part: meter.cost(part).forward for part in FL.PARTS}


def run_cl(bench: Workbench, method: Method, seed: int, options: RunOptions) -> tuple[list[SessionCurve], Budget, int]:
    """Sessions 2..N: exactly U observe calls each, eval at 0 and on the schedule."""
    p, stream = bench.protocol, bench.stream
    generator = seed_everything(seed)
    rng = np.random.default_rng(seed)
    model = copy.deepcopy(bench.deployed)
    memory = Memory(memory_spec(p, method), stream.train.labels,
                    lambda gid: method.sample_bytes(gid) or stream.train.sample_bytes(gid), rng)
    if p.memory.include_pretrain:
        memory.add(stream.pretrain_ids)
    cached = bool(model.trunk_cached)
    meter = FL.FlopMeter(model, _input_shape(bench), cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    ctx = _context(bench, memory, rng, generator)
    online = p.training.updates == "per_sample"
    b_new, b_old = p.training.batch.new, p.training.batch.old
    if not method.rehearsal:
        b_new, b_old = b_new + b_old, 0
    limit = b_new + b_old
    total = sum(_session_updates(p, s) for s in stream.sessions)
    bar = tqdm(total=total, desc=f"{p.name} {method.name}", unit="upd", disable=not options.progress)
    curves, samples, steps_all, params, most_trained, observed = [], 0, 0, 0, 0, 0
    train_per_session: list[float] = []
    eval_per_session: list[float] = []
    accel = autocast(bench.device, options.amp)

    def train_macs() -> float:
        return FL.adjusted_train_macs(meter, ctx.counters)

    with count_optimizer_steps() as steps, meter.attached():
        method.setup(model, ctx)
        for session in stream.sessions:
            train0, eval0 = train_macs(), meter.eval_macs()
            check_no_stray_steps(method, steps[0], observed, "setup or end_session")
            model.head.grow(len(session.new_classes), generator)
            method.begin_session(session)
            params = max(params, sum(p_.numel() for p_ in model.parameters() if p_.requires_grad))
            U = _session_updates(p, session)
            points = set(p.eval.points(U))
            plan = eval_plan(stream, session)
            curve = {"updates": [], "old": [], "new": [], "all": [], "tasks": [[] for _ in range(plan.tasks)],
                     "train_flops": []}
            arrivals = Cycler(session.train_ids, rng, shuffle=not online)
            for u in range(U + 1):
                if u in points:
                    model.eval()
                    with meter.evaluating(), accel:
                        acc = evaluate(method.predict, bench.test_inputs, plan, p.eval.batch_size)
                    _curve_point(curve, u, acc)
                    curve["train_flops"].append(FL.flops(train_macs()))
                    bar.set_postfix(session=session.index, old=f"{acc.old:.3f}", new=f"{acc.new:.3f}")
                if u == U:
                    break
                new_ids = arrivals.take(b_new)
                old_ids = memory.sample(b_old, p.training.class_balanced) if b_old else new_ids[:0]
                ids = np.concatenate([new_ids, old_ids])
                check_no_stray_steps(method, steps[0], observed, "begin_session or predict")
                with accel:
                    _, trained = observe_within_budget(method, bench.batch(ids, len(new_ids)), steps, meter, limit)
                most_trained, observed = max(most_trained, trained), observed + 1
                check_memory(method, memory)
                samples += len(ids)
                if online:
                    add_to_memory(method, memory, new_ids)
                bar.update(1)
            method.end_session(session)
            check_memory(method, memory)
            check_no_stray_steps(method, steps[0], observed, "predict or end_session")
            if not online:
                add_to_memory(method, memory, session.train_ids)
            train_per_session.append(FL.flops(train_macs() - train0))
            eval_per_session.append(FL.flops(meter.eval_macs() - eval0))
            curves.append(SessionCurve(session=session.index, total_updates=U, **curve))
        steps_all = steps[0]
        macs = _macs_per_sample(meter)
    bar.close()
    train_total, eval_total = train_macs(), meter.eval_macs()
    budget = Budget(
        updates_per_session=[c.total_updates for c in curves], batch_new=b_new, batch_old=b_old,
        samples_trained=samples, optimizer_steps=steps_all, memory_policy=p.memory.policy,
        memory_capacity=p.memory.capacity, memory_peak_samples=memory.peak_samples,
        memory_peak_bytes=memory.peak_bytes,
        train_flops=FL.flops(train_total), eval_flops=FL.flops(eval_total),
        train_flops_per_session=train_per_session, eval_flops_per_session=eval_per_session,
        train_flops_executed=FL.flops(FL.executed_macs(
            meter, "train", train_total, bench.train_inputs.distinct_seen(),
            ctx.counters.get(FL.TRUNK_FEATURE_SAMPLES, 0.0))),
        eval_flops_executed=FL.flops(FL.executed_macs(meter, "eval", eval_total, bench.test_inputs.distinct_seen())),
        macs_per_sample=macs, forward_samples=FL.forward_samples_summary(meter),
        declared={k: float(v) for k, v in ctx.counters.items()}, batch_limit=limit,
        max_trained_per_update=most_trained, trunk_cached=cached, flops_convention=FL.CONVENTION,
    )
    return curves, budget, params


def run_joint(bench: Workbench, method: Method, seed: int, options: RunOptions) -> tuple[list[ReferenceSession], Budget, int]:
    """Per session j, the deployed model retrained on S1..Sj with the protocol's joint budget."""
    p, stream = bench.protocol, bench.stream
    refs, params, samples = [], 0, 0
    final_model = None
    cached = bool(bench.deployed.trunk_cached)
    bench.train_inputs.reset_seen()
    bench.test_inputs.reset_seen()
    train_total, eval_total, train_trunk_samples = 0.0, 0.0, 0
    train_per_model: list[float] = []
    eval_per_session: list[float] = []
    samples_by_part: dict[str, int] = {}
    macs: dict[str, float] = {}
    for session in stream.sessions:
        generator = seed_everything(seed + session.index)
        rng = np.random.default_rng(seed + session.index)
        if p.joint.mode == "per_session" or final_model is None:
            model = copy.deepcopy(bench.deployed)
            upto = session.index if p.joint.mode == "per_session" else stream.sessions[-1].index
            model.head.grow(stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
            meter = FL.FlopMeter(model, _input_shape(bench), cached)
            with meter.attached():
                train_offline(bench, model, method.config, stream.session_ids(upto), p.joint.updates,
                              p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options)
            samples += p.joint.updates * p.joint.batch_size
            params = max(params, model.trainable_parameters())
            final_model = model
            train_per_model.append(FL.flops(meter.train_macs()))
            train_total += meter.train_macs()
            train_trunk_samples += meter.tally.fwd_samples["train"]["trunk"]
            for key, value in FL.forward_samples_summary(meter).items():
                samples_by_part[key] = samples_by_part.get(key, 0) + value
        model = final_model
        model.eval()
        plan = eval_plan(stream, session)
        n = session.seen_classes
        meter = FL.FlopMeter(model, _input_shape(bench), cached)
        with meter.attached(), meter.evaluating(), autocast(bench.device, options.amp):
            acc = evaluate(lambda x: model(x)[:, :n], bench.test_inputs, plan, p.eval.batch_size)
        eval_per_session.append(FL.flops(meter.eval_macs()))
        eval_total += meter.eval_macs()
        for key, value in FL.forward_samples_summary(meter).items():
            samples_by_part[key] = samples_by_part.get(key, 0) + value
        macs = _macs_per_sample(meter)
        refs.append(ReferenceSession(session=session.index, old=acc.old, new=acc.new, all=acc.all, tasks=acc.tasks))
    n_trainings = len(stream.sessions) if p.joint.mode == "per_session" else 1
    trunk = macs.get("trunk", 0.0)
    train_executed, eval_executed = train_total, eval_total
    if cached:  # the trunk ran once per distinct image, not once per sample
        train_executed += (bench.train_inputs.distinct_seen() - train_trunk_samples) * trunk
        eval_executed += (bench.test_inputs.distinct_seen() - samples_by_part.get("eval/trunk/forward", 0)) * trunk
    budget = Budget(
        updates_per_session=[p.joint.updates] * n_trainings, batch_new=p.joint.batch_size, batch_old=0,
        samples_trained=samples, optimizer_steps=p.joint.updates * n_trainings, memory_policy="all data",
        memory_capacity=None, memory_peak_samples=len(stream.session_ids(stream.sessions[-1].index)),
        memory_peak_bytes=0,
        train_flops=FL.flops(train_total), eval_flops=FL.flops(eval_total),
        train_flops_per_session=train_per_model, eval_flops_per_session=eval_per_session,
        train_flops_executed=FL.flops(train_executed), eval_flops_executed=FL.flops(eval_executed),
        macs_per_sample=macs or None, forward_samples=samples_by_part, batch_limit=p.joint.batch_size,
        max_trained_per_update=p.joint.batch_size,
        trunk_cached=cached, flops_convention=FL.CONVENTION,
    )
    return refs, budget, params


def _stamp(spec: MethodSpec) -> MethodStamp:
    return MethodStamp(
        spec=spec.text, base=spec.base.name, modifiers=[m.name for m in spec.modifiers],
        distribution=spec.base.distribution, version=spec.base.version,
        modifier_distributions={m.name: f"{m.distribution}=={m.version}" for m in spec.modifiers},
    )


def joint_reference(protocol: Protocol, seed: int, options: RunOptions, bench: Workbench | None = None) -> tuple[Path, RunResult]:
    """The cached joint run for this protocol spec and seed, trained first when there is none."""
    found = find_joint(options.results_dir, protocol.name, protocol.spec_hash, seed)
    if found and (bench is None or found[1].options.get("weights") == getattr(bench, "weights", "")):
        return found  # a reference from other weights (a file replaced at the same path) is not reused
    models = protocol.sessions if protocol.joint.mode == "per_session" else 1
    _say(options, f"No joint reference for {protocol.name} (seed {seed}) yet: training it first "
                  f"({models} model(s) x {protocol.joint.updates} updates); later runs reuse it.")
    # The reference is the protocol's, not the run's: a CL run's --set overrides must not reach it.
    result, path = execute(protocol, "joint", seed, dataclasses.replace(options, overrides={}), bench=bench)
    return path, result


def execute(protocol: Protocol, method_text: str, seed: int, options: RunOptions,
            bench: Workbench | None = None) -> tuple[RunResult, Path]:
    """Run one method on one protocol and seed; write the JSON result (atomically) and return it."""
    started, t0 = now_iso(), time.perf_counter()
    spec, method = build_method(method_text, protocol.name, options.overrides)
    if getattr(method, "reference", False):  # the joint budget's optimizer settings live in the protocol
        spec_values = {"lr": protocol.joint.lr, "weight_decay": protocol.joint.weight_decay}
        method.config = method.config.model_copy(
            update={k: v for k, v in spec_values.items() if k not in options.overrides})
    bench = bench or prepare(protocol, seed, options)
    run_id = uuid.uuid4().hex[:12]
    common = dict(
        run_id=run_id, status="complete", seed=seed,
        protocol=ProtocolStamp(name=protocol.name, version=protocol.version, hash=protocol.spec_hash),
        method=_stamp(spec), config=method_settings(method),
        versions=library_versions(), git_commit=git_commit(), started_at=started,
        options={"device": str(bench.device), "trunk_cache": options.trunk_cache, "weights": getattr(bench, "weights", ""),
                 "data_path": bench.data_path.as_dict() if getattr(bench, "data_path", None) else None},
    )
    if getattr(method, "reference", False):
        refs, budget, params = run_joint(bench, method, seed, options)
        result = RunResult(**common, trainable_params=params, reference=refs, budget=budget,
                           wall_time_s=time.perf_counter() - t0)
    else:
        joint_path, joint = joint_reference(protocol, seed, options, bench)
        t0_cl = time.perf_counter()
        curves, budget, params = run_cl(bench, method, seed, options)
        budget = FL.efficiency_vs_joint(budget, joint.budget)
        best = M.best_new_accuracy([curves] + [
            r.curves for _, r in iter_results(options.results_dir, protocol.name)
            if isinstance(r, RunResult) and not r.is_reference and r.status == "complete"
            and r.protocol.hash == protocol.spec_hash
        ])
        try:
            metrics, problem = M.compute_metrics(curves, joint.reference, best), None
        except ValueError as exc:  # the curves are what cost compute: keep them, say why, fail after
            metrics, problem = None, str(exc)
        result = RunResult(
            **common, trainable_params=params, curves=curves, budget=budget,
            references=References(joint_run=joint.run_id, best_new=best), metrics=metrics,
            wall_time_s=time.perf_counter() - t0_cl,
        )
        if problem is not None:
            path = save_result(options.results_dir, result)
            raise BenchError(f"The run finished and its curves are saved in {path}, but its metrics cannot be "
                             f"computed: {problem}. The leaderboard recomputes them from the stored curves.")
    path = save_result(options.results_dir, result)
    return result, path
