"""One process computes a given phase of a given run at a time: a second identical command waits for the
first and then reuses what it stored, instead of doing all the work again.

A claim is an OS file lock (``flock``) on ``<checkpoint>.lock``, keyed like the phase's checkpoint by
everything that decides its numbers. The kernel drops the lock when its process dies however it dies
(SIGKILL, OOM killer, power loss of a node), so a lock left by a killed process is never waited on: the
next claimant takes it and resumes from the checkpoint the dead one left. Who holds a claim (pid, host,
since when, command) is written beside it, so a waiting or refused command can name the holder.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import BenchError
from ..results.read_once import forget

POLL_S = 0.5


def _holder_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".holder")


def describe_holder(lock: Path) -> str:
    """The process holding ``lock``, as its holder file says (it may not be written yet: a claim is only
    just taken)."""
    try:
        info = json.loads(_holder_path(lock).read_text())
    except (OSError, ValueError):
        return "another bench process (it has just started)"
    return (f"bench process {info.get('pid')} on {info.get('host')} since {info.get('since')} "
            f"({info.get('command', '')[:200]})")


@contextmanager
def claim(lock: Path, what: str, wait: bool, say: Callable[[str], None]) -> Iterator[bool]:
    """Hold ``lock`` for the block; yields whether another process held it first (then what it stored
    may now be there to reuse). ``wait=False``: refuse at once, naming the holder, instead of waiting."""
    from filelock import FileLock, Timeout

    lock.parent.mkdir(parents=True, exist_ok=True)
    held = FileLock(str(lock))
    waited = False
    try:
        held.acquire(timeout=0)
    except Timeout:
        holder = describe_holder(lock)
        if not wait:
            raise BenchError(f"{what} is being computed right now by {holder} (lock {lock}); --no-wait was given, so "
                             f"nothing ran. Run the same command without --no-wait to wait for it and reuse its "
                             f"result.") from None
        say(f"{what} is being computed by {holder}: waiting for it, then reusing what it stores.")
        held.acquire(poll_interval=POLL_S)
        waited = True
        forget()  # the holder may have stored results meanwhile: parse the folder afresh
    holder_file = _holder_path(lock)
    try:
        holder_file.write_text(json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)}))
    except OSError:
        pass  # naming the holder is a courtesy; the lock itself is what keeps the work single
    try:
        yield waited
    finally:
        holder_file.unlink(missing_ok=True)
        held.release()
