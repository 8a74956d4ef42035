"""The run loop: deployed model, then sessions 2..N with exactly U updates each, evaluated on schedule.

The harness owns the stream, the batch composition, the memory and the budget; the method only sees
batches. Results are written atomically (JSON first, then MLflow) once the run is complete.
"""

from __future__ import annotations

import copy
import random
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from tqdm.auto import tqdm

from harness import metrics as M
from harness.backbone import SplitModel, create_network, split_network
from harness.curves import ReferenceSession, SessionCurve
from harness.errors import BenchError
from harness.evaluation import EvalPlan, evaluate, eval_plan
from harness.inputs import InputStore, Preprocess, feature_cache_key
from harness.memory import Memory
from harness.paths import cache_dir
from harness.protocol import Protocol
from harness.registry import MethodSpec, build_method, method_config
from harness.results import (Budget, MethodStamp, ProtocolStamp, References, RunResult, find_joint, git_commit,
                             iter_results, library_versions, now_iso, save_result)
from harness.stream import Session, Stream, build_stream
from methods.base import Context, Method, MethodConfig, StandardMethod, TrainBatch


@dataclass
class RunOptions:
    results_dir: Path
    device: str = "cpu"
    trunk_cache: bool = True
    progress: bool = True
    allow_download: bool = False
    overrides: dict = field(default_factory=dict)
    log: bool = True  # print what the harness is doing (joint reference, caches)


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
    if model.head.num_classes != stream.pretrain_classes:
        raise BenchError(
            f"Protocol {protocol.name}: the pretrained head has {model.head.num_classes} outputs but the "
            f"pre-training data ({protocol.pretrain_data.source}) has {stream.pretrain_classes} classes."
        )
    sources = [protocol.pretrain_data, *protocol.stream_data]
    root = cache_dir() / "trunk"
    trunk = model.trunk if options.trunk_cache else None
    train_pre = Preprocess(protocol.backbone, augment=protocol.training.augment)
    test_inputs = InputStore(stream.test, Preprocess(protocol.backbone), trunk, device,
                             feature_cache_key(protocol.backbone, sources, "test"), root, desc="trunk (eval)")
    cache_train = trunk is not None and not protocol.training.augment
    train_inputs = InputStore(stream.train, train_pre, trunk if cache_train else None, device,
                              feature_cache_key(protocol.backbone, sources, "train"), root, desc="trunk (train)")
    model.trunk_cached = options.trunk_cache
    bench = Workbench(protocol, stream, device, train_inputs, test_inputs, model)
    if protocol.pretrain.mode == "train":
        _deploy(bench, options)
    return bench


def _deploy(bench: Workbench, options: RunOptions) -> None:
    """Fit the deployed model on S1 once per protocol spec; later runs load it from the cache."""
    p = bench.protocol
    path = cache_dir() / "deployed" / f"{p.name}-{p.spec_hash}.pt"
    if path.is_file():
        bench.deployed.load_state_dict(torch.load(path, map_location=bench.device, weights_only=True))
        return
    _say(options, f"Training the deployed model on S1 ({p.pretrain.updates} updates, cached for later runs)")
    config = MethodConfig(lr=p.pretrain.lr, weight_decay=p.pretrain.weight_decay, layer_decay=1.0,
                          trainable=p.pretrain.trainable)
    generator = seed_everything(p.pretrain.seed)
    train_offline(bench, bench.deployed, config, bench.stream.pretrain_ids, p.pretrain.updates,
                  p.pretrain.batch_size, np.random.default_rng(p.pretrain.seed), generator, "pretrain S1", options)
    from harness.atomic import atomic_write
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
    method.setup(model, _context(bench, memory, rng, generator))
    online = p.training.updates == "per_sample"
    b_new, b_old = p.training.batch.new, p.training.batch.old
    if not method.rehearsal:
        b_new, b_old = b_new + b_old, 0
    total = sum(_session_updates(p, s) for s in stream.sessions)
    bar = tqdm(total=total, desc=f"{p.name} {method.name}", unit="upd", disable=not options.progress)
    curves, samples, steps_all, params = [], 0, 0, 0
    with count_optimizer_steps() as steps:
        for session in stream.sessions:
            model.head.grow(len(session.new_classes), generator)
            method.begin_session(session)
            params = max(params, sum(p_.numel() for p_ in model.parameters() if p_.requires_grad))
            U = _session_updates(p, session)
            points = set(p.eval.points(U))
            plan = eval_plan(stream, session)
            curve = {"updates": [], "old": [], "new": [], "all": [], "tasks": [[] for _ in range(plan.tasks)]}
            arrivals = Cycler(session.train_ids, rng, shuffle=not online)
            for u in range(U + 1):
                if u in points:
                    model.eval()
                    acc = evaluate(method.predict, bench.test_inputs, plan, p.eval.batch_size)
                    _curve_point(curve, u, acc)
                    bar.set_postfix(session=session.index, old=f"{acc.old:.3f}", new=f"{acc.new:.3f}")
                if u == U:
                    break
                new_ids = arrivals.take(b_new)
                old_ids = memory.sample(b_old, p.training.class_balanced) if b_old else new_ids[:0]
                ids = np.concatenate([new_ids, old_ids])
                before = steps[0]
                method.observe(bench.batch(ids, len(new_ids)))
                if steps[0] - before != 1:
                    raise BenchError(
                        f"Method {method.name!r} made {steps[0] - before} optimizer steps in one observe() call; "
                        f"the protocol's budget is exactly one update per call."
                    )
                samples += len(ids)
                if online:
                    memory.add(new_ids)
                bar.update(1)
            method.end_session(session)
            if not online:
                memory.add(session.train_ids)
            curves.append(SessionCurve(session=session.index, total_updates=U, **curve))
        steps_all = steps[0]
    bar.close()
    budget = Budget(
        updates_per_session=[c.total_updates for c in curves], batch_new=b_new, batch_old=b_old,
        samples_trained=samples, optimizer_steps=steps_all, memory_policy=p.memory.policy,
        memory_capacity=p.memory.capacity, memory_peak_samples=memory.peak_samples,
        memory_peak_bytes=memory.peak_bytes,
    )
    return curves, budget, params


def run_joint(bench: Workbench, method: Method, seed: int, options: RunOptions) -> tuple[list[ReferenceSession], Budget, int]:
    """Per session j, the deployed model retrained on S1..Sj with the protocol's joint budget."""
    p, stream = bench.protocol, bench.stream
    refs, params, samples = [], 0, 0
    final_model = None
    for session in stream.sessions:
        generator = seed_everything(seed + session.index)
        rng = np.random.default_rng(seed + session.index)
        if p.joint.mode == "per_session" or final_model is None:
            model = copy.deepcopy(bench.deployed)
            upto = session.index if p.joint.mode == "per_session" else stream.sessions[-1].index
            model.head.grow(stream.sessions[upto - 2].seen_classes - model.head.num_classes, generator)
            train_offline(bench, model, method.config, stream.session_ids(upto), p.joint.updates,
                          p.joint.batch_size, rng, generator, f"joint S1..S{upto}", options)
            samples += p.joint.updates * p.joint.batch_size
            params = max(params, model.trainable_parameters())
            final_model = model
        model = final_model
        model.eval()
        plan = eval_plan(stream, session)
        n = session.seen_classes
        acc = evaluate(lambda x: model(x)[:, :n], bench.test_inputs, plan, p.eval.batch_size)
        refs.append(ReferenceSession(session=session.index, old=acc.old, new=acc.new, all=acc.all, tasks=acc.tasks))
    n_trainings = len(stream.sessions) if p.joint.mode == "per_session" else 1
    budget = Budget(
        updates_per_session=[p.joint.updates] * n_trainings, batch_new=p.joint.batch_size, batch_old=0,
        samples_trained=samples, optimizer_steps=p.joint.updates * n_trainings, memory_policy="all data",
        memory_capacity=None, memory_peak_samples=len(stream.session_ids(stream.sessions[-1].index)),
        memory_peak_bytes=0,
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
    if found:
        return found
    _say(options, f"No joint reference for {protocol.name} (seed {seed}) yet: training it first, "
                  f"{protocol.joint.updates} updates x {len(protocol.joint.mode == 'per_session' and range(protocol.sessions) or [0])} models.")
    result, path = execute(protocol, "joint", seed, options, bench=bench)
    return path, result


def execute(protocol: Protocol, method_text: str, seed: int, options: RunOptions,
            bench: Workbench | None = None) -> tuple[RunResult, Path]:
    """Run one method on one protocol and seed; write the JSON result (atomically) and return it."""
    started, t0 = now_iso(), time.perf_counter()
    spec, method = build_method(method_text, protocol.name, options.overrides)
    bench = bench or prepare(protocol, seed, options)
    run_id = uuid.uuid4().hex[:12]
    common = dict(
        run_id=run_id, status="complete", seed=seed,
        protocol=ProtocolStamp(name=protocol.name, version=protocol.version, hash=protocol.spec_hash),
        method=_stamp(spec), config=method.config.model_dump(mode="json"),
        versions=library_versions(), git_commit=git_commit(), started_at=started,
        options={"device": str(bench.device), "trunk_cache": options.trunk_cache},
    )
    if getattr(method, "reference", False):
        refs, budget, params = run_joint(bench, method, seed, options)
        result = RunResult(**common, trainable_params=params, reference=refs, budget=budget,
                           wall_time_s=time.perf_counter() - t0)
    else:
        joint_path, joint = joint_reference(protocol, seed, options, bench)
        t0_cl = time.perf_counter()
        curves, budget, params = run_cl(bench, method, seed, options)
        best = M.best_new_accuracy([curves] + [
            r.curves for _, r in iter_results(options.results_dir, protocol.name)
            if isinstance(r, RunResult) and not r.is_reference and r.status == "complete"
            and r.protocol.hash == protocol.spec_hash
        ])
        result = RunResult(
            **common, trainable_params=params, curves=curves, budget=budget,
            references=References(joint_run=joint.run_id, best_new=best),
            metrics=M.compute_metrics(curves, joint.reference, best),
            wall_time_s=time.perf_counter() - t0_cl,
        )
    path = save_result(options.results_dir, result)
    return result, path
