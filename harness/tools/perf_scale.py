"""``bench perf --paper``: per-image costs of a protocol's data path, and the time each stage of the
full protocol would take, projected from them.

Measured here, on the device that runs it: JPEG decode + preprocessing per worker (real JPEG files
written to a temporary folder at the protocol's source image size, so no dataset is needed), the
trunk forward, the body+head forward (evaluation) and forward+backward+AdamW step (training) per
image at the protocol's batch size, and trunk-feature write and read speed through the shard store
(read right after writing: from the OS page cache when it holds them). The projection multiplies
those per-image costs by the image counts of the protocol's stream and the data path
``harness.data.datapath`` plans for it; it ignores overlap between decoding workers and compute on the
CPU (they share the cores) and takes the slower of the two on CUDA (workers feed the GPU), where JPEG
files are decoded on the GPU (nvJPEG, measured on a batch) after workers read them: where the run would,
so a protocol of generated images (the synthetic twins) is projected with CPU-worker decode, and one
projected ``--budget-of`` a real protocol with that protocol's JPEG files. The forwards are
timed as the harness makes them: on the CPU the trunk pass in 16-row chunks and the eval forward in chunks
sized from its widest activation (``model.cpu.cpu_forward_chunk``); bf16 autocast and channels_last on CUDA.

A projection for another device (``--project-tflops``) scales the measured compute by the ratio of
FLOP rates: that device's sustained rate is an assumption the user states, printed beside the result.
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click
import numpy as np

from ..errors import BenchError, only_with

if TYPE_CHECKING:
    from ..spec.protocol import Protocol


@dataclass
class Costs:
    """Seconds per image of each piece of the data path, and the FLOPs behind the compute."""

    decode: float          # one worker: JPEG -> preprocessed tensor
    trunk: float           # trunk forward
    body_eval: float       # body + head forward, no grad
    train_step: float      # body + head forward + backward + optimizer step, per sample
    write_gbs: float
    read_gbs: float
    flops_trunk: float     # per image, forward (2 x fvcore MACs)
    flops_body: float
    decode_device: float | None = None  # on CUDA: a batch's JPEG bytes decoded by nvJPEG and preprocessed there


def _per_image(fn, n: int, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / n


def measure(protocol, model, device, batch: int, images: int, repeats: int) -> Costs:
    """The per-image costs of ``protocol``'s data path with ``model`` (a SplitModel) on ``device``."""
    import torch
    import torch.nn.functional as F
    from PIL import Image

    from ..data.features import write_shards
    from ..data.inputs import Preprocess, decode_on
    from ..data.sources import FileSplit
    from ..model import flops as FL
    from ..model.cpu import TRUNK_PASS_CHUNK, in_cpu_chunks
    from ..model.device import autocast
    from ..model.fastoptim import adamw

    b = protocol.backbone
    size = next((s.synthetic.image_size for s in (protocol.pretrain_data, *protocol.stream_data)
                 if s.synthetic is not None), 256)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        rng = np.random.default_rng(0)
        names = []
        for i in range(images):  # smooth content + noise: a JPEG of realistic size, not of pure noise
            base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            img = Image.fromarray(base).resize((size, size), Image.Resampling.BICUBIC)
            arr = np.clip(np.asarray(img).astype(np.int16) + rng.integers(-12, 13, (size, size, 3)), 0, 255)
            names.append(f"{i:05d}.jpg")
            Image.fromarray(arr.astype(np.uint8)).save(Path(tmp) / names[-1], quality=90)
        split = FileSplit(tmp, names, np.zeros(images, dtype=np.int64), ["c"], "jpeg")
        pre = Preprocess(b)
        decode = _per_image(lambda: [pre.one(split, i) for i in range(images)], images, repeats)
        encoded = [torch.from_numpy(split.encoded(i)) for i in range(images)]
        decode_device = _per_image(lambda: (decode_on(device, pre, encoded), sync()), images, repeats) \
            if device.type == "cuda" else None
        x = torch.stack([pre.one(split, i % images) for i in range(batch)]).to(device)
        model = model.to(device).eval()
        if device.type == "cuda":  # as the harness runs it there: bf16 autocast, channels_last
            model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        # the forwards as the harness makes them (CPU: chunks as above; CUDA: bf16, the embedded protocols' default)
        with torch.no_grad(), autocast(device, "bf16" if device.type == "cuda" else "fp32"):
            trunk = _per_image(lambda: (in_cpu_chunks(model.trunk, x, TRUNK_PASS_CHUNK), sync()), batch, repeats)
            feats = model.trunk(x)
            body_eval = _per_image(lambda: (in_cpu_chunks(lambda f: model.head(model.body(f)), feats), sync()),
                                   batch, repeats)
        model.train()
        params = [p for p in list(model.body.parameters()) + list(model.head.parameters())]
        opt = adamw([{"params": params, "lr": 1e-4}])
        y = torch.zeros(batch, dtype=torch.long, device=device)

        def step() -> None:
            with autocast(device, "bf16" if device.type == "cuda" else "fp32"):
                loss = F.cross_entropy(model.head(model.body(feats)), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sync()

        train_step = _per_image(step, batch, repeats)
        rows = feats.detach().float().cpu()
        reps = max(1, (64 * 2**20) // max(1, rows.numel() * 4))  # ~64 MB per measurement
        t0 = time.perf_counter()
        store = write_shards(Path(tmp) / "feats", reps * batch, (rows for _ in range(reps)))
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.read(np.random.default_rng(1).permutation(reps * batch))
        read_s = time.perf_counter() - t0
        store.close()
    macs = FL.split_macs(model.cpu(), (b.in_chans, b.input_size, b.input_size))
    return Costs(decode, trunk, body_eval, train_step, store.nbytes / write_s / 2**30, store.nbytes / read_s / 2**30,
                 2 * macs["trunk"], 2 * (macs["body"] + macs["head"]), decode_device)


def stage_images(protocol, stream) -> dict[str, dict[str, int]]:
    """Images each stage of one full run pushes through each piece (one seed, the joint reference included)."""
    from ..run.evaluation import eval_plan

    t, j = protocol.training, protocol.joint
    n_test = int((stream.test.labels >= 0).sum())
    per_session = [t.session_updates(len(s.train_ids)) for s in stream.sessions]
    if None in per_session:
        raise BenchError(f"Protocol {protocol.name} gives training.budget in TFLOPs, so its update count is known "
                         f"only as a run goes: project an update-budgeted protocol (training.updates).")
    eval_sets = [len(eval_plan(stream, s).ids) for s in stream.sessions]
    points = [len(protocol.eval.points(u)) for u in per_session]
    models = len(stream.sessions) if j.mode == "per_session" else 1
    return {
        "eval-set trunk pass": {"decode": n_test, "trunk": n_test},
        "joint reference": {"train": models * j.updates * j.batch_size, "eval": sum(eval_sets)},
        "CL training": {"train": sum(per_session) * t.batch.size},
        "CL evaluation": {"eval": sum(p * n for p, n in zip(points, eval_sets))},
    }


def project(costs: Costs, stages: dict, train_streamed: bool, eval_streamed: bool, workers: int,
            cuda: bool, compute_scale: float = 1.0) -> dict[str, float]:
    """Seconds per stage: per-image costs x images (compute divided by ``compute_scale``)."""
    def feed(decode_s: float, compute_s: float) -> float:
        if cuda and costs.decode_device is not None:  # workers only read files; the GPU decodes, in series
            return compute_s + costs.decode_device / compute_scale if decode_s else compute_s
        return max(decode_s / workers, compute_s) if cuda else decode_s / workers + compute_s

    out = {}
    for stage, n in stages.items():
        s = 0.0
        if "decode" in n and not eval_streamed:  # a streamed eval set has no trunk pass of its own
            s += n["decode"] * feed(costs.decode, costs.trunk / compute_scale)
        if "train" in n:
            stream_cost = costs.trunk / compute_scale if train_streamed else 0.0
            s += n["train"] * feed(costs.decode if train_streamed else 0.0,
                                   stream_cost + costs.train_step / compute_scale)
        if "eval" in n:
            stream_cost = costs.trunk / compute_scale if eval_streamed else 0.0
            s += n["eval"] * feed(costs.decode if eval_streamed else 0.0, stream_cost + costs.body_eval / compute_scale)
        out[stage] = s
    return out


def _hms(seconds: float) -> str:
    h, rem = divmod(int(seconds), 3600)
    return f"{h:d} h {rem // 60:02d} min" if h else f"{rem // 60:d} min {rem % 60:02d} s"


def with_budget_of(protocol: Protocol, other_name: str | None) -> Protocol:
    """``protocol``'s data with another protocol's budget (updates, batches, eval points, joint):
    a synthetic twin's counts projected at the real protocol's full budget. The combination is validated
    as a protocol file is: a session layout that does not fit the data (40 classes a session of 365) would
    otherwise project a stream no run could draw."""
    if not other_name:
        return protocol
    from pydantic import ValidationError

    from ..spec.protocol import Protocol, load_protocol
    from ..spec.specfile import validation_problems

    other = load_protocol(other_name)
    fields = ("pretrain", "training", "memory", "eval", "joint", "sessions", "classes_per_session", "ordering")
    merged = protocol.model_copy(update={f: getattr(other, f) for f in fields})
    try:
        Protocol.model_validate(merged.model_dump())
    except ValidationError as err:
        raise BenchError(f"--budget-of {other_name}: {other.name}'s budget does not fit {protocol.name}'s data: "
                         f"{validation_problems(err).removeprefix('(top level): ')}.") from None
    return merged.model_copy(update={"name": f"{protocol.name}@{other.name}"})


def paper_report(protocol_name: str, device_name: str, batch: int | None, images: int, repeats: int,
                 project_tflops: float | None, budget_of: str | None = None) -> None:
    """Print the measured per-image costs and the projected time of each stage of the protocol."""
    import torch

    from ..data.datapath import plan_data_path
    from ..data.inputs import Preprocess, gpu_decodable, loader_workers
    from ..data.stream import build_stream
    from ..model.backbone import network_or_random_init, split_network
    from ..model.device import resolve_device
    from ..paths import cache_dir
    from ..spec.protocol import load_protocol
    from .roofline import GEMM_SIZE, gemm_gmacs, roofline_precision

    protocol = with_budget_of(load_protocol(protocol_name), budget_of)
    device = resolve_device(device_name)
    stream = build_stream(protocol, 0)  # needs the protocol's data (a synthetic twin has the same counts)
    torch.manual_seed(0)
    net, backbone, note = network_or_random_init(protocol, False)
    model = split_network(net, backbone, None if protocol.pretrain.mode == "weights" else stream.pretrain_classes)
    model = model.to(device)  # the data-path plan runs the trunk once, on the device it will run on
    root = cache_dir() / "trunk"
    root.mkdir(parents=True, exist_ok=True)
    plan = plan_data_path(protocol, stream, model.trunk, device, device.type == "cuda", root, {})
    batch = batch or protocol.training.batch.size
    costs = measure(protocol, model, device, batch, images, repeats)
    device_decode = budget_of is not None or all(
        gpu_decodable(getattr(stream, split), Preprocess(protocol.backbone), device) for split in ("train", "test"))
    precision = roofline_precision(device, True)  # measure's forwards: bf16 autocast on CUDA, fp32 elsewhere
    roofline = 2e9 * float(np.median([gemm_gmacs(device, precision=precision) for _ in range(max(1, repeats))]))
    workers = max(1, loader_workers())
    click.echo(f"bench perf --paper | protocol {protocol.name} | device {device} | torch threads "
               f"{torch.get_num_threads()} | {workers} decode worker(s) | weights: {note}")
    click.echo(plan.describe())
    click.echo(f"per image (median of {repeats}, batch {batch}):")
    click.echo(f"  JPEG decode + preprocess  {1e3 * costs.decode:8.2f} ms  "
               f"({1 / costs.decode:7.1f} images/s per worker)")
    if costs.decode_device is not None:
        click.echo(f"  JPEG decode on {device} (nvJPEG) {1e3 * costs.decode_device:6.2f} ms  "
                   f"({1 / costs.decode_device:7.1f} images/s, batch of {images})")
    for name, sec, fl in (("trunk forward", costs.trunk, costs.flops_trunk),
                          ("body+head forward", costs.body_eval, costs.flops_body),
                          ("train step (fwd+bwd+AdamW)", costs.train_step, 3 * costs.flops_body)):
        click.echo(f"  {name:<25} {1e3 * sec:8.2f} ms  ({1 / sec:7.1f} images/s, {fl / sec / 1e9:7.1f} GFLOP/s, "
                   f"{100 * fl / sec / roofline:5.1f} % of roofline)")
    click.echo(f"  roofline: {precision} GEMM {GEMM_SIZE}x{GEMM_SIZE} on {device}, {roofline / 1e9:.1f} GFLOP/s "
               f"(the precision the forwards above run in)")
    click.echo(f"  trunk features: write {costs.write_gbs:.2f} GiB/s, read {costs.read_gbs:.2f} GiB/s "
               f"(random rows, right after writing)")
    stages = stage_images(protocol, stream)
    streamed = (plan.train.mode == "trunk-stream", plan.test.mode == "trunk-stream")
    if costs.decode_device is not None and not device_decode:
        click.echo("  (this protocol's images are not JPEG files: its run decodes them in CPU workers, and so "
                   "does this projection)")
        costs = dataclasses.replace(costs, decode_device=None)
    here = project(costs, stages, *streamed, workers, device.type == "cuda")
    rows = [("this machine (measured costs)", here)]
    if project_tflops:
        achieved = 3 * costs.flops_body / costs.train_step
        scale = project_tflops * 1e12 / achieved
        rows.append((f"a device sustaining {project_tflops:g} TFLOP/s ({scale:,.0f}x the compute here; "
                     f"decode as measured, 16 workers) - an assumption, not a measurement",
                     project(costs, stages, *streamed, 16, True, scale)))
    for title, times in rows:
        click.echo(f"projected time of the full protocol, one seed, on {title}:")
        for stage, sec in times.items():
            click.echo(f"  {stage:<20} {_hms(sec):>14}")
        click.echo(f"  {'total':<20} {_hms(sum(times.values())):>14}")


def check_paper_options(paper: bool, project_tflops: float | None, given: Sequence[str] = ()) -> None:
    """The options of ``--paper`` that can be checked before anything is measured (``given``: the options the
    user set). One of them without ``--paper`` is refused rather than ignored: the plain benchmark would run,
    and look like the projection asked for."""
    only_paper = [o for o in ("--project-tflops", "--budget-of", "--paper-images") if o in given]
    if only_paper and not paper:
        raise BenchError(f"{only_with(only_paper, 'bench perf --paper')}.")
    if project_tflops is not None and not (math.isfinite(project_tflops) and project_tflops > 0):
        raise BenchError(f"--project-tflops {project_tflops:g}: a device's sustained rate is a positive, finite "
                         f"number of TFLOP/s (e.g. 400 for an H100's bf16 at about 40 % of its peak).")
