"""A worker process's start as its own clock sees it (docs/architecture.md, "A worker's start").

A GPU is paid from its process's birth, so the clock counts from the kernel's record of it (the
interpreter and the imports count), not from the first line fleet runs. Points along the way
(`POINTS`, in the order they come) go to the `fleet_worker_start_seconds` gauge as seconds since
birth; birth to engine ready is the engine start a restart costs (recorded in the broker for
`fleet status`, fleet.coord.enginestarts), engine ready to the first token what follows it. Each
run's first token after its chunk's delivery goes to a histogram: the wait a lease buys.
"""

from __future__ import annotations

import os
import threading
import time

from fleet import metrics

#: where a worker's start stands, in order: its main module runs, its engine begins to start (before
#: Celery loads: fleet.worker.main; an engine that does not start early, vLLM's, begins after `runtime`),
#: fleet and Celery imported with the settings, Celery's worker set up (fleet's runtime begins), the engine
#: ready, Celery consuming, the first token of any run
POINTS = ("main", "engine_begun", "imported", "runtime", "engine_ready", "consuming", "first_token")


def process_birth() -> float:
    """Unix time this process was born, to the kernel's tick (Linux: its start in ticks since boot,
    against the boot clock now); elsewhere now."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime; the split drops the first two (pid, comm)
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()
    return time.time() - max(0.0, age)


class StartClock:
    """One process's start points (each marked once) and its runs' first tokens."""

    def __init__(self, born: float | None = None):
        self.born = process_birth() if born is None else born
        self.points: dict[str, float] = {}
        self._lock = threading.Lock()

    def mark(self, point: str, at: float | None = None) -> float:
        """Seconds from birth to `point`; the first mark of a point stands."""
        with self._lock:
            at = self.points.setdefault(point, time.time() if at is None else at)
        seconds = max(0.0, at - self.born)
        metrics.WORKER_START.labels(until=point).set(seconds)
        return seconds

    def engine_ready(self) -> float:
        """The engine is ready: birth to now is this process's engine start."""
        seconds = self.mark("engine_ready")
        metrics.ENGINE_START.set(seconds)
        return seconds

    def token(self, delivered: float) -> None:
        """A run's first token, its chunk delivered at `delivered` (unix time); the process's first once."""
        now = time.time()
        metrics.RUN_FIRST_TOKEN.observe(max(0.0, now - delivered))
        with self._lock:
            first = "first_token" not in self.points
            self.points.setdefault("first_token", now)
        if not first:
            return
        self.mark("first_token")
        ready = self.points.get("engine_ready")
        if ready is not None:
            metrics.READY_TO_FIRST_TOKEN.set(max(0.0, now - ready))


#: this process's clock
CLOCK = StartClock()
