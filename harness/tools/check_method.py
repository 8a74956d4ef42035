"""``bench check-method NAME``: the method contract, run on any installed method in about a minute.

Every rule of the referee (harness/run/referee.py, ``RULES``), the check-method tier's reflective audits
included (what closures hold, the state of the plugin's classes and modules), on two tiny embedded
protocols derived from tiny_cil (offline with a storage cap, and online sample by sample), plus the audit
rules, what a single run cannot show: the same seed giving the same numbers, ``state_dict`` surviving a
save and a load into a fresh instance, a run stopped mid-session resuming to the uninterrupted numbers,
and each term of the loss reaching a trainable parameter once the modifiers are applied (``loss_terms``). The
project's own tests use the same specs (tests/test_contract.py), so a plugin author runs exactly what the
built-ins pass.
"""

from __future__ import annotations

import functools
import io
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...methods.base import StandardMethod
from ...methods.registry import build_method
from ..errors import BenchError
from ..model.module_copy import deepcopy_with_modules
from ..run.budget_guards import memory_spec
from ..run.checkpoint import Checkpointer
from ..run.continual import run_cl
from ..run.isolation import ServedIds, random_streams
from ..run.memory import Memory
from ..run.options import RunOptions
from ..run.referee import auditing, breach
from ..run.workbench import Workbench, prepare
from ..spec.protocol import Protocol, load_protocol
from .eval_independence import check_eval_independence
from .loss_terms import check_loss_terms
from .preflight import check_seed
from .state_compare import same_state

CAP = 40  # samples: tight for the reduced streams (600 pre-training images, 10 classes to come)
# the checks after the runs, by the referee's audit rule each one judges (``referee.RULES``, point ``audit``)
AUDITS = {"determinism": "determinism", "evaluation teaches nothing": "eval_independence",
          "state round-trip": "state_round_trip", "resume": "resume",
          "loss terms reach trainable parameters": "loss_terms_train"}


def reduced_spec(name: str = "tiny_cil", **training: Any) -> dict:
    """tiny_cil's structure (4 sessions of 5 classes) on a budget a unit test can afford."""
    spec = load_protocol(name).model_dump(mode="json")
    spec["name"] = f"{name}_reduced"
    # evaluation is most of a run this small: 5 test images a class, and points at updates 0, 1, 2 and 6
    spec["pretrain_data"].update(train_per_class=60, test_per_class=5)
    spec["stream_data"][0].update(train_per_class=40, test_per_class=5)
    spec["stream_data"][1].update(train_per_class=40, test_per_class=5)
    spec["pretrain"].update(updates=20, batch_size=32)
    spec["training"].update({"updates": 6, "batch": {"new": 8, "old": 8}, **training})
    spec["eval"] = {"every": 6, "dense_every": 1, "dense_until": 2, "batch_size": 256}
    spec["joint"].update(updates=8, batch_size=16)
    if spec.get("validation"):  # scaled with the data: 5 of each class's 40-60 training images
        spec["validation"]["per_class"] = 5
    return spec


def _smaller(spec: dict, name: str) -> dict:
    """Two sessions (the head grows twice), 4 test images per class, a barely trained deployed model."""
    spec["name"] = name
    spec["sessions"] = 2
    spec["pretrain"].update(updates=4)
    for src in (spec["pretrain_data"], *spec["stream_data"]):
        src["test_per_class"] = 4
    spec["memory"] = {"policy": "reservoir", "capacity": CAP, "include_pretrain": True}
    return spec


def capped_spec() -> dict:
    """Offline: 3 updates of 8 new + 8 old per session, eval at 0 and 3, storage capped."""
    spec = _smaller(reduced_spec(), "contract_capped")
    spec["training"].update(updates=3)
    spec["eval"] = {"every": 3, "batch_size": 256}
    return spec


def online_spec() -> dict:
    """Sample by sample: one update (1 new + 8 old) per arriving sample, 1 sample per class."""
    spec = _smaller(reduced_spec("tiny_online_500"), "contract_online")
    spec["stream_data"][0].update(train_per_class=1)
    spec["stream_data"][1].update(train_per_class=1)
    spec["training"].update(updates="per_sample", batch={"new": 1, "old": 8})
    spec["eval"] = {"every": 5, "batch_size": 256}
    return spec


@dataclass
class Outcome:
    check: str
    passed: bool | None  # None: not applicable yet
    detail: str


def state_round_trip(bench: Workbench, text: str, overrides: dict[str, object], trained: Any, seed: int) -> None:
    """``trained.state_dict()`` (taken after the run) saved, loaded and given to a fresh instance brought to
    the same phase (set up, head grown, through the last session's hooks) gives back the same state dict:
    what checkpoints and resume rely on."""
    state = trained.state_dict()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    _, fresh = build_method(text, bench.protocol, overrides)
    streams = random_streams(seed)
    memory = Memory(memory_spec(bench.protocol, fresh), bench.stream.train.labels,
                    bench.stream.train.sample_bytes, streams.harness)
    memory.add(bench.stream.pretrain_ids[:CAP])
    model = deepcopy_with_modules(bench.deployed)
    served = ServedIds(bench.stream.pretrain_ids)
    ctx = bench.context(memory, streams.method, streams.method_torch, fresh.name, served)
    fresh.setup(model, ctx)
    for session in bench.stream.sessions:
        model.head.grow(len(session.new_classes), streams.harness_torch)
    last = bench.stream.sessions[-1]
    served.ids = last.train_ids
    fresh.begin_session(last)  # the phase the trained one is in: after its last session's end
    fresh.end_session(last)
    fresh.load_state_dict(loaded)
    if not same_state(fresh.state_dict(), state):
        raise breach("state_round_trip", f"Method {fresh.name!r}: state_dict() saved and loaded into a fresh "
                                         f"instance (load_state_dict) does not give the same state back.")


def check_method(text: str, overrides: dict[str, object] | None = None, seed: int = 0,
                 say: Callable[[Outcome], None] = lambda o: None, precision: str = "fp32") -> list[Outcome]:
    """Every check on ``text``; each outcome is reported through ``say`` as it comes."""
    overrides = dict(overrides or {})
    build_method(text, Protocol.model_validate(capped_spec()), overrides)  # a typo or bad --set: before any compute
    check_seed(seed)  # numpy refuses it only after the deployed models are trained
    out: list[Outcome] = []

    def record(check: str, fn: Callable[[], str]) -> Any:
        try:
            outcome = Outcome(check, True, fn())
        except BenchError as err:
            outcome = Outcome(check, False, str(err))
        out.append(outcome)
        say(outcome)
        return outcome.passed

    with auditing(), tempfile.TemporaryDirectory(prefix="bench-check-") as tmp:  # every tier of the referee's rules
        options = RunOptions(results_dir=Path(tmp), progress=False, log=False, precision=precision)
        capped = prepare(Protocol.model_validate(capped_spec()), seed, options)
        online = prepare(Protocol.model_validate(online_spec()), seed, options)
        runs: dict[str, Any] = {}

        def run(bench: Workbench, key: str) -> str:
            _, method = build_method(text, bench.protocol, overrides)
            curves, budget, _ = run_cl(bench, method, seed, options)
            runs[key] = (method, curves, budget)
            p = bench.protocol
            # a count per session (these protocols have no FLOP budget)
            expected = [p.training.session_updates(len(s.train_ids)) or 0 for s in bench.stream.sessions]
            if budget.optimizer_steps != sum(expected) or budget.memory_peak_samples > CAP:
                raise BenchError(f"Method {method.name!r}: {budget.optimizer_steps} optimizer steps (expected "
                                 f"{sum(expected)}) and {budget.memory_peak_samples} samples stored (cap {CAP}).")
            return (f"{budget.optimizer_steps} updates, at most {budget.max_trained_per_update} samples trained per "
                    f"update, memory peak {budget.memory_peak_samples}/{CAP}, final accuracy {curves[-1].all[-1]:.3f}")

        for key, bench, what in (("offline", capped, "offline, storage capped"),
                                 ("online", online, "online, per sample")):
            record(f"run ({what}): budget, storage, test isolation", functools.partial(run, bench, key))

        def determinism() -> str:
            _, first, budget = runs["offline"]
            _, method = build_method(text, capped.protocol, overrides)
            again, budget2, _ = run_cl(capped, method, seed, options)
            if again != first or budget2 != budget:
                raise breach("determinism", f"Method {method.name!r}: two runs with seed {seed} gave different "
                                            f"curves or budgets.")
            return "same seed, same curves and budget"

        def round_trip() -> str:
            state_round_trip(capped, text, overrides, runs["offline"][0], seed)
            return "state_dict -> torch.save -> load_state_dict -> same state"

        if "offline" in runs:
            record("determinism", determinism)
            trained, curves = runs["offline"][:2]
            record("evaluation teaches nothing",
                   lambda: check_eval_independence(capped, text, overrides, trained, curves, seed, options))
            record("state round-trip", round_trip)
            record("resume", lambda: resume_check(capped, text, overrides, runs["offline"], seed, options))
            if isinstance(runs["offline"][0], StandardMethod):
                record("loss terms reach trainable parameters",
                       lambda: check_loss_terms(capped, text, overrides, seed, options))
            else:
                out.append(Outcome("loss terms reach trainable parameters", None,
                                   "not applicable: the method has its own step (no modifier applies)"))
                say(out[-1])
        else:
            for check in AUDITS:
                out.append(Outcome(check, None, "not checked: the offline run failed"))
                say(out[-1])
    return out


class _Stopped(Exception):
    """Raised right after the checkpoint a resume check stops at (an in-process 'kill')."""


class _StopAfterMidSave(Checkpointer):
    def save(self, state: dict[str, Any], mid: bool = False) -> None:
        super().save(state, mid=mid)
        if mid and state["loop"]["stretch"] == 1:  # in the last session's middle
            raise _Stopped


def resume_check(bench: Workbench, text: str, overrides: dict[str, object], done: tuple, seed: int,
                 options: RunOptions) -> str:
    """Stopped in the middle of the last session right after a checkpoint, then resumed by a fresh
    instance, the run gives the uninterrupted run's curves and budget."""
    _, first, budget = done
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        path = Path(tmp) / "continual.pt"
        _, method = build_method(text, bench.protocol, overrides)
        try:
            run_cl(bench, method, seed, options, _StopAfterMidSave(path, every=2))
        except _Stopped:
            pass
        else:
            return "not checked: the run had no mid-session checkpoint to stop at"
        _, fresh = build_method(text, bench.protocol, overrides)
        again, budget2, _ = run_cl(bench, fresh, seed, options, Checkpointer(path, every=2))
    if again != first or budget2 != budget:
        raise breach("resume", f"Method {fresh.name!r}: a run stopped mid-session and resumed from its checkpoint "
                               f"gives other curves or budget than the uninterrupted run.")
    return "stopped mid-session after a checkpoint, resumed by a fresh instance: same curves and budget"
