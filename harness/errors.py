"""User-facing errors: one clear paragraph, exit code 2, no traceback."""

from __future__ import annotations

import difflib
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

LONGEST_SHOWN = 160  # characters of one unbroken value (a name, a path) an error message shows


class BenchError(Exception):
    """Bad input the user can fix: the CLI prints the message and exits with code 2. The message is
    ``shorten``-ed: a refusal echoes what the user gave, and a value of thousands of characters is cut where
    it is echoed, so one paragraph stays one paragraph, in the CLI and the Python API alike."""

    exit_code = 2

    def __init__(self, *args: object) -> None:
        super().__init__(*(shorten(a) if isinstance(a, str) else a for a in args))


class MethodFault(BenchError):
    """A run's method raised an exception in one of its hooks, or returned what breaks its contract: the
    method is the user's input, so the run ends as bad input does (one paragraph, exit 2), with what the
    method raised chained as ``__cause__`` for the Python API."""


def did_you_mean(value: str, choices: Iterable[str], what: str, plural: str | None = None) -> BenchError:
    """An 'unknown X' error that names the nearest valid choices (lm-eval-harness style); ``plural``
    where adding an s to ``what`` is wrong ("protocols with results")."""
    choices = sorted(choices)
    close = difflib.get_close_matches(value, choices, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return BenchError(f"Unknown {what} {value!r}.{hint} Known {plural or what + 's'}: {', '.join(choices)}.")


def only_with(options: list[str], condition: str) -> str:
    """"--a applies to X only" / "--a and --b apply to X only": the refusal of options given without the one
    they belong to, which would otherwise be ignored."""
    return f"{' and '.join(options)} {'apply' if len(options) > 1 else 'applies'} to {condition} only"


def shorten(message: str, limit: int = LONGEST_SHOWN) -> str:
    """``message`` with every echoed value longer than ``limit`` cut in the middle, its length said, so one
    paragraph stays one paragraph: a quoted value (``'...'`` or ``"..."`` as ``!r`` writes it, spaces and
    all: a 5,000-character method string of words) and every unbroken run of characters (a long name, a
    pasted file). A quote counts as one only where it opens and closes a value, not inside a word (the
    apostrophe of "method's"), so prose is never cut."""
    def cut(text: str) -> str:
        return f"{text[: limit * 2 // 3]}...{text[-limit // 4:]} [{len(text):,} characters]"

    def cut_quoted(match: re.Match) -> str:
        quote, value = match.group(1), match.group(2)
        return f"{quote}{value[: limit * 2 // 3]}...{value[-limit // 4:]}{quote} [{len(value):,} characters]"

    quoted = r"""(?<!\w)(['"])((?:(?!\1)[^\n]){%d,})\1(?!\w)""" % (limit + 1)
    return re.sub(r"\S{%d,}" % (limit + 1), lambda m: cut(m.group(0)), re.sub(quoted, cut_quoted, message))


MISSING = "does not exist"  # not_a_file's answer for a path with nothing there, which some callers allow


def not_a_file(path: Path) -> str | None:
    """Why ``path`` cannot be read as a regular file (None when it can): missing, a folder, a device or
    pipe, or a name the system refuses, so an error says what is there instead of "does not exist"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return MISSING
    except OSError as exc:
        return f"cannot be used ({exc.strerror or exc})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kind = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    return f"exists but is {kind}, not a regular file"


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path``, or one BenchError that begins with ``what`` and says why it cannot be read:
    nothing there, a folder or device, or a read the system refuses (permissions, a file that fails to read)."""
    if (problem := not_a_file(path)) is not None:
        raise BenchError(f"{what} {path} {problem}.")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BenchError(f"{what} {path} cannot be read ({exc.strerror or exc}).") from None


def without_foreign_page(message: str) -> str:
    """An MLflow client error without the web page a server that is not MLflow answered with (its HTML
    would fill the terminal): the page is replaced by what it means."""
    head, marker, body = message.partition("Response body:")
    if marker and re.search(r"<\s*(!doctype|html|head|body)\b", body, re.IGNORECASE):
        return (f"{head.strip()} The server answered with a web page, not MLflow's API: is the URI an MLflow "
                f"tracking server (mlflow server), with its path?")
    return message


def note_stop(stop: KeyboardInterrupt, note: str) -> None:
    """Give a Ctrl-C or SIGTERM that came after the work was stored the note the CLI prints for it, in place of
    'nothing was written' (an attribute: exception notes are Python 3.11's, and bench runs on 3.10)."""
    stop.bench_note = note  # type: ignore[attr-defined]


def stop_note(stop: KeyboardInterrupt) -> str | None:
    """The note ``note_stop`` gave ``stop``, if any."""
    return getattr(stop, "bench_note", None)
