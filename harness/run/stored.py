"""Which stored runs of a protocol count for a run of given arithmetic, and whether an identical run is stored,
answerable without importing torch.

A request whose identical run is stored needs a file read, not a run's set-up: the protocol's spec hash,
the method's settings (resolved by the built-ins' torch-free configs) and code hash, the seed, and what the run
would compute with (the CPU, fp32, the kernel set's label and the machine arithmetic, all known before torch
loads) are all the stored-run rule reads. Where one of them is only known once torch is loaded (a GPU, a
plugin method whose settings its class resolves), the answer is "cannot tell" and the full check decides.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...methods.configs import CONFIGS, joint_settings
from ...methods.registry import code_hash, parse_method, resolve_settings
from ..identity import JOINT, Execution, ProtocolLike, Ruled, RunIdentity
from ..results.comparability import Selection, stored_selection
from ..spec.protocol import Protocol

Stored = tuple[Path, Any]


def protocol_selection(protocol: Protocol, results_dir: Path, run: Execution, precision: str,
                       weights: str | None = None) -> Selection[Stored]:
    """Which stored runs of this protocol spec count for a run computing in ``precision`` under ``run`` (its
    CPU kernel set and machine arithmetic; the one rule: ``comparability.select_runs``); with the backbone
    weights' digest, runs made with other weights content do not."""
    return stored_selection(results_dir, protocol.name, protocol.spec_hash, protocol.best_new_reference,
                            joint_settings(protocol), weights, precision, kernels=run.kernel_set,
                            numerics=run.numerics)


def request_identity(protocol: ProtocolLike, method: str, seed: int, config: dict[str, Any],
                     overrides: dict[str, Any], run: Execution, tuned: Ruled | None = None) -> RunIdentity:
    """The identity of the run of ``method`` (resolved to ``config``) a request makes under ``run``, with the
    code hash its result will record (none for the joint reference); known without torch."""
    spec = None if method == JOINT else parse_method(method)
    return RunIdentity.of_request(protocol, method, seed, config, overrides, run, tuned,
                                  None if spec is None else code_hash([spec.base, *spec.modifiers]))


def resolved_settings(method: str, protocol: Protocol, overrides: dict[str, Any]) -> dict[str, Any] | None:
    """What a run of ``method`` is configured with (as ``registry.method_settings`` of the built method),
    from the torch-free configs; None when a part is a plugin, whose class resolves its own."""
    spec = parse_method(method)
    if any(entry.target not in CONFIGS for entry in (spec.base, *spec.modifiers)):
        return None
    config, modifier_configs = resolve_settings(spec, protocol, overrides)
    out = config.model_dump(mode="json")
    for entry, modifier_config in zip(spec.modifiers, modifier_configs):
        out[entry.name] = modifier_config.model_dump(mode="json")
    return out
