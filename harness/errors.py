"""User-facing errors: one clear paragraph, exit code 2, no traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class BenchError(Exception):
    """Bad input the user can fix: the CLI prints the message and exits with code 2."""

    exit_code = 2


def did_you_mean(value: str, choices: Iterable[str], what: str) -> BenchError:
    """An 'unknown X' error that names the nearest valid choices (lm-eval-harness style)."""
    choices = sorted(choices)
    close = difflib.get_close_matches(value, choices, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return BenchError(f"Unknown {what} {value!r}.{hint} Known {what}s: {', '.join(choices)}.")
