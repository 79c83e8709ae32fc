"""A real redis-server for tests: a free loopback port, no persistence, stopped after.

Self-contained on purpose (no fleet imports) so it can become a shared fixture.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

START_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisProc:
    """`with RedisProc(password="pw") as r: r.url` -> a running redis-server.

    `conf`: a redis.conf to start from (port, bind and dir are still the test's own).
    """

    def __init__(
        self, password: str | None = None, extra_args: list[str] | None = None, conf: Path | None = None
    ) -> None:
        self.password = password
        self.extra_args = extra_args or []
        self.conf = conf
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def start(self) -> RedisProc:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self._dir = tempfile.TemporaryDirectory(prefix="redisproc-")
        self.port = free_port()
        argv = [exe] + ([str(self.conf)] if self.conf else [])
        argv += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", self._dir.name]
        if self.conf is None:
            # A bare test server: nothing written to disk. A conf under test keeps its own.
            argv += ["--save", "", "--appendonly", "no"]
        argv += self.extra_args
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"redis-server exited {self.proc.returncode}: {err}")
            try:
                if self.client().ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()
        self.proc = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> RedisProc:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
