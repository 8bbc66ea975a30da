"""Run ``tiered serve`` as a real subprocess for black-box tests."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

from tests.support.deadlines import Deadline, scaled
from tests.support.s3_ops import tiered_command


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A ``tiered serve`` child process on a free loopback port."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.args = list(args)
        self.env = env or {}
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        cmd = [
            *tiered_command(),  # the session records the S3 operations it makes (s3_ops.py)
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.env}, start_new_session=True
        )
        deadline = Deadline(timeout)  # for an idle machine: stretched by the load (deadlines.py)
        while not deadline.expired():
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(
                    self.url + "/healthz", timeout=1, context=self.ssl_context()
                ) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.kill()  # not left running behind the failure: nobody would stop it
        raise RuntimeError(f"server did not come up within {deadline}:\n{self.log()}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """How to trust the server's certificate (plain HTTP: none needed)."""
        return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: no flush, no snapshot, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(scaled(20))
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode
