"""The harness's calls into a run's method, guarded: what the method's own code raises ends the run as one
paragraph naming the method, the hook, the point of the run and the method's line (exit 2: the method is
the user's input), not as a traceback that reads as bench's bug."""

from __future__ import annotations

import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ...methods.base import Method
from ..atomic import storage_error
from ..errors import BenchError, MethodFault
from .checkpoint import Checkpointer
from .hook_clock import HookClock, HookOverran, HookTimedOut

DEBUG_VARIABLE = "BENCH_DEBUG"  # set (to anything but 0): a method's fault also prints its full traceback
BUILTIN = Method.__module__.rpartition(".")[0] + "."  # the package of the built-in methods and modifiers
LONGEST_REASON = 400  # characters of an exception's message a fault's paragraph quotes


class MethodCalls:
    """The harness's calls into the run's method, each made under ``calls(hook, where)``: an exception the
    method's code raises (``SystemExit`` too: a method's code cannot end bench) ends the run as one
    ``MethodFault`` paragraph naming the method, the hook, the point of the run and the method's own line,
    not as a traceback that reads as bench's bug. What the harness enforces inside a call (a BenchError),
    an interrupt and a storage fault (a full disk is no method's fault) pass as they are."""

    def __init__(self, method: Method, checkpoint: Checkpointer | None, time_limit: float | None = None,
                 limit_source: str = "--hook-time-limit") -> None:
        self.method, self.checkpoint = method, checkpoint
        self.parts: list[type] = [type(method), *(type(m) for m in getattr(method, "modifiers", []))]
        # each call under a time limit (``hook_clock``): ``time_limit`` seconds (set by ``limit_source``), or
        # derived from the run's updates
        self.clock = HookClock(time_limit, lambda hook, where, limit: str(self.overran(hook, where, limit, None)),
                               limit_source)

    @contextmanager
    def __call__(self, hook: str, where: str) -> Iterator[None]:
        try:
            with self.clock.watching(hook, where):
                yield
        except HookOverran as exc:
            raise self.overran(hook, where, self.clock.limit(), exc) from None
        except BenchError:
            raise
        except (Exception, SystemExit) as exc:
            if storage_error(exc) is not None:
                raise
            if os.environ.get(DEBUG_VARIABLE, "").strip() not in ("", "0"):
                traceback.print_exception(exc)
            reason = " ".join(f"{type(exc).__name__}: {exc}".split())
            if len(reason) > LONGEST_REASON:
                reason = f"{reason[:LONGEST_REASON]}... [{len(reason):,} characters]"
            line = self._own_line(exc)
            raise self.fault(hook, where, f"{reason}{f' (raised at {line})' if line else ''}") from exc

    def overran(self, hook: str, where: str, limit: float, exc: BaseException | None) -> HookTimedOut:
        """The paragraph of a call stopped past its time limit: by the signal (``exc``, raised where the
        method's code was), or, where none could stop it, by ending the process (``exc`` None)."""
        line = self._own_line(exc) if exc is not None else None
        how = (f"and was stopped{f' at {line}' if line else ''}" if exc is not None else
               "and no signal could stop it (C code that never returns, or code that catches the stop), so bench "
               "ended the process")
        fault = self.fault(hook, where, f"it was still running after {limit:.0f} s ({self.clock.how()}), {how}",
                           failed="did not return from")
        return HookTimedOut(str(fault))

    def fault(self, hook: str, where: str, what: str, failed: str = "failed in") -> MethodFault:
        """The paragraph for ``what`` went wrong in ``hook`` at ``where``: whose code it is, and, for a run
        that checkpoints (a stored run's), what a rerun finds: its last checkpoint, when one was saved."""
        origin, builtin = self._origin()
        cp, kept = self.checkpoint, "The run stopped."
        if cp is not None:
            saved = [path for path in (cp.mid_path, cp.path) if path.is_file()]
            kept = ("The run stopped and stored no result; results stored before (references) are kept. " +
                    (f"Its last checkpoint ({saved[0]}) is kept: running the same command again resumes from it "
                     f"(--restart starts over)." if saved else
                     "No checkpoint of it was saved yet, so running the same command again starts it over."))
        who = (f"This is a bug in a method built into bench: please report it, with the traceback "
               f"{DEBUG_VARIABLE}=1 prints." if builtin else
               f"The fault is in the method's code, not bench's; {DEBUG_VARIABLE}=1 prints the full traceback.")
        call = f"{hook}()" if hook.isidentifier() else hook  # a hook's name, or words where none is known
        return MethodFault(f"Method {self.method.label!r} ({origin}) {failed} {call} {where}: {what}. {kept} "
                           f"{who}")

    def _origin(self) -> tuple[str, bool]:
        """Where the method's code comes from: each part's distribution and version, as its entry point
        records them (the class where no entry point names it); and whether every part is bench's own."""
        from ...methods.registry import METHOD_GROUP, MODIFIER_GROUP, entries

        found: list[str] = []
        for cls in self.parts:
            named = [e for group in (METHOD_GROUP, MODIFIER_GROUP) for e in entries(group).values()
                     if e.name == getattr(cls, "name", None) and e.target.partition(":")[0] in _modules_of(cls)]
            text = f"{named[0].distribution} {named[0].version}" if named else \
                f"class {cls.__module__}.{cls.__qualname__}"
            if text not in found:
                found.append(text)
        builtin = all(cls.__module__.startswith(BUILTIN) for cls in self.parts)
        return ", ".join(found), builtin

    def _own_line(self, exc: BaseException) -> str | None:
        """``file:line, in function`` of the innermost frame of ``exc`` in the method's own code (the
        packages its parts come from): where its author looks, however deep in torch it surfaced."""
        roots = [root for cls in self.parts if (root := _code_of(cls)) is not None]
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            path = Path(frame.filename).resolve()
            if any(path == root or path.is_relative_to(root) for root in roots):
                return f"{frame.filename}:{frame.lineno}, in {frame.name}"
        return None


def _modules_of(cls: type) -> set[str]:
    """The modules an entry point may name ``cls`` by: its own and its package's (``pkg:Cls`` re-exported)."""
    parts = cls.__module__.split(".")
    return {".".join(parts[:depth]) for depth in range(1, len(parts) + 1)}


def _code_of(cls: type) -> Path | None:
    """The code ``cls`` comes from: its outermost package (``registry.code_root``), or its own file."""
    from ...methods.registry import code_root

    try:
        return code_root(cls.__module__).resolve()
    except (BenchError, ImportError, ValueError):  # __main__, or a module made at run time
        import inspect

        try:
            return Path(inspect.getfile(cls)).resolve()
        except (TypeError, OSError):
            return None
