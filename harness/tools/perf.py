"""``bench perf``: how fast the harness runs a protocol's update and evaluation, against plain PyTorch.

A benchmark, not a test (timings depend on the machine and on what else runs on it). On synthetic
tensors at the protocol's backbone, batch and input size, it times

1. a plain PyTorch loop doing the same forward / backward / AdamW step (same parameter groups),
2. the harness's update: ``StandardMethod.observe`` (the registry's ``vanilla``) on a ``TrainBatch``
   drawn through the real runner pieces (``InputStore``, ``Workbench.batch``, the optimizer-step
   count, the FLOP meter's hooks and the per-update budget check),
3. one continual evaluation (``harness.run.evaluation.evaluate``) with the trunk cache and without it
   (preprocessed images kept for the run, as ``--no-trunk-cache`` does; and, for reference, decoding
   at every eval point, as the harness did before),

and prints images/s and the ratios. Beside them, the same run times a GEMM in the run's precision
(square matrices, the thread count the stages use; fp32 on the CPU, bf16 on CUDA with autocast, the
precision the stages compute in: the roofline a dense layer can reach on this machine) between the repeats,
and prints each stage's achieved GMAC/s (fvcore MACs of what the stage computes per image: forward, and
backward under the convention of ``harness.model.flops``; the optimizer's elementwise step is not
counted) and its share of that roofline. No dataset is needed: images are random uint8 arrays. Backbone
weights: the protocol's packaged or local weights when they load, else (timm hub weights, which are
never fetched here) random init of the same architecture, which costs the same compute.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import click

from .roofline import GEMM_SIZE, gemm_gmacs, roofline_precision
from .roofline import device_seconds as _timed

if TYPE_CHECKING:  # torch and numpy load when the command runs, not when the CLI starts
    import torch



def _synthetic_catalog(n: int, size: int, classes: int, seed: int):
    import numpy as np

    from ..data.sources import ArraySplit
    from ..data.stream import Catalog

    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
    labels = rng.integers(0, classes, size=n)
    split = ArraySplit(images, labels, [f"c{k}" for k in range(classes)], "synthetic")
    return Catalog((split,), labels.astype(np.int64))


def _plain_groups(model, cfg) -> list[dict]:
    """What a hand-written loop would pass AdamW: the method's own groups (lr decayed per tensor by
    default, as the paper's code), so both loops do the same optimizer work."""
    from ...methods.base import layerwise_groups

    train_body = cfg.trainable == "body+head"
    if not train_body:
        for p in model.body.parameters():
            p.requires_grad_(False)
    return layerwise_groups(model, cfg.lr, cfg.weight_decay, cfg.layer_decay, train_body, unit=cfg.layer_decay_unit)


def _median(xs: list[float]) -> float:
    return statistics.median(xs)




def roofline_line(name: str, images_per_s: float, macs_per_image: float, roofline: float, width: int = 34) -> str:
    """``name: GMAC/s achieved and its share of the GEMM roofline``."""
    achieved = images_per_s * macs_per_image / 1e9
    return f"  {name:<{width}}{achieved:8.2f} GMAC/s   {100 * achieved / roofline:5.1f} % of roofline"


def eval_chunk(model, store) -> int:
    """The rows per CPU forward ``evaluate`` chooses for ``model`` on ``store``'s inputs."""
    import numpy as np
    import torch

    from ..model.cpu import cpu_forward_chunk, widest_row_bytes

    m = copy.deepcopy(model).eval()
    m.trunk_cached = store.cached
    x = store.get(np.arange(2))
    with torch.no_grad():
        return cpu_forward_chunk(widest_row_bytes(m, x))


@click.command()
@click.option("--protocol", "-p", default="tiny_cil", show_default=True, help="built-in name or YAML path")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option("--updates", default=20, show_default=True, type=click.IntRange(1), help="timed updates per repeat")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(0))
@click.option("--repeats", default=10, show_default=True, type=click.IntRange(1),
              help="repeats (interleaved plain / harness); the median and the best are reported")
@click.option("--eval-samples", default=1500, show_default=True, type=click.IntRange(1),
              help="size of the synthetic eval set (tiny_cil's test set has 1500)")
@click.option("--amp/--no-amp", default=True, show_default=True, help="bf16 autocast + channels_last on CUDA")
@click.option("--allow-download", is_flag=True, help="let timm fetch the protocol's pretrained weights")
@click.option("--paper", is_flag=True,
              help="instead: per-image costs of the data path (JPEG decode, trunk, body, feature I/O) and the "
                   "projected time of each stage of the full protocol (e.g. -p cil_places_lt_synthetic)")
@click.option("--paper-images", default=64, show_default=True, type=click.IntRange(4),
              help="--paper: JPEG files written and decoded per measurement")
@click.option("--budget-of", default=None, metavar="PROTOCOL",
              help="--paper: project at this protocol's budget (e.g. cil_places_lt) with -p's data counts")
@click.option("--project-tflops", type=float, default=None,
              help="--paper: also project for a device sustaining this many TFLOP/s (an assumption you state)")
def perf(protocol: str, device: str, updates: int, warmup: int, repeats: int, eval_samples: int, amp: bool,
         allow_download: bool, paper: bool, paper_images: int, budget_of: str | None,
         project_tflops: float | None) -> None:
    """Time a protocol's update and continual evaluation: plain PyTorch loop vs the harness
    (or, with --paper, the data path's per-image costs and the full protocol's projected time)."""
    from ..model.device import resolve_device
    from .perf_scale import check_paper_options, paper_report

    source = click.get_current_context().get_parameter_source
    given = [f"--{name.replace('_', '-')}" for name in ("project_tflops", "budget_of", "paper_images")
             if source(name) not in (None, click.core.ParameterSource.DEFAULT)]
    check_paper_options(paper, project_tflops, given)
    resolve_device(device)  # bench run's rule, before the protocol is even read
    if paper:
        paper_report(protocol, device, None, paper_images, min(repeats, 3), project_tflops, budget_of)
        return
    rig = _rig(protocol, device, amp, allow_download)
    gemm: list[float] = []  # roofline timings, interleaved with the stages': the same machine load
    train_macs, train_rates = _time_training(rig, updates, warmup, repeats, gemm)
    runs, times, width = _time_evaluation(rig, eval_samples, repeats, gemm)
    _print_roofline(rig, gemm, train_macs, train_rates, runs, times, eval_samples, width)


@dataclass
class _Rig:
    """What every stage of ``bench perf`` times on: the protocol's split network and its precision."""

    spec: Any
    dev: torch.device
    backbone: Any
    model: Any
    fast: bool  # bf16 autocast + channels_last (CUDA with --amp)
    gemm_precision: str
    input_shape: tuple[int, int, int]
    macs: dict[str, float]
    accel: Any  # the stages' autocast context

    @property
    def classes(self) -> int:
        return self.model.head.num_classes


def _rig(protocol: str, device: str, amp: bool, allow_download: bool) -> _Rig:
    """Build the protocol's network on the device with the run's CPU settings, and print what is timed."""
    import torch

    from ..model import flops as FL
    from ..model.backbone import network_or_random_init, split_network
    from ..model.compute import ComputeEnv
    from ..model.device import autocast, resolve_device
    from ..spec.protocol import load_protocol

    spec = load_protocol(protocol)
    dev = resolve_device(device)
    ComputeEnv.for_run(dev).apply()  # the threads, kernels and allocator a run computes with: stages and GEMM alike
    torch.manual_seed(0)
    net, backbone, weights_note = network_or_random_init(spec, allow_download)
    classes = None if spec.pretrain.mode == "weights" else (spec.classes_per_session or 10) * (spec.sessions + 1)
    model = split_network(net, backbone, classes).to(dev)
    fast = amp and dev.type == "cuda"
    if fast:
        model = model.to(memory_format=torch.channels_last)
    size, b = backbone.input_size, spec.training.batch
    input_shape = (backbone.in_chans, size, size)
    rig = _Rig(spec, dev, backbone, model, fast, roofline_precision(dev, amp), input_shape,
               FL.split_macs(model, input_shape), autocast(dev, "bf16" if fast else "fp32"))
    load = os.getloadavg()
    click.echo(f"bench perf | protocol {spec.name} | device {dev} | torch threads {torch.get_num_threads()} | "
               f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores)")
    click.echo(f"  backbone {backbone.model} at {size} px, weights: {weights_note}")
    click.echo(f"  head {rig.classes} classes; batch {b.new + b.old} ({b.new} new + {b.old} old); "
               f"{'bf16 autocast + channels_last' if fast else 'float32'}")
    click.echo("  forward MACs per sample (fvcore): " + ", ".join(f"{k} {v / 1e6:.2f} M" for k, v in rig.macs.items()))
    return rig


def _training_inputs(rig: _Rig, pool: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A synthetic training set of ``pool`` images in an input store (trunk features cached when the
    protocol does not augment), and the same inputs and labels as device tensors for the plain loop."""
    import numpy as np
    import torch

    from ..data.inputs import InputStore, Preprocess

    spec, cached = rig.spec, not rig.spec.training.augment
    catalog = _synthetic_catalog(pool, rig.backbone.input_size, rig.classes, seed=1)
    store = InputStore(catalog, Preprocess(rig.backbone, augment=spec.training.augment),
                       rig.model.trunk if cached else None, rig.dev, amp=rig.fast, progress=False)
    rig.model.trunk_cached = cached
    if store.cached:  # the features the harness's store holds, by id
        table = store.get(np.arange(pool))
        store.reset_seen()
    else:
        table = Preprocess(rig.backbone).images(catalog, np.arange(pool))
    return store, table.to(rig.dev), torch.tensor(catalog.labels).to(rig.dev)


def _time_training(rig: _Rig, updates: int, warmup: int, repeats: int,
                   gemm: list[float]) -> tuple[float, dict[str, float]]:
    """The plain loop and the harness update on the same inputs, interleaved; prints their rates and
    returns the MACs one trained image computes and each loop's images/s."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from ...methods.base import Context
    from ...methods.registry import build_method
    from ..model import flops as FL
    from ..model.compute import ComputeEnv
    from ..model.fastoptim import adamw
    from ..run.budget_guards import count_optimizer_steps
    from ..run.referee import observe_within_budget
    from ..run.workbench import Workbench

    spec, dev, b = rig.spec, rig.dev, rig.spec.training.batch
    batch, cached_train = b.new + b.old, not spec.training.augment
    pool = max(2 * batch, 128)
    t0 = time.perf_counter()
    train_store, table, labels_t = _training_inputs(rig, pool)
    build_train = time.perf_counter() - t0
    draws = np.random.default_rng(2)
    total = warmup + repeats * updates
    batches = [draws.integers(0, pool, size=batch) for _ in range(total)]

    # One model serves both loops, so both run the very same tensors (memory layout and alignment
    # included); each loop has its own optimizer. The FLOP meter is attached for harness blocks only.
    _spec, method = build_method("vanilla", spec.name)
    shared = copy.deepcopy(rig.model)
    stream = SimpleNamespace(train=train_store.catalog)  # stand-ins: only .train is read; no memory (none rehearses)
    compute = dataclasses.replace(ComputeEnv.now(), device=dev, precision="bf16" if rig.fast else "fp32")
    bench = Workbench(spec, stream, train_store, train_store, shared, compute=compute)  # type: ignore[arg-type]
    ctx = Context(spec, stream, dev, None, train_store, np.random.default_rng(0),  # type: ignore[arg-type]
                  torch.Generator().manual_seed(0))
    method.setup(shared, ctx)
    method.optimizer, method.scheduler = method.build_optimizer(total)
    optimizer = adamw(_plain_groups(shared, method.config))
    meter = FL.FlopMeter(shared, rig.input_shape)

    def plain_block(chunk) -> None:
        shared.train()
        for ids in chunk:
            idx = torch.from_numpy(ids).to(dev)
            x, y = table.index_select(0, idx), labels_t.index_select(0, idx)
            if rig.fast and x.ndim == 4:
                x = x.contiguous(memory_format=torch.channels_last)  # as InputStore.get gives it on CUDA
            with rig.accel:
                loss = F.cross_entropy(shared(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    times_plain: list[float] = []
    times_harness: list[float] = []
    with count_optimizer_steps() as steps:

        def harness_block(chunk) -> None:
            with meter.attached():
                for ids in chunk:
                    with rig.accel:
                        observe_within_budget(method, bench.batch(ids, b.new), steps, meter, batch)

        plain_block(batches[:warmup])
        harness_block(batches[:warmup])
        for r in range(repeats):
            chunk = batches[warmup + r * updates : warmup + (r + 1) * updates]
            order = [(plain_block, times_plain), (harness_block, times_harness)]
            for block, out in order if r % 2 == 0 else order[::-1]:
                out.append(_timed(lambda: block(chunk), dev))
            gemm.append(gemm_gmacs(dev, precision=rig.gemm_precision))  # interleaved: the same machine load
    rates = _report_training(times_plain, times_harness, updates, batch, cached_train)
    if cached_train:
        click.echo(f"  (one-off trunk pass over {pool} training images: {build_train:.2f} s)")
    # what one trained image computes: each part's forward and backward, less the trunk when cached
    train_macs = FL.update_macs_per_sample(meter)
    if cached_train:
        train_macs -= meter.cost("trunk").forward + meter.cost("trunk").backward
    return train_macs, rates


def _report_training(times_plain: list[float], times_harness: list[float], updates: int, batch: int,
                     cached_train: bool) -> dict[str, float]:
    """Print both loops' rates and their ratio; return each loop's images/s (medians)."""
    t_plain, t_harness = _median(times_plain), _median(times_harness)
    n = updates * batch
    click.echo(f"\ntraining ({updates} updates x {len(times_plain)} repeats, interleaved; median [best]; inputs: "
               f"{'cached trunk features' if cached_train else 'images'}):")
    for name, ts in (("plain PyTorch loop", times_plain), ("harness update", times_harness)):
        t, best = _median(ts), min(ts)
        click.echo(f"  {name:<21}{n / t:10.1f} images/s   {1e3 * t / updates:8.2f} ms/update   "
                   f"[{n / best:8.1f} images/s]")
    click.echo(f"  harness / plain time {t_harness / t_plain:10.3f} x   "
               f"[best {min(times_harness) / min(times_plain):.3f} x]")
    return {"plain PyTorch loop": n / t_plain, "harness update": n / t_harness}


def _time_evaluation(rig: _Rig, eval_samples: int, repeats: int,
                     gemm: list[float]) -> tuple[list[tuple[str, Any, int | None]], dict[str, list[float]], int]:
    """One continual evaluation through each input store (trunk cached, images kept, decoded each time;
    on the CPU also the former 16-row hooked path); prints the rates and returns the runs, their times
    and the label width."""
    import numpy as np
    import torch

    from ..data.inputs import InputStore, Preprocess
    from ..model import flops as FL
    from ..model.cpu import CPU_FORWARD_CHUNK
    from ..run.evaluation import EvalPlan, evaluate

    spec, dev, model = rig.spec, rig.dev, rig.model
    eval_catalog = _synthetic_catalog(eval_samples, rig.backbone.input_size, rig.classes, seed=3)
    labels = eval_catalog.labels
    old = labels < rig.classes // 2
    plan = EvalPlan(ids=np.arange(eval_samples), labels=torch.tensor(labels), old=old, new=~old,
                    task=old.astype(np.int64) ^ 1, tasks=2)
    pre = Preprocess(rig.backbone)
    t0 = time.perf_counter()
    stores = {"cached trunk": InputStore(eval_catalog, pre, model.trunk, dev, amp=rig.fast, progress=False)}
    build_eval = time.perf_counter() - t0
    stores["no trunk cache"] = InputStore(eval_catalog, pre, None, dev, amp=rig.fast)
    stores["no cache, decode each time"] = InputStore(eval_catalog, pre, None, dev, keep_images=False)
    # the same evaluations as the harness made them before the chunk followed the model and FLOPs were
    # counted once per row shape: 16-row chunks, every forward hooked (the ratio is this run's)
    old_path = {f"{key}, 16-row chunks, hooked": store
                for key, store in stores.items() if key != "no cache, decode each time" and dev.type == "cpu"}
    runs: list[tuple[str, Any, int | None]] = ([(key, store, None) for key, store in stores.items()]
            + [(key, store, CPU_FORWARD_CHUNK) for key, store in old_path.items()])
    times: dict[str, list[float]] = {key: [] for key, _, _ in runs}
    for r in range(repeats + 1):  # round 0 warms up
        for key, store, chunk in runs:
            m = copy.deepcopy(model).eval()
            m.trunk_cached = store.cached
            eval_meter = FL.FlopMeter(m, rig.input_shape)

            def one_evaluation() -> None:
                with eval_meter.attached(), eval_meter.evaluating(), rig.accel:
                    if chunk is None:
                        evaluate(m, store, plan, spec.eval.batch_size, meter=eval_meter)
                    else:
                        evaluate(m, store, plan, spec.eval.batch_size, chunk=chunk)

            spent = _timed(one_evaluation, dev)
            if r:
                times[key].append(spent)
        if r:
            gemm.append(gemm_gmacs(dev, precision=rig.gemm_precision))
    click.echo(f"\ncontinual evaluation ({eval_samples} images, batch {spec.eval.batch_size}, "
               f"median [best] of {repeats}):")
    base, base_best = _median(times["no trunk cache"]), min(times["no trunk cache"])
    width = max(len(key) for key in times) + 2
    for key, _, _ in runs:
        t, best = _median(times[key]), min(times[key])
        click.echo(f"  {key:<{width}}{eval_samples / t:10.1f} images/s   {t:8.3f} s   "
                   f"{base / t:6.2f} x vs no trunk cache   [best {base_best / best:.2f} x]")
    if dev.type == "cpu":
        for key in old_path:
            now = key.split(",")[0]
            click.echo(f"  {now}: {_median(times[key]) / _median(times[now]):.2f} x faster than 16-row chunks, hooked "
                       f"(chunk {eval_chunk(model, stores[now])} rows now)")
    click.echo(f"  (one-off trunk pass over the eval set: {build_eval:.2f} s, kept on disk across runs by `bench run`)")
    return runs, times, width


def _print_roofline(rig: _Rig, gemm: list[float], train_macs: float, train_rates: dict[str, float],
                    runs: list[tuple[str, Any, int | None]], times: dict[str, list[float]], eval_samples: int,
                    width: int) -> None:
    """The GEMM roofline measured between the stages, and each stage's achieved share of it."""
    import torch

    macs, cached_train = rig.macs, not rig.spec.training.augment
    roofline = _median(gemm)
    click.echo(f"\nroofline: {rig.gemm_precision} GEMM {GEMM_SIZE}x{GEMM_SIZE}, {torch.get_num_threads()} thread(s), "
               f"median of {len(gemm)} timings interleaved with the stages: "
               f"{roofline:.2f} GMAC/s [best {max(gemm):.2f}]")
    click.echo(f"  training per image: {train_macs / 1e6:.2f} M MACs (forward + backward"
               f"{', trunk cached' if cached_train else ''}); evaluation: {(macs['body'] + macs['head']) / 1e6:.2f} M "
               f"cached, {sum(macs.values()) / 1e6:.2f} M uncached")
    for name, rate in train_rates.items():
        click.echo(roofline_line(f"train, {name}", rate, train_macs, roofline, width + 7))
    for key, store, _ in runs:
        per_image = macs["body"] + macs["head"] + (0.0 if store.cached else macs["trunk"])
        click.echo(roofline_line(f"eval, {key}", eval_samples / _median(times[key]), per_image, roofline, width + 7))
