"""A run's identity: one typed, frozen value of everything that changes its numbers, and every key derived from it.

The checkpoint and claim keys of a phase, the device key, the cache tag of the deployed model and the trunk
features, the leaderboard's board and row, the MLflow run name and tags, and the "already stored" answer all
read the same ``RunIdentity``, so no two of them can disagree on what makes two runs the same. It is built
either from a request (``RunIdentity.of_request``: a protocol, a method string, its resolved settings, a seed
and how the run executes, ``Execution``) before the run computes anything, or from a stored result
(``RunIdentity.from_result``), with the rules for results made before bench recorded a part of it.

Torch-free and pandas-free: the CLI answers a stored run from it before torch loads. Its callers resolve what
only they can know (the machine arithmetic's label, the CPU kernel set's label) and hand it in as values.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .results.schema import RunResult
    from .spec.specfile import JSONValue

JOINT = "joint"  # the method string of the harness's own upper-bound reference


# ------------------------------------------------------------------ the parts keys and labels are made of


def key_hash(**parts: object) -> str:  # anything json.dumps takes, the rest by str()
    """A short hash of JSON-serialisable parts: the form of every checkpoint and claim key."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def canonical(value: Mapping[str, object]) -> str:
    """A mapping as sorted JSON: a frozen, comparable form that reads back to what ``key_hash`` hashes alike."""
    return json.dumps(value, sort_keys=True, default=str)


def format_setting(value: object) -> str:
    """A setting as ``--set`` takes it back: ``[soft,init,oocf]``, ``0.0002``."""
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


class Ruled(Protocol):
    """A tuned stamp, as far as identity reads it: the ruleset its settings were chosen under."""

    @property
    def ruleset(self) -> str: ...


def _row(method: str, overrides: Mapping[str, object], ruleset: str | None) -> str:
    if ruleset is not None:
        return f"{method} [{ruleset}]"
    extra = ", ".join(f"{k}={format_setting(v)}" for k, v in sorted(overrides.items()))
    return f"{method} [{extra}]" if extra else method


def row_label(method: str, overrides: Mapping[str, object], tuned: Ruled | None = None) -> str:
    """The row a run belongs to: its method string plus the ``--set`` overrides it ran with
    (``lwf+sgm [lr=0.0002]``), so a variant never averages with, or replaces, the default runs; a tuned
    run's row is named by its ruleset (``derpp [tuned (8 trials, CK_delta)]``), its settings are in the run."""
    return _row(method, overrides, tuned.ruleset if tuned is not None else None)


def _effort(overrides: Mapping[str, object], ruleset: str | None) -> str:
    return ruleset if ruleset is not None else "set by hand" if overrides else "defaults"


def effort(overrides: Mapping[str, object], tuned: Ruled | None) -> str:
    """How a run's settings were chosen: ``defaults``, ``tuned (N trials, objective)``, or ``set by hand``."""
    return _effort(overrides, tuned.ruleset if tuned is not None else None)


def resolve_precision(asked: str | None, embedded: bool, device: str) -> str:
    """The precision a run trains and evaluates in: the one asked for, else the protocol's default: fp32 on
    the paper's protocols (the published code trains in float32 under torch 1.12's defaults), bf16 on CUDA
    for the embedded ones (their default before the switch existed; the CPU always ran them in fp32, so
    their CPU numbers stay as they were)."""
    if asked is not None:
        return asked
    return "bf16" if embedded and device == "cuda" else "fp32"


def recorded_precision(recorded: object, device: str) -> str:
    """The precision a stored run or cache file records; one made before bench recorded it was made as bench
    then did: bf16 autocast on CUDA, fp32 elsewhere."""
    return str(recorded or ("bf16" if device.startswith("cuda") else "fp32"))


def mlflow_name(row: str, seed: int, precision: str | None = None) -> str:
    """The MLflow run's name: the leaderboard row, the seed and the precision, so two variants of a method
    never read alike in the UI."""
    name = f"{row} seed{seed}"
    return f"{name} {precision}" if precision else name


# ------------------------------------------------------------------ how a run executes

# the CPU thread count every CPU run computed with when keys were first made: a key names another count only,
# so those keys stay as they were and a run with another count never resumes from one of them
KEYED_THREADS = 1


@dataclass(frozen=True)
class Execution:
    """How a run computes, apart from what: the device and, on the CPU, the thread count and kernel set, and the
    machine arithmetic (``harness.numerics``). The fields a stored result does not record, or records as
    resolved, are not compared: how the run was asked for (``asked_device``, ``asked_precision``, the kernel set's
    name) and the caching and decoding switches; the device key reads them, so a checkpoint resumes only under
    the same ones."""

    device: str  # the device's type, as torch names it: cpu, cuda, mps
    threads: int  # intra-op threads on the CPU (0 elsewhere, or for a CPU run that did not record them)
    cpu_kernels: str  # the CPU kernel set's label ("" off the CPU; "unrecorded" for a CPU run that did not say)
    numerics: str  # the machine arithmetic's label ("unrecorded" for a run made before bench recorded it)
    trunk_cache: bool = field(default=True, compare=False)
    gpu_decode: bool = field(default=True, compare=False)
    asked_device: str = field(default="", compare=False)  # --device as given ("auto", "cuda:1"); "": ``device``
    asked_precision: str | None = field(default=None, compare=False)  # --precision as given; None: the default
    kernel_set: str = field(default="fast", compare=False)  # --cpu-kernels: fast or stock

    @property
    def device_key(self) -> str:
        """The execution's part of a checkpoint key (8 hex digits). Its form is kept as keys were first made:
        the precision as asked ("default" when not), ``cpu_channels_last`` always off (the switch is gone; CUDA
        checkpoints made before stay resumable), ``gpu_decode`` named only when off, the kernel label only
        when the CPU was asked for by name and the CPU thread count only when not ``KEYED_THREADS``."""
        asked = self.asked_device or self.device
        off = {**({} if self.gpu_decode else {"gpu_decode": False}),
               **({"cpu_kernels": self.cpu_kernels} if asked.startswith("cpu") else {}),
               **({"threads": self.threads} if self.device == "cpu" and self.threads != KEYED_THREADS else {})}
        return key_hash(device=asked, precision=self.asked_precision or "default", cpu_channels_last=False,
                        trunk_cache=self.trunk_cache, numerics=self.numerics, **off)[:8]

    def key(self, **parts: object) -> str:
        """A checkpoint or claim key: ``parts`` with this execution's device key."""
        return key_hash(**parts, device=self.device_key)

    @property
    def cache_tag(self) -> str:
        """What a cache made under this execution adds to its key: the machine arithmetic and, on the CPU, the
        thread count and the kernel set (trunk features and trained models alike differ in the last bits
        otherwise)."""
        if self.device != "cpu":
            return self.numerics
        return f"cpu-threads{self.threads}-{self.cpu_kernels}-{self.numerics}"


# ------------------------------------------------------------------ the run's identity


class ProtocolLike(Protocol):
    """A protocol, as far as identity reads it."""

    @property
    def name(self) -> str: ...
    @property
    def spec_hash(self) -> str: ...
    @property
    def embedded(self) -> bool: ...


@dataclass(frozen=True)
class RunIdentity:
    """Everything that changes a run's numbers, and everything a key or a grouping derives from it.

    ``settings`` and ``overrides`` are held as sorted JSON (``canonical``): frozen and comparable, and read back
    (``config``, ``override_values``) to exactly what the keys have always hashed. ``tuned`` is the tuning
    ruleset the settings came from (None: defaults, or set by hand). ``code_hash``: the method's code as the
    result records it (``MethodStamp.code_hash``; None for the joint reference and for results made before it
    was recorded). The execution fields are ``Execution``'s, flat (``execution`` gathers them again)."""

    protocol: str
    spec_hash: str
    method: str
    seed: int
    settings: str
    overrides: str = "{}"
    tuned: str | None = None
    code_hash: str | None = None
    precision: str = "fp32"
    device: str = "cpu"
    threads: int = 0
    cpu_kernels: str = ""
    numerics: str = "unrecorded"
    trunk_cache: bool = field(default=True, compare=False)
    gpu_decode: bool = field(default=True, compare=False)
    asked_device: str = field(default="", compare=False)
    asked_precision: str | None = field(default=None, compare=False)
    kernel_set: str = field(default="fast", compare=False)

    # ---------------------------------------------------------------- constructors

    @classmethod
    def of_request(cls, protocol: ProtocolLike, method: str, seed: int, config: Mapping[str, object],
                   overrides: Mapping[str, object], execution: Execution, tuned: Ruled | None = None,
                   code_hash: str | None = None) -> RunIdentity:
        """The identity of a run about to be made: the method's resolved settings (``config``), the ``--set``
        overrides (a tuned run's: its entry's settings), how it executes; the precision is resolved here."""
        return cls(protocol=protocol.name, spec_hash=protocol.spec_hash, method=method, seed=seed,
                   settings=canonical(config), overrides=canonical(overrides),
                   tuned=tuned.ruleset if tuned is not None else None, code_hash=code_hash,
                   precision=resolve_precision(execution.asked_precision, protocol.embedded, execution.device),
                   **{f.name: getattr(execution, f.name) for f in fields(Execution)})

    @classmethod
    def from_result(cls, r: RunResult) -> RunIdentity:
        """The identity a stored run was made with. A result from before a part was recorded: the precision is
        the only mode bench had then (bf16 autocast on CUDA, fp32 elsewhere); the machine arithmetic is
        ``unrecorded`` (its CPU and code paths are unknown, so it matches no run made now); on the CPU the
        thread count is 0 and the kernel label ``unrecorded``. Off the CPU both are 0 and "" (not applicable).
        What a result does not record of how it was asked for (``Execution``'s uncompared fields) is taken as
        the defaults, the device as resolved."""
        opts = r.options
        device_text = str(opts.get("device", "cpu"))
        device = device_text.partition(":")[0]
        cpu = device_text.startswith("cpu")
        kernels = str(opts.get("cpu_kernels") or "unrecorded") if cpu else ""
        return cls(protocol=r.protocol.name, spec_hash=r.protocol.hash, method=r.method.spec, seed=r.seed,
                   settings=canonical(r.config), overrides=canonical(r.overrides),
                   tuned=r.tuned.ruleset if r.tuned is not None else None, code_hash=r.method.code_hash,
                   precision=recorded_precision(opts.get("precision"), device_text),
                   device=device, threads=int(opts.get("torch_threads") or 0) if cpu else 0, cpu_kernels=kernels,
                   numerics=str(opts.get("numerics") or "unrecorded"), trunk_cache=bool(opts.get("trunk_cache", True)),
                   asked_device=device_text, kernel_set="stock" if kernels.startswith("stock-") else "fast")

    # ---------------------------------------------------------------- the parts

    @cached_property
    def config(self) -> dict[str, JSONValue]:
        """The resolved settings, as a mapping (read once; ``settings`` stays the identity's value)."""
        return json.loads(self.settings)

    @cached_property
    def override_values(self) -> dict[str, JSONValue]:
        """The ``--set`` overrides, as a mapping (read once; ``overrides`` stays the identity's value)."""
        return json.loads(self.overrides)

    @property
    def is_joint(self) -> bool:
        return self.method == JOINT

    @property
    def execution(self) -> Execution:
        return Execution(**{f.name: getattr(self, f.name) for f in fields(Execution)})

    def under(self, execution: Execution) -> RunIdentity:
        """This run as made under ``execution`` (a stored result's identity, keyed as this process runs)."""
        return replace(self, **{f.name: getattr(execution, f.name) for f in fields(Execution)})

    # ---------------------------------------------------------------- keys

    def checkpoint_parts(self, part: int | None = None) -> dict[str, JSONValue]:
        """What a phase's checkpoint key hashes beside the device key: for the joint reference the spec, the
        seed, its settings and (for one of its models) the part; for a method run the spec, the method, its
        settings and overrides, and the seed."""
        if self.is_joint:
            return {"protocol": self.spec_hash, "seed": self.seed, "config": json.loads(self.settings),
                    **({} if part is None else {"part": part})}
        return {"protocol": self.spec_hash, "method": self.method, "config": json.loads(self.settings),
                "overrides": json.loads(self.overrides), "seed": self.seed}

    def checkpoint_key(self, part: int | None = None) -> str:
        """The key of this run's checkpoint (``part``: one model of the joint reference)."""
        return self.execution.key(**self.checkpoint_parts(part))

    def claim_key(self, part: int | None = None) -> str:
        """The key of the claim a process holds while it makes this run: the checkpoint's, and for a method run
        the precision and whether its settings were tuned as well."""
        if self.is_joint:
            return self.checkpoint_key(part)
        return self.execution.key(**self.checkpoint_parts(), precision=self.precision, tuned=self.tuned is not None)

    @property
    def device_key(self) -> str:
        return self.execution.device_key

    @property
    def cache_tag(self) -> str:
        """The deployed model's and the trunk features' cache tag: the execution's alone (a cache is shared by
        every method, seed and setting made under it)."""
        return self.execution.cache_tag

    # ---------------------------------------------------------------- groupings and names

    @property
    def row(self) -> str:
        """The leaderboard row (``row_label``)."""
        return _row(self.method, self.override_values, self.tuned)

    @property
    def row_key(self) -> tuple[str, int]:
        """What one stored run stands for among a protocol's counted runs: its row and seed."""
        return self.row, self.seed

    @property
    def board_key(self) -> tuple[str, str, str]:
        """The leaderboard board a run is ranked on: protocol, precision and machine arithmetic. Runs of two
        boards never share a row, a joint reference or an A_best."""
        return self.protocol, self.precision, self.numerics

    @property
    def effort(self) -> str:
        return _effort(self.override_values, self.tuned)

    @property
    def columns(self) -> dict[str, str | int]:
        """What, beyond protocol, method and seed, every machine-readable output carries per run: the
        precision, how the settings were chosen, the CPU's threads and kernels, the machine arithmetic."""
        return {"precision": self.precision, "settings": self.effort, "threads": self.threads,
                "cpu_kernels": self.cpu_kernels, "numerics": self.numerics}

    @property
    def text(self) -> str:
        """``fp32, defaults, 1 thread, kernels fast-..., arithmetic <label>``: the columns as a summary line."""
        parts = [self.precision, self.effort]
        if self.threads:
            parts.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        if self.cpu_kernels:
            parts.append(f"kernels {self.cpu_kernels}")
        parts.append(f"arithmetic {self.numerics}")
        return ", ".join(parts)

    @property
    def run_name(self) -> str:
        return mlflow_name(self.row, self.seed, self.precision)

    @property
    def mlflow_tags(self) -> dict[str, str]:
        """The MLflow tags the identity gives a run: its spec hash and its columns."""
        return {"bench.protocol_hash": self.spec_hash, **{f"bench.{k}": str(v) for k, v in self.columns.items()}}

    # ---------------------------------------------------------------- the stored-run answer

    def same_run(self, stored: RunIdentity) -> bool:
        """``stored`` (a stored run the comparability rule counted for this run's arithmetic) is this very run:
        the same spec, row, seed, resolved settings, code, precision and machine arithmetic. The CPU thread
        count and kernel label are the comparability rule's to judge (``select_runs``: it reads labels written
        before they were derived and versions a torch-free host cannot know), so they are not compared here."""
        return (self.spec_hash == stored.spec_hash and self.row_key == stored.row_key
                and self.config == stored.config and self.code_hash == stored.code_hash
                and self.precision == stored.precision and self.numerics == stored.numerics)
