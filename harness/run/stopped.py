"""What a Ctrl-C or SIGTERM leaves on disk, in the note the CLI prints for it.

Each stage of a run that writes something (the deployed model's pre-training, the joint reference, an
A_best reference run, the method run) runs inside ``stage``: a stop that passes through it gets a note
made from the disk at that moment, by the innermost stage it stopped in: the stage's result when it was
stored already (a stop can land between the result's write and the code that would announce it), else
the checkpoint(s) a rerun resumes from, or that none was saved yet, and the results this process stored
before. The CLI prints that note in place of a generic one, so the note never says "nothing was written"
beside a complete result, nor promises a checkpoint that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import note_stop, stop_note

if TYPE_CHECKING:  # the CLI reads the notes without loading torch
    from .checkpoint import Checkpointer

_stored_here: list[Path] = []  # results this process stored, oldest first
_open = [0]  # stages entered and not left: the outermost one is the thing the command was asked for
STORED = "bench_stored"  # attribute of a stop: the result of the stage it stopped, when that was stored


def record_stored(path: Path) -> None:
    """A result this process stored: later stop notes name it among what is kept."""
    if path not in _stored_here:
        _stored_here.append(path)


def forget_stored() -> None:
    """A new command begins: what an earlier one in this process stored is not this one's to name."""
    _stored_here.clear()


def stored_before(stop: KeyboardInterrupt) -> Path | None:
    """The result of the stage ``stop`` interrupted, when it was on disk already (None: it was not)."""
    return getattr(stop, STORED, None)


def stored_result(root: Path, protocol: str, run_id: str) -> Callable[[], Path | None]:
    """Where the result of run ``run_id`` lies once stored (a file named ``seed<S>-<run_id>.json`` under
    the protocol's folder), looked up on disk when asked: None while it is not there."""
    def find() -> Path | None:
        folder = root / "runs" / protocol
        found = sorted(folder.rglob(f"seed*-{run_id}.json")) if folder.is_dir() else []
        return found[0] if found else None
    return find


@contextmanager
def stage(what: str | None, savers: Sequence[Checkpointer] = (),
          stored: Callable[[], Path | None] = lambda: None) -> Iterator[None]:
    """Run a stage that stores ``stored()`` when it ends and checkpoints with ``savers``. A stop inside it
    that no inner stage noted gets the note of what is on disk now (``what``: "training the joint reference
    of P (seed 0)"; None: a step that only stores, whose stop the stage around it describes). A stop after
    its result was stored records that result; the note then comes from the stage around it (a reference
    stored is not the run asked for), or, for the outermost stage, says the result is stored."""
    _open[0] += 1
    try:
        yield
    except KeyboardInterrupt as stop:
        path = stored()
        if path is not None:
            record_stored(path)
        if stop_note(stop) is None and path is not None and _open[0] == 1:
            setattr(stop, STORED, path)
            note_stop(stop, after_stored(path))
        elif stop_note(stop) is None and path is None and what is not None:
            note_stop(stop, unfinished(what, savers))
        raise
    finally:
        _open[0] -= 1


def after_stored(path: Path, rest: str = "nothing needs to train again.") -> str:
    """The note of a stop that came after the stage's result was stored."""
    return f"Interrupted after the result was stored ({path}): it is complete, and {rest}"


def unfinished(what: str, savers: Sequence[Checkpointer]) -> str:
    """The note of a stop while ``what`` was computing: the checkpoints a rerun resumes from, or none."""
    saved = [str(path) for saver in savers for path in (saver.path, saver.mid_path) if path.is_file()]
    if saved:
        kept = (f"Its checkpoint{'s' if len(saved) > 1 else ''} ({', '.join(saved)}) "
                f"{'are' if len(saved) > 1 else 'is'} kept: running the same command again resumes from "
                f"{'them' if len(saved) > 1 else 'it'} (--restart starts over).")
    elif savers:
        kept = "No checkpoint of it was saved yet, so running the same command again starts it over."
    else:
        kept = "Running the same command again starts it over."
    return f"Interrupted while {what}, before it was stored. {kept} {earlier()}"


def earlier() -> str:
    """What this process stored before the stop, which stays."""
    if not _stored_here:
        return "This command stored no result before the stop."
    last = _stored_here[-1]
    if len(_stored_here) == 1:
        return f"The result it stored before the stop is kept ({last})."
    return f"The {len(_stored_here)} results it stored before the stop are kept (the last: {last})."


def interrupted() -> str:
    """The note of a stop that no stage described (one between stages, or in a command's own work)."""
    return (f"Interrupted. {earlier()} Running the same command again goes on from there: an unfinished run "
            f"resumes from its last checkpoint, or starts over where it saved none.")
