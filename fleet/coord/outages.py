"""When the broker did not answer this process: the windows a reaper checks before it reads an
expired lease as a death (docs/architecture.md, "Failures": a broker pause).

A broker that stops answering (a long fork for a snapshot, a failover, a partition) lets
every lease run out while every holder is alive. Nothing can be written to Redis while it
is out, so each process keeps its own record: every command its client sends is timed
(`WatchedRedis`), and one answered late, or failed for the connection, marks a window
from the last answer before it to the next answer. A reaper that was cut off itself when
a lease ran out cannot tell its holder's death from the pause, and judges nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import redis

#: windows older than this are forgotten (a lease expired that long ago was judged long since)
KEEP_S = 3600.0
#: a process quiet longer than this before a late answer dates the outage from its command; past
#: a worker's quietest stretch (a beat renews old leases every 10 s at the defaults, LeaseClock.renew_s)
QUIET_S = 15.0


@dataclass(frozen=True)
class Window:
    """Epoch seconds: from the last answer before the broker went quiet to the first after."""

    start: float
    end: float


class Outages:
    """This process's record of the broker not answering it; thread-safe (every thread's
    commands are timed)."""

    def __init__(self, slow_s: float = 2.0):
        #: an answer later than this means the broker was not answering
        self.slow_s = slow_s
        self._lock = threading.Lock()
        self._windows: list[Window] = []
        self._last_answer: float | None = None
        #: the start of an outage not yet over: a command failed, none answered since
        self._down_since: float | None = None

    def sent(self) -> float | None:
        """Called as a command is sent: the last answer before it (the start of a window it may open)."""
        with self._lock:
            return self._last_answer

    def answered(self, began: float, before: float | None, at: float | None = None) -> None:
        """A command sent at `began` was answered (`before`: the last answer when it was sent)."""
        at = time.time() if at is None else at
        with self._lock:
            start = self._down_since
            if at - began > self.slow_s:
                start = min(start if start is not None else began, self._quiet_from(began, before))
            if start is not None:
                self._add(Window(start, at))
            self._down_since, self._last_answer = None, at

    def failed(self, began: float, before: float | None) -> None:
        """A command sent at `began` failed for the connection: out until the next answer."""
        with self._lock:
            start = self._quiet_from(began, before)
            self._down_since = start if self._down_since is None else min(self._down_since, start)

    def _quiet_from(self, began: float, before: float | None) -> float:
        """When the broker may have gone quiet: at the last answer before the command, unless
        this process was idle long before it (then at the command)."""
        if before is None or began - before > QUIET_S:
            return began
        return before

    def add(self, start: float, end: float) -> None:
        """A window seen another way (every holder's leases ran out at once)."""
        with self._lock:
            self._add(Window(start, end))

    def _add(self, window: Window) -> None:
        cutoff = window.end - KEEP_S
        self._windows = [w for w in self._windows if w.end >= cutoff] + [window]

    def windows(self, now: float | None = None) -> list[Window]:
        """Every window still kept; an outage not over yet ends `now`."""
        now = time.time() if now is None else now
        with self._lock:
            out = list(self._windows)
            if self._down_since is not None:
                out.append(Window(self._down_since, now))
        return out

    def covering(self, at: float, before_s: float, after_s: float, min_s: float = 0.0) -> Window | None:
        """The window that explains something that happened at `at` (a lease running out): it
        lasted at least `min_s`, began at most `before_s` after `at` and ended at most `after_s`
        before it."""
        found = [w for w in self.windows() if w.end - w.start >= min_s and w.start - before_s <= at <= w.end + after_s]
        return max(found, key=lambda w: w.end) if found else None


class WatchedRedis(redis.Redis):
    """A Redis client that times every command into its `outages` (pipelines are not timed: the
    heartbeat's beat is one command, a script, and the reaper's scan starts with one, SMEMBERS,
    before its pipelines of lease checks)."""

    outages: Outages

    def execute_command(self, *args: Any, **options: Any) -> Any:
        outages = self.__dict__.get("outages")
        if outages is None:
            return super().execute_command(*args, **options)
        began, before = time.time(), outages.sent()
        try:
            result = super().execute_command(*args, **options)
        except (redis.ConnectionError, redis.TimeoutError):
            outages.failed(began, before)
            raise
        outages.answered(began, before)
        return result


def outages_of(r: redis.Redis) -> Outages:
    """The client's record, or an empty one for a plain client (tests, tools)."""
    found = r.__dict__.get("outages")
    return found if isinstance(found, Outages) else Outages()
