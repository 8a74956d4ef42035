"""FLOP accounting: fvcore's per-sample MACs of trunk | body | head, samples counted at run time.

What is counted, and how
------------------------------------
* **Per-sample cost.** fvcore traces each part of the split model once on one sample at the
  protocol's input size and counts multiply-accumulates (MACs; fvcore calls one fused multiply-add
  one "flop"). We report **FLOPs = 2 x MACs**. fvcore counts conv, linear / addmm / matmul / bmm /
  einsum, batch_norm (2 per element with affine, in eval mode), group / layer / instance norm,
  adaptive_avg_pool2d and upsampling. It **skips** (costs 0) element-wise activations (relu, relu6
  / hardtanh, sigmoid, silu, gelu), element-wise add / sub / mul / div (residual adds, LoRA's
  scaling), padding, max / avg pooling, mean, softmax and the loss. PyTorch's own
  ``torch.utils.flop_counter.FlopCounterMode`` counts only the matmul / conv family and skips the
  norms too; ``tests/test_flops.py`` checks the two agree within 10 % (exactly on conv + linear).
  **The count is the stock network's.** Each part is traced under ``fastconv.stock_kernels()``, so the
  convolutions counted are PyTorch's, whatever kernel set a run computes with (the CPU's cropped,
  matrix-product and tap-table rewrites compute the same sums in another way): a FLOP budget is a
  property of the network, the same on every device and kernel set.
* **Samples, at run time.** Forward hooks on ``model.trunk``, ``model.body`` and ``model.head``
  count every sample through each part, whoever made the call: the standard step, a modifier's
  init pass, a teacher that is a ``copy.deepcopy`` of the model (the hooks are closures, copied by
  reference), a REMIND replay through the body. A part's backward is counted when gradient actually
  reaches its output (a tensor hook on the output), once per backward pass. Evaluation forwards
  (``evaluate`` with the meter) are hooked once per row shape and the rest replay that count
  (``FlopMeter.once_per_shape``): the same tally, without looking the parts' costs up per chunk.
* **Backward convention.** Per module of a part (fvcore's per-module count): backward = 2 x its
  forward MACs if it has trainable parameters (gradient w.r.t. input and weights), 1 x if it has none
  but its input requires grad (gradient only passes *through* it to something trainable upstream,
  e.g. a LoRA-adapted body's frozen convs and norms after the first adapter), 0 otherwise.
  Vanilla (body + head train) thus costs 1 x forward on the trunk and 3 x forward on body and head;
  output_only costs 1 x on trunk and body and 3 x on the head.
* **Training vs evaluation.** Forwards inside the harness's continual evaluation are evaluation
  FLOPs; everything else in the run (observe, begin/end_session, init passes, teacher forwards) is
  training.
* **Cached trunk.** With the trunk cache on, no trunk forward runs during the run. The headline
  figures (``Budget.train_flops`` / ``eval_flops``, ``SessionCurve.train_flops``) are the
  **uncached equivalent**, what the same run counts with ``--no-trunk-cache``: in a cached run
  every sample entering the body (of the model or of a copy of it, a teacher) is charged one trunk
  forward, because in an uncached run its input came out of the trunk; cached trunk features a
  method uses without a body forward are charged when it declares them (``trunk_feature_samples``).
  So the figures are the same whatever the cache setting and runs compare fairly (a test checks it
  for vanilla). ``SessionCurve.train_flops`` is cumulative over the run, taken when each point is
  evaluated (so a session's update-0 value already includes its begin_session work, init passes).
  ``*_executed`` is what actually ran: with the cache on, one trunk forward per *distinct* image the
  run fetched (what a lazy cache computes), then body and head as counted; with it off, the same as
  the headline figure.

Counter names (``Context.counters``; a method adds to them, the harness reads them at run end)
-------------------------------------------------------------------------------------------------
Forwards through the run's model parts, or copies of them, are *measured* by the hooks. Two
counters are *charged*, because the hooks cannot see what they count:

``trunk_feature_samples``  cached trunk features a method used without a body forward (REMIND
                           fitting its codebook and encoding stored samples): in a cached run each
                           is charged one trunk forward (an uncached run makes it, and the hook
                           counts it there), so leave it at 0 when the inputs are images.
``extra_macs``  MACs of compute the hooks cannot see (a network that is not a copy of the run's
                model parts, product-quantisation decoding, ...); charged to training as 2 x.
Both only grow: each read checks it (``ChargedCounters``), and a charge taken back ends the run.

Every other counter is a *declaration*, recorded verbatim in the result (``Budget.declared``) so a
reader can match it against the measured ``Budget.forward_samples``; the names in use:

``init_forward_samples``  SGM's data-driven init: samples pushed through trunk -> body, no grad.
``teacher_forward_samples``  LwF: samples the frozen teacher (a copy of the model) forwarded.
``derpp_logit_forward_samples``  DER++: eval-mode forwards recording logits of samples entering
                                 the memory untrained.
``remind_reconstruct_samples``  REMIND: samples rebuilt from PQ codes and fed to the body.
``remind_trunk_forward_samples``  REMIND: trunk passes it made itself (inputs are images).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from .fastconv import stock_kernels

if TYPE_CHECKING:
    from .backbone import SplitModel

PARTS = ("trunk", "body", "head")
PHASES = ("train", "eval")

TRUNK_FEATURE_SAMPLES = "trunk_feature_samples"
EXTRA_MACS = "extra_macs"
INIT_FORWARD_SAMPLES = "init_forward_samples"
TEACHER_FORWARD_SAMPLES = "teacher_forward_samples"
COUNTERS = {  # name -> meaning (the charged two first; the rest are declarations)
    TRUNK_FEATURE_SAMPLES: "cached trunk features used without a body forward; charged one trunk forward each "
                           "in a cached run",
    EXTRA_MACS: "MACs the hooks cannot see (another network, PQ decoding); charged 2x to training",
    INIT_FORWARD_SAMPLES: "declared: samples SGM's init pushed through trunk -> body (no grad)",
    TEACHER_FORWARD_SAMPLES: "declared: samples a frozen teacher copy of the model forwarded (LwF)",
    "derpp_logit_forward_samples": "declared: DER++ eval-mode logit forwards of samples entering the memory",
    "remind_reconstruct_samples": "declared: REMIND samples rebuilt from PQ codes and fed to the body",
    "remind_trunk_forward_samples": "declared: REMIND trunk passes on images (uncached inputs)",
}

CHARGED = (TRUNK_FEATURE_SAMPLES, EXTRA_MACS)


@dataclass
class ChargedCounters:
    """The charged counters as last read: a method only adds to them. One that is not a finite number, or
    that went down since the last read, is refused: a charge taken back (a negative ``extra_macs``) buys
    updates a FLOP budget never sees, and lowers the training FLOPs every table reports."""

    seen: dict[str, float] = field(default_factory=dict)

    def problem(self, counters: dict[str, float]) -> str | None:
        """What is wrong with ``counters``' charged values now (None: each is a number no lower than before)."""
        for name in CHARGED:
            value = counters.get(name, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                return f"ctx.counters[{name!r}] is {value!r}, where a finite number is due"
            if value < self.seen.get(name, 0.0):
                return (f"ctx.counters[{name!r}] went down, from {self.seen.get(name, 0.0):.6g} to {value:.6g}: a "
                        f"charged counter only grows (add what the hooks cannot see; never subtract)")
        self.seen.update({name: float(counters.get(name, 0.0)) for name in CHARGED})
        return None


CONVENTION = ("fvcore MACs x 2; backward 2x forward for modules with trainable parameters, 1x where gradient "
              "only passes through; trunk counted uncached-equivalent (executed: once per distinct image)")


# ------------------------------------------------------------------------------------ per-sample MACs


def fvcore_analysis(module: nn.Module, example: Tensor):
    """fvcore's FlopCountAnalysis of ``module`` on ``example`` (warnings off; nothing is updated)."""
    with warnings.catch_warnings():  # fvcore's imports use torch.jit APIs torch now marks deprecated
        warnings.simplefilter("ignore", FutureWarning)
        from fvcore.nn import FlopCountAnalysis

    logging.getLogger("fvcore").setLevel(logging.ERROR)
    was = {m: m.training for m in module.modules()}
    module.eval()
    try:
        analysis = FlopCountAnalysis(module, example)  # traced below, in float32 (no autocast)
        analysis.unsupported_ops_warnings(False)
        analysis.uncalled_modules_warnings(False)
        analysis.tracer_warnings("none")
        with torch.autocast(example.device.type, enabled=False), stock_kernels():
            analysis.total()  # runs the trace now, while the module is in eval mode
    finally:
        for m, mode in was.items():
            m.training = mode
    return analysis


def module_macs(module: nn.Module, example: Tensor) -> dict[str, float]:
    """MACs per sample done *directly* by each submodule (its count minus its children's), by name."""
    by_module = fvcore_analysis(module, example).by_module()
    n = example.shape[0]
    out: dict[str, float] = {}
    for name, sub in module.named_modules():
        own = by_module.get(name, 0) - sum(by_module.get(f"{name}.{c}" if name else c, 0)
                                           for c, _ in sub.named_children())
        if own:
            out[name] = own / n
    return out


@dataclass(frozen=True)
class PartCost:
    """Per-sample MACs of one part: forward, and backward under its current trainability."""

    forward: float
    backward: float
    out_shape: tuple[int, ...]  # per-sample output shape (the next part's input)


def _has_trainable(module: nn.Module) -> bool:
    return any(p.requires_grad for p in module.parameters(recurse=False))


def part_cost(module: nn.Module, in_shape: tuple[int, ...], input_requires_grad: bool = False) -> PartCost:
    """fvcore forward MACs per sample and the backward MACs per sample of the convention above."""
    example = torch.zeros(1, *in_shape, device=_device_of(module))
    macs = module_macs(module, example)
    factor: dict[str, int] = {}
    handles = []
    named = dict(module.named_modules())
    for name in macs:
        def hook(m, args, _out, name=name):
            if name not in factor:
                flows = any(isinstance(a, Tensor) and a.requires_grad for a in args)
                factor[name] = 2 if _has_trainable(m) else int(flows)
        handles.append(named[name].register_forward_hook(hook))
    was = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with torch.enable_grad(), torch.autocast(example.device.type, enabled=False):
            out = module(example.clone().requires_grad_(input_requires_grad))
    finally:
        for h in handles:
            h.remove()
        for m, mode in was.items():
            m.training = mode
    forward = float(sum(macs.values()))
    backward = float(sum(v * factor.get(k, 0) for k, v in macs.items()))
    return PartCost(forward, backward, tuple(out.shape[1:]))


def _device_of(module: nn.Module) -> torch.device:
    for t in module.parameters():
        return t.device
    for b in module.buffers():
        return b.device
    return torch.device("cpu")


def split_macs(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, float]:
    """Forward MACs per sample of trunk, body and head of a SplitModel, each traced on its own input."""
    shape, out = tuple(input_shape), {}
    for part in PARTS:
        cost = part_cost(getattr(model, part), shape)
        out[part], shape = cost.forward, cost.out_shape
    return out


def _signature(module: nn.Module, in_shape: tuple[int, ...], rg: bool) -> tuple:
    """What a part's cost depends on: structure, parameter shapes and trainability, input shape."""
    return (in_shape, rg, tuple(
        (name, type(m).__qualname__, m.extra_repr(),
         tuple((k, tuple(p.shape), p.requires_grad) for k, p in m.named_parameters(recurse=False)))
        for name, m in module.named_modules()
    ))


_COSTS: dict[tuple, PartCost] = {}  # process-wide: joint models and repeated runs reuse one trace


def cached_part_cost(module: nn.Module, in_shape: tuple[int, ...], rg: bool) -> PartCost:
    key = (type(module).__qualname__, _signature(module, in_shape, rg))
    cost = _COSTS.get(key)
    if cost is None:
        if len(_COSTS) > 256:
            _COSTS.clear()
        cost = _COSTS[key] = part_cost(module, in_shape, rg)
    return cost


# --------------------------------------------------------------------------------------- the meter

_GENERATION = [0]  # bumped whenever any module registers a submodule or parameter (structure changed)
_WATCHING: list[Any] = []


def _bump(*_args) -> None:
    _GENERATION[0] += 1


def _watch_structure() -> None:
    """Install the (process-wide, idempotent) registration hooks that bump ``_GENERATION``."""
    if not _WATCHING:
        from torch.nn.modules import module as torch_module

        _WATCHING.append(torch_module.register_module_module_registration_hook(_bump))
        _WATCHING.append(torch_module.register_module_parameter_registration_hook(_bump))


@dataclass
class _Known:
    generation: int
    module: nn.Module
    params: list
    flags: tuple
    in_shape: tuple
    rg: bool
    cost: PartCost



@dataclass
class Tally:
    """Samples and MACs through each part, by phase; trunk figures are the uncached equivalent."""

    fwd_samples: dict[str, dict[str, int]]
    bwd_samples: dict[str, dict[str, int]]
    macs: dict[str, float]  # by phase

    @classmethod
    def zero(cls) -> Tally:
        return cls({ph: dict.fromkeys(PARTS, 0) for ph in PHASES}, {ph: dict.fromkeys(PARTS, 0) for ph in PHASES},
                   dict.fromkeys(PHASES, 0.0))


_UNCOUNTED = [False]


@contextmanager
def uncounted() -> Iterator[None]:
    """Backward passes made inside are not the method's training (``bench check-method`` back-propagates
    each loss term alone beside the real step): no meter counts them."""
    before, _UNCOUNTED[0] = _UNCOUNTED[0], True
    try:
        yield
    finally:
        _UNCOUNTED[0] = before


class FlopMeter:
    """Counts samples through trunk | body | head of one SplitModel (and its deep copies) at run time.

    Attach with ``with meter.attached(): ...``; mark evaluation with ``with meter.evaluating(): ...``;
    bracket each update with ``start_update()`` / ``end_update()`` (which returns the samples trained).
    """

    def __init__(self, model: SplitModel, input_shape: tuple[int, ...], trunk_cached: bool | None = None) -> None:
        self.model = model
        # the run's cache setting, fixed for the run (a method may flip model.trunk_cached for a moment
        # to feed features it made itself, as REMIND does; that is no cached trunk forward)
        self.trunk_cached = bool(model.trunk_cached if trunk_cached is None else trunk_cached)
        self.input_shape = tuple(input_shape)
        self.phase = "train"
        self.tally = Tally.zero()
        self._update_bwd: dict[str, int] | None = None
        self._paused = False
        self._fast: dict[tuple[str, int], _Known] = {}
        self._handles: list[Any] = []
        self._recording: list | None = None  # what the hooks add, while ``once_per_shape`` records
        _watch_structure()
        self.trunk_cost = self._cost("trunk", model.trunk, self.input_shape, False)

    # -- part costs, refreshed when a part's structure or trainability changes (LoRA injected or
    #    folded, head grown, a part frozen): a structural change anywhere bumps ``_GENERATION``
    #    (module and parameter registration hooks); trainability is re-read on every call (cheap).
    def _entry(self, part: str, module: nn.Module, in_shape: tuple[int, ...], rg: bool) -> _Known:
        slot = (part, id(module))
        known = self._fast.get(slot)
        if (known is not None and known.generation == _GENERATION[0] and known.module is module
                and known.in_shape == in_shape and known.rg == rg
                and known.flags == tuple(p.requires_grad for p in known.params)):
            return known
        params = list(module.parameters())
        paused, self._paused = self._paused, True
        try:
            cost = cached_part_cost(module, in_shape, rg)
        finally:
            self._paused = paused
        if len(self._fast) > 64:
            self._fast.clear()
        known = _Known(_GENERATION[0], module, params, tuple(p.requires_grad for p in params), in_shape, rg, cost)
        self._fast[slot] = known
        return known

    def _cost(self, part: str, module: nn.Module, in_shape: tuple[int, ...], rg: bool) -> PartCost:
        return self._entry(part, module, in_shape, rg).cost

    def cost(self, part: str, module: nn.Module | None = None) -> PartCost:
        """The current per-sample cost of ``part`` (of the attached model, or of ``module``, a copy)."""
        model = self.model
        trunk = self._entry("trunk", model.trunk, self.input_shape, False)
        if part == "trunk":
            return trunk.cost if module is None else self._cost("trunk", module, self.input_shape, False)
        trunk_rg = any(trunk.flags)
        body = self._entry("body", model.body, trunk.cost.out_shape, trunk_rg)
        if part == "body":
            return body.cost if module is None else self._cost("body", module, trunk.cost.out_shape, trunk_rg)
        return self._cost("head", module or model.head, body.cost.out_shape, trunk_rg or any(body.flags))

    # -- hooks
    def _forward_hook(self, part: str):
        meter = self

        def hook(module: nn.Module, _args, output) -> None:
            if meter._paused or not isinstance(output, Tensor):
                return
            n = int(output.shape[0])
            cost = meter.cost(part, module)
            charge_trunk = part == "body" and meter.trunk_cached and getattr(meter.model, "charge_trunk", True)
            meter._count_forward(meter.phase, part, n, cost.forward, charge_trunk)
            if meter._recording is not None:
                meter._recording.append((meter.phase, part, n, cost.forward, charge_trunk))
            if output.requires_grad and torch.is_grad_enabled():
                if meter._recording is not None:
                    meter._recording.append(None)  # a backward to come: this forward cannot be replayed
                output.register_hook(meter._backward_hook(part, phase=meter.phase, per_sample=cost.backward))

        return hook

    def _count_forward(self, phase: str, part: str, n: int, per_sample: float, charge_trunk: bool) -> None:
        t = self.tally
        t.fwd_samples[phase][part] += n
        t.macs[phase] += n * per_sample
        if charge_trunk:
            t.fwd_samples[phase]["trunk"] += n  # the trunk forward an uncached run would make
            t.macs[phase] += n * self.trunk_cost.forward

    def _backward_hook(self, part: str, phase: str, per_sample: float):
        meter = self

        def hook(grad: Tensor) -> None:
            if _UNCOUNTED[0]:
                return
            n = int(grad.shape[0])
            meter.tally.bwd_samples[phase][part] += n
            meter.tally.macs[phase] += n * per_sample
            if meter._update_bwd is not None:
                meter._update_bwd[part] += n

        return hook

    @contextmanager
    def attached(self) -> Iterator[FlopMeter]:
        for part in PARTS:
            self._handles.append(getattr(self.model, part).register_forward_hook(self._forward_hook(part)))
        self._paused = False
        try:
            yield self
        finally:
            self.detach()

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
        self._paused = True  # copies of the model made during the run keep the hook closures: mute them

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Forwards made inside are not counted (a probe the harness makes for itself)."""
        before, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = before

    def once_per_shape(self, forward: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
        """``forward`` counted by hooks once per row shape, then by replaying that count.

        Evaluation forwards many chunks of the same row shape through parts that do not change in
        between, gradient-free and row by row; looking the parts' costs up on every chunk is work the
        hooks need not repeat. The first call of each row shape runs hooked and records what each hook
        added (part, rows, per-sample MACs); a later call of ``m`` rows runs with the hooks muted and adds
        the same terms scaled to ``m`` rows, in the same order, so the tally is the hooked one exactly.
        A shape whose hooked call registered a backward, or touched a part with a row count that does not
        scale with the input's, is counted by hooks on every call. Make a new one per evaluation: the
        record assumes the parts keep their structure."""
        records: dict[tuple, tuple[int, list] | None] = {}

        def counted(x: Tensor) -> Tensor:
            key = tuple(x.shape[1:])
            known = records.get(key, ())
            if known is None or self._paused or not self._handles:
                return forward(x)
            rows = int(x.shape[0])
            if not known:  # () : the first call of this shape
                self._recording = []
                try:
                    out = forward(x)
                finally:
                    events, self._recording = self._recording, None
                replayable = rows > 0 and all(e is not None and e[2] % rows == 0 for e in events)
                records[key] = (rows, events) if replayable else None
                return out
            with self.paused():
                out = forward(x)
            first, events = known
            for phase, part, n, per_sample, charge_trunk in events:
                self._count_forward(phase, part, n // first * rows, per_sample, charge_trunk)
            return out

        return counted

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        before, self.phase = self.phase, "eval"
        try:
            yield
        finally:
            self.phase = before

    def start_update(self) -> None:
        self._update_bwd = dict.fromkeys(PARTS, 0)

    def end_update(self) -> tuple[int, str]:
        """Samples trained in this update (most samples any part's backward saw) and that part."""
        counts, self._update_bwd = self._update_bwd or dict.fromkeys(PARTS, 0), None
        part = max(PARTS, key=lambda p: counts[p])
        return counts[part], part

    # -- totals
    def train_macs(self) -> float:
        return self.tally.macs["train"]

    def eval_macs(self) -> float:
        return self.tally.macs["eval"]


def adjusted_train_macs(meter: FlopMeter, counters: dict[str, float]) -> float:
    """Training MACs with what the method declared the hooks cannot see: ``extra_macs``, and (cached
    runs) one trunk forward per ``trunk_feature_samples``."""
    macs = meter.train_macs() + float(counters.get(EXTRA_MACS, 0.0))
    if meter.trunk_cached:
        macs += float(counters.get(TRUNK_FEATURE_SAMPLES, 0.0)) * meter.trunk_cost.forward
    return macs


def update_macs_per_sample(meter: FlopMeter) -> float:
    """MACs one sample costs in a standard update of the attached model as it is now: each part's forward
    and its backward under the current trainability (the trunk's forward is charged cached or not)."""
    return sum(meter.cost(part).forward + meter.cost(part).backward for part in PARTS)


def executed_macs(meter: FlopMeter, phase: str, total_macs: float, distinct: int,
                  charged_trunk_samples: float = 0.0) -> float:
    """What actually ran: with the trunk cached, one trunk forward per distinct image fetched instead
    of the uncached equivalent's (``charged_trunk_samples``: those charged through counters)."""
    if not meter.trunk_cached:
        return total_macs
    trunk = meter.trunk_cost.forward
    return total_macs - (meter.tally.fwd_samples[phase]["trunk"] + charged_trunk_samples - distinct) * trunk


def forward_samples_summary(meter: FlopMeter) -> dict[str, int]:
    """Flat ``phase/part/direction -> samples`` (trunk samples are the uncached equivalent)."""
    out: dict[str, int] = {}
    for phase in PHASES:
        for part in PARTS:
            out[f"{phase}/{part}/forward"] = int(meter.tally.fwd_samples[phase][part])
            out[f"{phase}/{part}/backward"] = int(meter.tally.bwd_samples[phase][part])
    return out


def flops(macs: float) -> float:
    return 2.0 * float(macs)

