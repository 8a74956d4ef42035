"""Atomic file writes: a reader (or a Ctrl-C) never sees half a file, a full disk never leaves one, and
files get the permissions the user's umask gives (a team's shared results folder stays readable).

A storage fault (full disk or quota, read-only file system, I/O error) at any write is a state, not a
crash: it becomes a ``StorageFault``, one paragraph saying what failed, where, what was kept and how to
continue, with its own exit code (``STORAGE_EXIT``), so a script can tell "free space and rerun" apart
from bad input (exit 2)."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import BenchError

STORAGE_EXIT = 75  # sysexits' EX_TEMPFAIL: a temporary failure, the same command succeeds once it is fixed
FAULT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG}
CONTINUE = ("Free space (or make the folder writable again) and run the same command: it resumes from what "
            "was kept, and gives the numbers an uninterrupted run gives.")


class StorageFault(BenchError):
    """A write failed for lack of space, a read-only file system or an I/O error; nothing computed and
    already stored is lost. The CLI prints the message and exits with ``STORAGE_EXIT``."""

    exit_code = STORAGE_EXIT


def storage_error(exc: BaseException) -> OSError | None:
    """The storage fault behind ``exc``, if any: libraries wrap the OSError of a failed write in their own
    errors (torch.save raises a RuntimeError from its zip writer), so the whole chain is searched."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if isinstance(link, OSError) and link.errno in FAULT_ERRNOS:
            return link
        link = link.__cause__ or link.__context__
    return None


def fault_message(err: OSError, what: str, path: Path | str | None, kept: str, then: str = CONTINUE) -> str:
    """The paragraph of a storage fault: what failed, where, what was kept, how to continue (``then``:
    where rerunning does not resume, the advice that is true instead)."""
    where = path or err.filename or "its folder"
    return f"Could not write {what} to {where}: {err.strerror or err}. {kept} {then}"


def umask() -> int:
    """The process umask (reading it means setting it: restore at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[IO[bytes]], object], durable: bool = True, what: str | None = None,
                 kept: str = "The file there before, if any, is unchanged.", then: str = CONTINUE) -> None:
    """Write through a temporary file in the same folder, fsync (when ``durable``), then rename over ``path``.

    ``durable=False`` skips the fsync: for files a process kill cannot tear (the page cache survives it)
    and whose loss in a machine crash only costs time (checkpoints: an unreadable one is set aside).

    mkstemp creates its file 0600; it is widened to what ``open`` would give (0666 minus the umask)
    before the rename, so results and caches are as shareable as any other file the user writes.
    On any failure (a full disk included) the temporary file is removed and ``path`` is unchanged; a storage
    fault is raised as a ``StorageFault`` naming ``what`` (default: the file's name) and ``kept``.
    """
    try:
        _write_replace(path, write, durable)
    except Exception as exc:
        fault = storage_error(exc)
        if fault is None:
            raise
        raise StorageFault(fault_message(fault, what or path.name, path, kept, then)) from None


def _write_replace(path: Path, write: Callable[[IO[bytes]], object], durable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        stop = _interrupt_behind(exc)
        if stop is not None and stop is not exc:
            raise stop from None
        raise


def _interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM that ``exc`` arose from, when a writer's clean-up failed because of it (torch's
    zip writer, stopped mid-write, raises a RuntimeError from its own clean-up): the stop is what happened,
    and the CLI turns it into exit 130/143 and the resume note, not a traceback."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return link
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return None


def atomic_write_text(path: Path, text: str, what: str | None = None) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode()), what=what)


def rescue_folder() -> Path:
    """Where a result goes when its own folder cannot take it: the system temporary folder."""
    return Path(tempfile.gettempdir()) / "bench-unsaved"


def write_or_rescue(path: Path, text: str, what: str) -> Path:
    """Write ``text`` to ``path`` atomically; when that fails (full disk, folder gone read-only), write it
    to ``rescue_folder()`` instead and raise a StorageFault that says where it is, so the computed
    result is kept. When no copy can be written, the error says exactly what was lost."""
    try:
        _write_replace(path, lambda fh: fh.write(text.encode()), durable=True)
        return path
    except OSError as exc:
        problem = f"Could not write {what} to {path}: {exc.strerror or exc}."
    rescue = rescue_folder() / path.name
    try:
        _write_replace(rescue, lambda fh: fh.write(text.encode()), durable=True)
    except OSError as exc:
        raise StorageFault(f"{problem} No copy could be written to {rescue} either ({exc.strerror or exc}): "
                           f"{what} is lost; nothing else was changed, and the run's last checkpoint is kept. "
                           f"{CONTINUE}") from None
    raise StorageFault(f"{problem} It was saved to {rescue} instead, and the run's last checkpoint is kept. Either "
                       f"move the saved copy to {path} (or into any results folder's runs/), or free space and "
                       f"run the same command again (it resumes from the checkpoint and writes the result in "
                       f"place); not both, or the run is stored twice.") from None


def move_aside(path: Path, why: str = "corrupt") -> Path:
    """Rename a file or folder next to itself as ``NAME.WHY-TIME``, never read again: one that failed to
    load (kept for a post-mortem) or one a new version replaces. The name is one no earlier copy took, so
    a second failure or replacement never overwrites the first's."""
    stamp, n = time.strftime("%Y%m%d-%H%M%S"), 0
    while (aside := path.with_name(f"{path.name}.{why}-{stamp}" + (f"-{n}" if n else ""))).exists() \
            or aside.is_symlink():
        n += 1
    os.replace(path, aside)
    return aside


def check_writable_folder(path: Path, what: str, min_free: int) -> None:
    """``path`` is (or can become) a folder this process can write to, with ``min_free`` bytes free.
    Probed by writing and syncing a small file, which catches read-only mounts that permission bits
    do not show."""
    try:
        if path.exists() and not path.is_dir():
            kind = "a file" if path.is_file() else "a device, socket or pipe"
            raise BenchError(f"The {what} {path} exists but is {kind}, not a folder; pass another path.")
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".bench-write-probe.", dir=path)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise BenchError(f"The {what} {path} is not writable ({exc.strerror or exc}); nothing has run. "
                         f"Fix its permissions or pass another path.") from None
    free = shutil.disk_usage(path).free
    if free < min_free:
        raise BenchError(f"The {what} {path} has {free / 2**20:.0f} MiB free; a run needs at least "
                         f"{min_free / 2**20:.0f} MiB there. Free some space or pass another path; nothing has run.")
