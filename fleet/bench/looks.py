"""What looks at the fleet beside the control-plane bench's simulated workers (issue 48): the job
exporter (a real `fleet job-metrics`, its /metrics scraped over HTTP as Prometheus would) and a real
Flower (`fleet flower`, its workers page refreshed, which sends Celery's inspect broadcasts), with the
broker's connections sampled and its slow log read: what the looks cost the broker and whether they
hold it. Both are processes of their own, as in a fleet: the bench's probe (a worker's renewals) runs
in the driver, and an exporter computing in the driver's process held the probe's thread behind its
GIL (a renewal p99 of 113 ms at 1,000 x K=128, where the probe's median was 2.2 ms).

The simulated workers send Celery's worker-heartbeat events (fleet.bench.simfleet), so Flower
tracks them; they do not answer inspect broadcasts (no remote-control consumer), so each refresh
costs the broadcast and Flower's wait for replies, not a thousand replies.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, BinaryIO

import redis

from fleet.bench.procs import clean_env
from fleet.coord.localredis import free_port

#: a command the slow log keeps: over this many microseconds
SLOW_US = 5000
#: what a look over HTTP raises when the process behind it is away or answers half (counted, never fatal)
HTTP_FAILED = (OSError, ValueError, http.client.HTTPException)


class Looks:
    """The job exporter and Flower beside the fleet, from `__enter__` to `__exit__`."""

    def __init__(self, broker: Any, store_url: str, queue: str, workdir: Path, scrape_s: float, inspect_s: float,
                 flower: bool = True):  # fmt: skip
        self.broker, self.scrape_s, self.inspect_s = broker, scrape_s, inspect_s
        self.stop = threading.Event()
        self.scrapes: list[float] = []
        self.scrape_errors = 0
        self.refreshes: list[float] = []
        self.refresh_errors = 0
        self.peak_connections = 0
        self.flower: subprocess.Popen[bytes] | None = None
        self.port, self.exporter_port = free_port(), free_port()
        self.logs: list[BinaryIO] = []
        # Flower's HTTP API answers only with auth or this switch; both listen on loopback only
        env = clean_env(workdir, {"FLEET_BROKER_URL": broker.url, "FLEET_STORE_URL": store_url, "FLEET_QUEUE": queue,
                                  "FLOWER_UNAUTHENTICATED_API": "true"})
        self.exporter = self._serve(workdir, env, "job-metrics", self.exporter_port)
        try:
            if flower:
                self.flower = self._serve(workdir, env, "flower", self.port)
        except BaseException:
            self.close()
            raise
        self.threads = [threading.Thread(target=self._scrape, daemon=True),
                        threading.Thread(target=self._connections, daemon=True)]
        if flower:
            self.threads.append(threading.Thread(target=self._refresh, daemon=True))

    def _serve(self, workdir: Path, env: dict[str, str], command: str, port: int) -> subprocess.Popen[bytes]:
        """`fleet <command>` listening on loopback `port`, its output in `<command>.log`."""
        log = open(workdir / f"{command}.log", "wb")  # noqa: SIM115 - lives as long as the process
        self.logs.append(log)
        return subprocess.Popen([sys.executable, "-m", "fleet", command, "--address", "127.0.0.1", "--port", str(port)],
                                env=env, stdout=log, stderr=log, cwd=workdir)

    def _get(self, path: str, timeout_s: float = 60.0) -> Any:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout_s) as reply:
            return json.loads(reply.read() or b"null")

    def _metrics(self, timeout_s: float = 60.0) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.exporter_port}/metrics", timeout=timeout_s) as reply:
            return reply.read()

    def exporter_ready(self, timeout_s: float = 60.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.exporter.poll() is None:
            with contextlib.suppress(*HTTP_FAILED):
                self._metrics(5)
                return True
            time.sleep(0.5)
        return False

    def flower_ready(self, timeout_s: float = 60.0) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.flower is not None and self.flower.poll() is None:
            with contextlib.suppress(*HTTP_FAILED):
                self._get("/api/workers?status=1", 5)
                return True
            time.sleep(1)
        return False

    def _scrape(self) -> None:
        """Prometheus's scrapes of the job exporter (its collector computes at most every CACHE_S)."""
        while not self.stop.wait(self.scrape_s):
            began = time.monotonic()
            try:
                body = self._metrics()
            except HTTP_FAILED:  # the broker restarts under it: counted, the next scrape tries
                self.scrape_errors += 1
                continue
            if b"fleet_job_chunks{" not in body:  # a figure of the job, not only the family's HELP
                self.scrape_errors += 1
                continue
            self.scrapes.append(time.monotonic() - began)

    def _refresh(self) -> None:
        """A person on Flower's workers page pressing refresh: Flower's inspect broadcasts."""
        while not self.stop.wait(self.inspect_s):
            began = time.monotonic()
            try:
                self._get("/api/workers?refresh=1")
            except HTTP_FAILED:
                self.refresh_errors += 1
                continue
            self.refreshes.append(time.monotonic() - began)

    def _connections(self) -> None:
        while not self.stop.wait(0.5):
            with contextlib.suppress(redis.RedisError):
                self.peak_connections = max(self.peak_connections,
                                            int(self.broker.admin.info("clients")["connected_clients"]))

    def slowlog_reset(self) -> None:
        self.broker.admin.config_set("slowlog-log-slower-than", SLOW_US)
        self.broker.admin.config_set("slowlog-max-len", 10_000)
        self.broker.admin.slowlog_reset()

    def slowlog(self) -> dict[str, Any]:
        """Commands that held the broker over SLOW_US since the reset, and the longest."""
        entries = self.broker.admin.slowlog_get(10_000)
        longest = max(entries, key=lambda e: e["duration"], default=None)
        return {"over_ms": SLOW_US / 1000, "count": len(entries),
                "longest_ms": round(longest["duration"] / 1000, 2) if longest else 0.0,
                "longest": " ".join(str(longest["command"], "utf-8", "replace").split()[:2]) if longest else "",
                "client": str(longest.get("client_name") or b"", "utf-8", "replace") if longest else ""}

    def __enter__(self) -> Looks:
        try:
            if not self.exporter_ready():
                raise RuntimeError("fleet job-metrics did not answer; see job-metrics.log in the work directory")
            if self.flower is not None and not self.flower_ready():
                raise RuntimeError("Flower did not answer; see flower.log in the work directory")
        except BaseException:  # the processes started go with the error
            self.close()
            raise
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(90)

    def flower_workers(self) -> int:
        """Workers Flower knows from their events."""
        try:
            return len(self._get("/api/workers?status=1") or {})
        except HTTP_FAILED:
            return -1

    def close(self) -> dict[str, Any]:
        known = self.flower_workers() if self.flower is not None else None
        for proc in (self.exporter, self.flower):
            if proc is None:
                continue
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()
        return {"scrapes": len(self.scrapes), "scrape_errors": self.scrape_errors,
                "scrape_s_max": round(max(self.scrapes, default=0.0), 3),
                "flower": self.flower is not None, "flower_workers": known,
                "refreshes": len(self.refreshes), "refresh_errors": self.refresh_errors,
                "refresh_s_max": round(max(self.refreshes, default=0.0), 2),
                "peak_connections": self.peak_connections}
