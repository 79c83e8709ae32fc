"""A local redis-server for `fleet run` on one machine (and for tests): loopback, free port.

Append-only persistence in the given directory, so a crash of `fleet run` loses no queue
state; noeviction, so Redis never drops a message under memory pressure.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from fleet.errors import BrokerMissing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalRedis:
    def __init__(self, directory: Path, port: int | None = None, persist: bool = True,
                 password: str | None = None, extra_args: list[str] | None = None, conf: Path | None = None):
        binary = shutil.which("redis-server")
        if binary is None:
            raise BrokerMissing(
                "no broker URL is set and redis-server is not installed: install the "
                "'redis-server' package (apt-get install redis-server) or set FLEET_BROKER_URL"
            )
        self.binary = binary
        self.dir = Path(directory).resolve()
        self.port = port or free_port()
        self.persist = persist
        self.password = password
        self.extra_args = extra_args or []
        #: a redis.conf to start from (port, bind and dir stay ours; it keeps its persistence)
        self.conf = conf
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_connect_timeout=0.5)

    def argv(self) -> list[str]:
        argv = [self.binary] + ([str(self.conf)] if self.conf else [])
        argv += ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                 "--daemonize", "no", "--loglevel", "warning"]
        if self.conf is None:
            argv += ["--save", "", "--appendonly", "yes" if self.persist else "no", "--appendfsync", "everysec",
                     "--maxmemory-policy", "noeviction"]
        argv += self.extra_args
        if self.password:
            argv += ["--requirepass", self.password]
        return argv

    def start(self, timeout_s: float = 10) -> LocalRedis:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerMissing(f"redis-server exited at start; see {self.dir / 'redis.log'}")
            try:
                pid = int(client.info("server")["process_id"])
            except redis.ConnectionError:
                time.sleep(0.05)
                continue
            client.close()
            if pid != self.proc.pid:  # another server already holds the port
                self.stop()
                raise BrokerMissing(f"port {self.port} is taken by another Redis (pid {pid})")
            return self
        self.stop()
        raise BrokerMissing(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LocalRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
