"""Settings a run reads from BENCH_* environment variables, each with its rule in one place: read where the
value is used, and all at once by ``check_environment`` before any compute, so a typo is one paragraph
naming the variable (exit 2), never a ValueError from deep inside a run or a budget of -5 GB."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import BenchError
from .numerics import pin_mode


@dataclass(frozen=True)
class EnvNumber:
    """A number ``name`` may set: finite and >= 0 (> 0 when ``positive``; whole when ``integer``)."""

    name: str
    example: str
    positive: bool = False
    integer: bool = False

    def read(self) -> float | None:
        """The value set, None when the variable is unset or blank (the caller's default applies)."""
        text = os.environ.get(self.name, "").strip()
        if not text:
            return None
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value) and (value > 0 if self.positive else value >= 0) and \
                (value.is_integer() or not self.integer):
            return value
        kind = "a whole number" if self.integer else "a number"
        raise BenchError(f"{self.name}={text!r} is not {kind} {'> 0' if self.positive else '>= 0'}: set it to one "
                         f"(e.g. {self.name}={self.example}) or unset it for the default.")


RAM_GB = EnvNumber("BENCH_RAM_GB", "16", positive=True)
DISK_GB = EnvNumber("BENCH_DISK_GB", "100")
IMAGE_CACHE_GB = EnvNumber("BENCH_IMAGE_CACHE_GB", "4")
LOADER_WORKERS = EnvNumber("BENCH_LOADER_WORKERS", "4", integer=True)
# 0 would print a line at every update: the megabytes of output plain lines exist to avoid
PROGRESS_EVERY_S = EnvNumber("BENCH_PROGRESS_EVERY_S", "30", positive=True)
TRUNK_CACHE_MODES = ("auto", "ram", "disk", "stream")


def trunk_cache_setting() -> str:
    """$BENCH_TRUNK_CACHE, lower-cased: one of ``TRUNK_CACHE_MODES`` (auto when unset)."""
    value = os.environ.get("BENCH_TRUNK_CACHE", "auto").strip().lower()
    if value not in TRUNK_CACHE_MODES:
        raise BenchError(f"BENCH_TRUNK_CACHE={value!r} must be auto, ram, disk or stream.")
    return value


KILL_PHASES = ("pretrain", "joint", "continual")


def kill_at() -> tuple[str, int] | None:
    """$BENCH_KILL_AT (fault injection for the resume tests) as (phase, N); None when unset."""
    text = os.environ.get("BENCH_KILL_AT", "").strip()
    if not text:
        return None
    phase, _, count = text.partition(":")
    if phase in KILL_PHASES and count.isdigit():
        return phase, int(count)
    raise BenchError(f"BENCH_KILL_AT={text!r} must be PHASE:N with PHASE one of {', '.join(KILL_PHASES)} and N "
                     "a whole number of updates (e.g. BENCH_KILL_AT=continual:5); it is fault injection for the "
                     "resume tests: unset it for a normal run.")


def check_environment() -> None:
    """Every BENCH_* setting a run reads, read now: a malformed one is refused before anything computes
    rather than when the run first needs it (the progress interval, for one, only once training prints)."""
    for setting in (RAM_GB, DISK_GB, IMAGE_CACHE_GB, LOADER_WORKERS, PROGRESS_EVERY_S):
        setting.read()
    trunk_cache_setting()
    kill_at()
    pin_mode()
