"""`python -m bench_stability_gap.harness.cli ...` as a process of its own, forked from a server process that
has already imported what the runs import (the harness, torch, torchvision, timm, and peft for SGM's LoRA),
instead of started cold: about 5 s of CPU a process on a 2-core machine, where a reduced run trains in a few.

The child is a real process: its own pid, memory, file locks, signals, exit status and output pipes, and it exits
as the command line does (``cli.entry``: the atexit handlers, then the process ends); it runs the CLI module as
``python -m`` does, with the caller's environment (``PYTHONUNBUFFERED`` included) and folder. What differs from a
cold start is only what happens before the CLI module runs: the modules above are already imported, under the
server's environment and the CLI's import-time defaults (offline hub, passive OpenMP wait). Tests of start-up
itself (import order, variables read at import such as ``OMP_NUM_THREADS`` or ``PYTHONPATH``, the answer given
before anything heavy is imported) start a fresh interpreter instead.

The server is one per test process (an xdist worker), started on first use and stopped at its exit; it
never computes, so forking it is safe (no thread pool has started), and it forks nothing but these children.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

CLI = "bench_stability_gap.harness.cli"
PRELOAD = (CLI, "torch", "torchvision", "timm", "peft")  # the CLI first: it sets its defaults before torch loads
START_TIMEOUT_S = 120

SERVER = r"""
import gc, importlib, io, json, os, runpy, select, socket, sys
for name in sys.argv[2].split(","):
    importlib.import_module(name)
gc.freeze()  # a child's collections never walk what every child inherits (and leave its pages shared)
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(sys.argv[1])
listener.listen(64)
print("ready", flush=True)
waiting = {}  # child pid -> the connection its exit status goes back on (None: the caller hung up)
parent = os.getppid()  # the test process: when it is gone (killed), so is the server


def child(request, fds):
    listener.close()
    for conn in waiting.values():
        if conn is not None:
            conn.close()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in set(fds):
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    if os.environ.get("PYTHONUNBUFFERED"):  # read at start-up: the streams a fresh interpreter would open
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=sys.stdout.encoding,
                                      errors=sys.stdout.errors, write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=sys.stderr.encoding,
                                      errors=sys.stderr.errors, write_through=True)
    os.chdir(request["cwd"])
    sys.argv = [request["argv0"], *request["args"]]
    sys.modules.pop(request["module"], None)  # as under `python -m`: the module runs once, as __main__
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)  # not reached: the module's entry ends the process


while os.getppid() == parent:
    # a child's exit is looked for every 50 ms while one runs; idle, once a second (is the test process gone?)
    ready, _, _ = select.select([listener, *(c for c in waiting.values() if c is not None)], [], [],
                                0.05 if waiting else 1.0)
    for conn in ready:
        if conn is listener:
            caller, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(caller, 1 << 20, 3)
            pid = os.fork()
            if pid == 0:
                caller.close()
                child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            caller.sendall(f"{pid}\n".encode())
            waiting[pid] = caller
        elif not conn.recv(1):  # the caller hung up: its child's status has nobody to go to
            waiting.update({p: None for p, c in waiting.items() if c is conn})
            conn.close()
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()
"""


class WarmProcess:
    """The part of ``subprocess.Popen`` the tests use, for a child of the server."""

    def __init__(self, conn: socket.socket, args: list[str], stdout, stderr) -> None:
        self.args, self._conn, self.stdout, self.stderr = args, conn, stdout, stderr
        self._buffer = b""
        self.pid = int(self._line(None))
        self.returncode: int | None = None

    def _line(self, timeout: float | None) -> str:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                got = self._conn.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            if not got:
                raise RuntimeError("the warm CLI server went away before reporting the child's exit")
            self._buffer += got
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout))
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0.001)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Both pipes read to their end (side by side, so neither fills), then the exit status."""
        out: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=name, f=f: out.__setitem__(n, f.read()), daemon=True)
                   for name, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
        for r in readers:
            r.start()
        self.wait(timeout)
        for r in readers:
            r.join(timeout)
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return out.get("stdout"), out.get("stderr")


class WarmCli:
    """Starts ``python -m bench_stability_gap.harness.cli ARGS`` children from one pre-imported server."""

    def __init__(self) -> None:
        self._folder = tempfile.mkdtemp(prefix="bench-warm-")  # short: a unix socket's path is limited
        self._path = str(Path(self._folder) / "cli.sock")
        self._server: subprocess.Popen | None = None
        self._lock = threading.Lock()
        atexit.register(self.close)  # a server outlives no test process, fixture or not

    def _ensure(self) -> None:
        with self._lock:
            if self._server is not None and self._server.poll() is None:
                return
            env = {k: v for k, v in os.environ.items() if k not in ("BENCH_KILL_AT",)}
            self._server = subprocess.Popen([sys.executable, "-c", SERVER, self._path, ",".join(PRELOAD)],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, env=env, text=True)
            line = _read_line(self._server, START_TIMEOUT_S)
            if line.strip() != "ready":
                raise RuntimeError(f"the warm CLI server did not start (said {line!r})")

    def popen(self, args: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None,
              merge_stderr: bool = False) -> WarmProcess:
        """``bench ARGS`` started in a forked child; text pipes for stdout and stderr (stderr into stdout
        with ``merge_stderr``)."""
        self._ensure()
        out_r, out_w = os.pipe()
        err_r, err_w = (out_r, out_w) if merge_stderr else os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        request = {"module": CLI, "argv0": sys.executable, "args": list(args),
                   "env": dict(os.environ if env is None else env), "cwd": str(cwd or os.getcwd())}
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._path)
            socket.send_fds(conn, [json.dumps(request).encode()], [null, out_w, err_w])
        finally:
            for fd in {null, out_w, err_w}:
                os.close(fd)
        stdout = os.fdopen(out_r, "r")
        stderr = None if merge_stderr else os.fdopen(err_r, "r")
        return WarmProcess(conn, [CLI, *args], stdout, stderr)

    def run(self, args: list[str], env: dict[str, str] | None = None, timeout: float | None = None,
            cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """``subprocess.run`` with ``capture_output=True, text=True``, for ``bench ARGS`` in a forked child."""
        proc = self.popen(args, env, cwd)
        try:
            out, err = proc.communicate(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.kill()
            self._server.wait()
        shutil.rmtree(self._folder, ignore_errors=True)  # its socket, once the server is gone


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return box[0] if box else ""
