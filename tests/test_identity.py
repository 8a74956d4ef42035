"""A run's identity (``harness.identity.RunIdentity``) is the one value every identity-derived key comes from:
the keys are what they were before it existed (pinned below, computed with the code it replaced), a stored
result reads back as the identity of the request that made it, and a change to one field moves every key
that field belongs to (the ones it deliberately does not belong to are named, and stay)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from results_factory import two_session_run

from bench_stability_gap.harness.identity import Execution, RunIdentity, canonical, key_hash
from bench_stability_gap.harness.results.comparability import (CPU_KERNELS, CPU_THREADS, execution, kernel_label,
                                                               select_runs)
from bench_stability_gap.harness.results.schema import (MethodStamp, ProtocolStamp, RunResult, TunedStamp,
                                                        load_result, run_identity)
from bench_stability_gap.harness.results.tracking import _tags, result_run_name
from bench_stability_gap.harness.run.options import RunOptions
from bench_stability_gap.harness.sweep.plan import finished
from bench_stability_gap.leaderboard.aggregate import Entry, summarize

KL = "fast-0123456789ab-torch2.4.0-timm1.0.9"  # fixed labels: the pinned keys must not depend on this machine
NUM, GNUM = "cpu-x86-avx2-amd", "cuda-H200-sm90-cuda12.4-cudnn90100"
CONFIG = {"lr": 0.001, "weight_decay": 0.05, "sgm": {"rank": 4, "parts": ["soft", "init"]}}
JOINT_CONFIG = {"lr": 0.01, "weight_decay": 0.0}


@dataclasses.dataclass(frozen=True)
class Spec:  # a protocol as identity reads it
    name: str = "p"
    spec_hash: str = "p" * 16
    embedded: bool = True


def test_importing_it_loads_neither_torch_nor_pandas() -> None:
    code = ("import sys; import bench_stability_gap.harness.identity; "
            "assert 'torch' not in sys.modules and 'pandas' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------ the keys are what they were

CPU = Execution(device="cpu", threads=1, cpu_kernels=KL, numerics=NUM, asked_device="cpu")
CUDA = Execution(device="cuda", threads=0, cpu_kernels="", numerics=GNUM, asked_device="cuda")
# RunOptions.device_key before RunIdentity, with kernel_label and numerics fixed as above
PINNED_DEVICE_KEYS = {
    "cpu": (CPU, "2794d445"),
    "cpu_bf16": (dataclasses.replace(CPU, asked_precision="bf16"), "fb7c2b59"),
    "cpu_fp32": (dataclasses.replace(CPU, asked_precision="fp32"), "5c0fe1ad"),
    "cpu_stock": (dataclasses.replace(CPU, cpu_kernels="stock-torch2.4.0-timm1.0.9", kernel_set="stock"), "4a5c607c"),
    "cpu_nocache": (dataclasses.replace(CPU, trunk_cache=False), "48c9f676"),
    "cpu_nogpudecode": (dataclasses.replace(CPU, gpu_decode=False), "884cb923"),
    "auto": (dataclasses.replace(CPU, asked_device="auto"), "1522ebb3"),
    "cuda": (CUDA, "63d8c70d"),
    "cuda_tf32": (dataclasses.replace(CUDA, asked_precision="tf32"), "acd530b5"),
}


@pytest.mark.parametrize("name", sorted(PINNED_DEVICE_KEYS))
def test_device_keys_are_pinned(name: str) -> None:
    run, key = PINNED_DEVICE_KEYS[name]
    assert run.device_key == key


def test_checkpoint_claim_and_cache_keys_are_pinned() -> None:
    """The keys ``run_key(**parts, device=options.device_key)`` and ``cache_tag`` gave for the same request."""
    run = RunIdentity.of_request(Spec(), "vanilla+sgm", 3, CONFIG, {"lr": 0.001}, CPU)
    assert run.checkpoint_key() == "0811a02fc2d98357"
    assert run.claim_key() == "6c16d82f01143231"  # the checkpoint's parts, the precision and "tuned": False
    joint = RunIdentity.of_request(Spec(), "joint", 3, JOINT_CONFIG, {}, CPU)
    assert joint.checkpoint_key() == joint.claim_key() == "87f608210fd2cfb6"
    assert joint.checkpoint_key(1) == joint.claim_key(1) == "842ec4c9bccaedf4"
    assert CPU.key(protocol="p" * 16, seed=3, methods=["vanilla"], skip=None) == "b4526bcb1148ec72"  # A_best's claim
    assert run.cache_tag == f"cpu-threads1-{KL}-{NUM}"
    assert RunIdentity.of_request(Spec(), "vanilla", 0, {}, {}, CUDA).cache_tag == GNUM


def test_this_machines_keys_are_the_formula_they_always_were(tmp_path: Path) -> None:
    """With this machine's labels (what ``RunOptions`` resolves): the device key is the hash of the parts it
    always hashed."""
    for options in (RunOptions(results_dir=tmp_path), RunOptions(results_dir=tmp_path, precision="bf16",
                                                                  trunk_cache=False, gpu_decode=False)):
        off = {} if options.gpu_decode else {"gpu_decode": False}
        assert options.device_key == key_hash(
            device="cpu", precision=options.precision or "default", cpu_channels_last=False,
            trunk_cache=options.trunk_cache, numerics=options.numerics, cpu_kernels=kernel_label("fast"), **off)[:8]


def test_precision_is_resolved_once_from_the_request() -> None:
    assert RunIdentity.of_request(Spec(), "vanilla", 0, {}, {}, CPU).precision == "fp32"  # embedded on the CPU
    assert RunIdentity.of_request(Spec(), "vanilla", 0, {}, {}, CUDA).precision == "bf16"  # embedded on CUDA
    assert RunIdentity.of_request(Spec(embedded=False), "vanilla", 0, {}, {}, CUDA).precision == "fp32"
    asked = dataclasses.replace(CUDA, asked_precision="tf32")
    assert RunIdentity.of_request(Spec(), "vanilla", 0, {}, {}, asked).precision == "tf32"


# ------------------------------------------------------------------ a stored run reads back as its request

TUNED = TunedStamp(trials=8, objective="CK_delta", value=0.1, validation_per_class=5, study="s", tuning_hash="t" * 16)


def result_of(identity: RunIdentity, run_id: str = "r1") -> RunResult:
    """The result a run with ``identity`` stores (a hand-made one: its numbers are results_factory's)."""
    base, *modifiers = identity.method.split("+")
    return two_session_run(run_id).model_copy(update={
        "protocol": ProtocolStamp(name=identity.protocol, version=1, hash=identity.spec_hash),
        "method": MethodStamp(spec=identity.method, base=base, modifiers=modifiers, distribution="bench-stability-gap",
                              version="0.1.0", code_hash=identity.code_hash),
        "config": identity.config, "overrides": identity.override_values, "seed": identity.seed,
        "tuned": TUNED if identity.tuned == TUNED.ruleset else None,
        "options": {"device": identity.device, "precision": identity.precision, "torch_threads": identity.threads,
                    "cpu_kernels": identity.cpu_kernels or None, "numerics": identity.numerics,
                    "trunk_cache": identity.trunk_cache}})


# the request every change below starts from: a CPU run with this installation's kernel set (the comparability
# rule compares stored labels with it)
HERE = execution("cpu", NUM, "fast", asked_device="cpu")
BASE = RunIdentity.of_request(Spec(name="hand", spec_hash="h" * 16), "vanilla", 0, CONFIG, {}, HERE,
                              code_hash="c" * 16)


def test_a_stored_result_reads_back_as_the_identity_that_made_it(tmp_path: Path) -> None:
    assert RunIdentity.from_result(result_of(BASE)) == BASE
    assert BASE.threads == CPU_THREADS and BASE.cpu_kernels == CPU_KERNELS


def test_a_run_made_by_bench_reads_back_as_its_request(joint_results: Path) -> None:
    """The joint reference the session's fixture made (``bench run ... joint``, seed 0, on the CPU): the identity
    read from its file equals the one built from its request, and so do its keys."""
    from bench_stability_gap.harness.spec.protocol import load_protocol
    from bench_stability_gap.methods.configs import joint_settings

    (stored,) = (joint_results / "runs").rglob("*.json")
    protocol = load_protocol(str(joint_results.parent / "tiny_cil_reduced.yaml"))
    options = RunOptions(results_dir=joint_results, device="cpu")
    asked = options.identity(protocol, "joint", 0, joint_settings(protocol), {})
    made = RunIdentity.from_result(load_result(stored))
    assert made == asked
    assert made.under(options.execution).checkpoint_key(0) == asked.checkpoint_key(0)
    assert made.board_key == asked.board_key and made.run_name == asked.run_name


def test_unrecorded_parts_read_as_they_always_did() -> None:
    old = two_session_run().model_copy(update={"options": {"device": "cuda:0"}})
    assert RunIdentity.from_result(old).columns == {"precision": "bf16", "settings": "defaults", "threads": 0,
                                                   "cpu_kernels": "", "numerics": "unrecorded"}
    old_cpu = two_session_run().model_copy(update={"options": {"device": "cpu"}})
    assert run_identity(old_cpu) == {"precision": "fp32", "settings": "defaults", "threads": 0,
                                     "cpu_kernels": "unrecorded", "numerics": "unrecorded"}


# ------------------------------------------------------------------ one field moves every key it belongs to

# One change each, as a request would make it. Which derivations a field deliberately does not move:
# - the checkpoint key predates the code hash and the tuned stamp (a run resumes across a method-code edit, and
#   a tuned run shares the checkpoint of a hand run with the same settings: the numbers are the same); the
#   claim key names whether the settings were tuned;
# - settings resolved otherwise under the same row (a changed default) keep the row and its MLflow name: the
#   newer run replaces the older on the board, and the leaderboard splits a row by code hash;
# - the leaderboard ranks runs of one spec hash, thread count and kernel set: a run with another is set apart
#   (not ranked beside the others) rather than grouped on a board of its own;
# - the caches (the deployed model, the trunk features) are shared by every method, seed, setting and code:
#   their tag is the execution's alone; precision and spec hash are named in the cache file names beside it.
MOVES = ("checkpoint", "stored", "leaderboard", "mlflow", "cache")
CHANGES: dict[str, tuple[dict[str, Any], set[str]]] = {
    "seed": ({"seed": 1}, {"checkpoint", "stored", "leaderboard", "mlflow"}),
    "method": ({"method": "finetune"}, {"checkpoint", "stored", "leaderboard", "mlflow"}),
    "settings by hand": ({"overrides": canonical({"lr": 0.1}), "settings": canonical({**CONFIG, "lr": 0.1})},
                         {"checkpoint", "stored", "leaderboard", "mlflow"}),
    "tuned": ({"tuned": TUNED.ruleset}, {"claim", "stored", "leaderboard", "mlflow"}),
    "resolved settings": ({"settings": canonical({**CONFIG, "weight_decay": 0.0})}, {"checkpoint", "stored"}),
    "code hash": ({"code_hash": "d" * 16}, {"stored"}),
    "spec hash": ({"spec_hash": "q" * 16}, {"checkpoint", "stored", "leaderboard", "mlflow"}),
    "precision": ({"precision": "bf16", "asked_precision": "bf16"}, {"checkpoint", "stored", "leaderboard", "mlflow"}),
    "threads": ({"threads": 2}, {"checkpoint", "stored", "leaderboard", "mlflow", "cache"}),
    "cpu kernels": ({"cpu_kernels": kernel_label("stock"), "kernel_set": "stock"},
                    {"checkpoint", "stored", "leaderboard", "mlflow", "cache"}),
    "numerics": ({"numerics": "cpu-x86-avx2-intel"}, set(MOVES)),
}


def _stored_answer(asked: RunIdentity, stored: RunIdentity, tmp_path: Path) -> bool:
    """Whether the stored-run check (``plan.finished`` over the selection for ``asked``'s arithmetic) answers
    ``asked`` with the run of identity ``stored``."""
    item = (tmp_path / "r.json", result_of(stored))
    counted = select_runs([item], asked.spec_hash, ["vanilla"], result_of=lambda pr: pr[1], precision=asked.precision,
                          kernels=asked.kernel_set, numerics=asked.numerics)
    return finished(asked, counted) == item[0]


def _same_place(asked: RunIdentity, other: RunIdentity) -> bool:
    """Whether the leaderboard takes a run of ``other`` for the same place as a run of ``asked``: the same board,
    row and seed, both counted by its rule, so that one supersedes the other."""
    boards = summarize([Entry(result_of(asked, "a"), "a"), Entry(result_of(other, "b"), "b")])
    return any((e.reason or "").startswith("superseded") for b in boards for e in b.entries)


def _mlflow(identity: RunIdentity, tmp_path: Path) -> tuple[str, dict[str, str]]:
    result = result_of(identity)
    tags = {k: v for k, v in _tags(result, tmp_path / "r.json").items() if k != "bench.run_id"}
    return result_run_name(result), tags


def _moved(asked: RunIdentity, other: RunIdentity, tmp_path: Path) -> set[str]:
    moved = {"checkpoint"} if other.checkpoint_key() != asked.checkpoint_key() else set()
    moved |= {"claim"} if other.claim_key() != asked.claim_key() and not moved else set()
    moved |= {"stored"} if not _stored_answer(asked, other, tmp_path) else set()
    moved |= {"leaderboard"} if not _same_place(asked, other) else set()
    moved |= {"mlflow"} if _mlflow(other, tmp_path) != _mlflow(asked, tmp_path) else set()
    return moved | ({"cache"} if other.cache_tag != asked.cache_tag else set())


def test_the_unchanged_identity_moves_nothing(tmp_path: Path) -> None:
    assert _moved(BASE, dataclasses.replace(BASE), tmp_path) == set()
    assert _stored_answer(BASE, BASE, tmp_path) and _same_place(BASE, BASE)  # the checks can say "the same"


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_one_field_moves_every_key_it_belongs_to(field: str, tmp_path: Path) -> None:
    change, expected = CHANGES[field]
    other = dataclasses.replace(BASE, **change)
    assert other != BASE
    assert _moved(BASE, other, tmp_path) == expected


def test_how_a_run_was_asked_for_moves_only_its_checkpoint() -> None:
    """Caching, decoding and the device's spelling change no number a result records: two runs differing in
    them are the same run, but a checkpoint resumes only under the same ones."""
    for change in ({"trunk_cache": False}, {"gpu_decode": False}, {"asked_device": "auto"}):
        other = dataclasses.replace(BASE, **change)
        assert other == BASE and other.checkpoint_key() != BASE.checkpoint_key()
        assert other.cache_tag == BASE.cache_tag and other.row_key == BASE.row_key and other.same_run(BASE)
