"""Atomic file writes: a reader (or a Ctrl-C) never sees half a file, a full disk never leaves one, and
files get the permissions the user's umask gives (a team's shared results folder stays readable)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .errors import BenchError


def _umask() -> int:
    """The process umask (reading it means setting it: restore at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through a temporary file in the same folder, fsync, then rename over ``path``.

    mkstemp creates its file 0600; it is widened to what ``open`` would give (0666 minus the umask)
    before the rename, so results and caches are as shareable as any other file the user writes.
    On any failure (a full disk included) the temporary file is removed and ``path`` is unchanged.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode()))


def rescue_folder() -> Path:
    """Where a result goes when its own folder cannot take it: the system temporary folder."""
    return Path(tempfile.gettempdir()) / "bench-unsaved"


def write_or_rescue(path: Path, text: str, what: str) -> Path:
    """Write ``text`` to ``path`` atomically; when that fails (full disk, folder gone read-only), write it
    to ``rescue_folder()`` instead and raise a BenchError that says where it is, so the computed
    result is kept. When no copy can be written, the error says exactly what was lost."""
    try:
        atomic_write_text(path, text)
        return path
    except OSError as exc:
        problem = f"Could not write {what} to {path}: {exc.strerror or exc}."
    rescue = rescue_folder() / path.name
    try:
        atomic_write_text(rescue, text)
    except OSError as exc:
        raise BenchError(f"{problem} No copy could be written to {rescue} either ({exc.strerror or exc}): "
                         f"{what} is lost; nothing else was changed. Free space or fix the folder and "
                         f"run it again.") from None
    raise BenchError(f"{problem} It was saved to {rescue} instead; move it to {path} (or into any results "
                     f"folder's runs/) to keep it.") from None
