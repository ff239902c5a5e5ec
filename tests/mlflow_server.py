"""A real `mlflow server` for the tests: sqlite backend, proxied artifacts, a free local port, its own process
group. tests/conftest.py's session fixture `mlflow_server` shares one across the session; the outage tests
(tests/stages/test_tracking_server.py) stop and restart their own.

    srv = Server(tmp_dir, free_port()); srv.start()   # ~6-10 s on 2 cores: MLflow import, sqlite schema, uvicorn
    srv.uri  → "http://127.0.0.1:41234";  srv.stop()   # kills the whole group (uvicorn workers included)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` in its own process group (it spawns uvicorn workers): stop kills the whole group."""

    def __init__(self, root: Path, port: int, db: Path | None = None):
        """A server of `db` (default: a new root/server.db): e.g. a copy of a pipeline's own sqlite store, whose
        runs' file:// artifact locations the server then reads as they are."""
        self.root, self.port, self.proc = root, port, None
        self.db = db or root / "server.db"
        self.uri = f"http://127.0.0.1:{port}"

    def start(self, timeout_s: float = 120.0) -> None:
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
        env.pop("MLFLOW_TRACKING_URI", None)
        log = open(self.root / "server.log", "a")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{self.db}",
             "--artifacts-destination", str(self.root / "server-artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=1).read()
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"mlflow server not healthy after {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


def stop_group(pid: int) -> None:
    """Kill the process group `pid` leads (a server started by an xdist worker) if it is still an `mlflow server`;
    gone already is fine."""
    try:
        if b"mlflow" in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.killpg(pid, signal.SIGKILL)
    except (FileNotFoundError, ProcessLookupError):
        pass
