"""Deep equality of two states (a method's ``state_dict``, nested dicts and lists of tensors and arrays),
for the contract checks that a state survives a round trip and that a run's training did not move."""

from __future__ import annotations

import numpy as np
import torch


def same_state(a: object, b: object) -> bool:
    """Deep equality of two state dicts (tensors and arrays by value)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and
                bool(torch.equal(a, b)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b
