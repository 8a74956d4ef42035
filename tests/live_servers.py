"""Servers the tests start on 127.0.0.1 (an `mlflow server`), bounded in time and stopped by the fixture
that started them (their own process trees, never anything else on the machine)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 180  # a node or the server must be up within this


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, what: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None):
    """Poll ``check`` until it returns something truthy; fail (with the log) on timeout or if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited ({proc.returncode}):\n{log.read_text() if log else ''}")
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {timeout} s\n{log.read_text()[-3000:] if log else ''}")


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """In a session of its own, so that stopping it reaches its whole process group."""
    return subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    """SIGTERM each started process's group, then SIGKILL whatever of their process trees is left after
    ``grace`` seconds."""
    tree = []
    for proc in procs:
        try:
            root = psutil.Process(proc.pid)
            tree += [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            pass
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _, alive = psutil.wait_procs(tree, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=10)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, mlflow_template):
    """`mlflow server` with a sqlite backend and an artifact root, as docs/user-guide.md ("A team tracking
    server") documents it. Its store starts as a copy of the suite's migrated empty store, so the server skips
    MLflow's migrations (about 20 s on a shared 2-core machine) and starts in a few seconds."""
    import shutil

    root = tmp_path_factory.mktemp("mlflow-server")
    shutil.copyfile(mlflow_template, root / "mlflow.db")
    port, log = free_port(), root / "server.log"
    proc = start([str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                  "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1", "--port", str(port),
                  "--workers", "1"],
                 # without MLflow's job runner (its GenAI jobs): five huey consumer processes that bench never
                 # uses, each importing MLflow at the start and polling for work while the server lives
                 {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                 log)
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    try:
        wait_for(healthy, "mlflow server", START_TIMEOUT_S, proc, log)
        yield uri
    finally:
        stop([proc])
