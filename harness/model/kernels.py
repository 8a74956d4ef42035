"""Which CPU kernel set this process computes with: ``fast`` (``fastconv``'s rewrites of the small
convolutions and ``fastoptim``'s fused AdamW) or ``stock`` (PyTorch's own kernels).

The choice is process-wide because the rewritten modules are built into the network and the optimizer
is built by each method: a run sets it once, before its first float operation, and records the set's
label (``harness.results.comparability.kernel_label``). ``stock`` exists to check the fast set against
PyTorch's kernels on the same seed, and for a machine where a rewrite misbehaves; it never mixes with
the default set's runs.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import torch

from ..results.comparability import KERNEL_SETS
from .fastconv import stock_kernels
from .fastoptim import adamw

_CHOICE = ["fast"]
_STOCK_SCOPE: list[ExitStack] = []  # holds stock_kernels() open while the stock set is chosen


def current() -> str:
    """The kernel set in use: ``fast`` or ``stock``."""
    return _CHOICE[0]


def use_kernels(name: str) -> str:
    """Compute with the ``name`` set from now on; returns the set in use before."""
    if name not in KERNEL_SETS:
        raise ValueError(f"cpu_kernels {name!r}: choose one of {', '.join(KERNEL_SETS)}")
    was = _CHOICE[0]
    if name == "stock" and not _STOCK_SCOPE:
        scope = ExitStack()
        scope.enter_context(stock_kernels())
        _STOCK_SCOPE.append(scope)
    elif name == "fast" and _STOCK_SCOPE:
        _STOCK_SCOPE.pop().close()
    _CHOICE[0] = name
    return was


def optimizer(groups: list[dict[str, Any]]) -> torch.optim.AdamW:
    """The standard step's AdamW under the set in use: fused on the CPU (fast), PyTorch's loop (stock)."""
    return adamw(groups) if _CHOICE[0] == "fast" else torch.optim.AdamW(groups)
