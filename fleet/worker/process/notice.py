"""Using a preemption notice: a cloud that says how long its SIGTERM leaves before the SIGKILL gives GPU time.

Without a known notice a SIGTERM is a hand-over at once (after `grace_s`). With one (`notice_s`:
GCP's and Azure's spot VMs give 30 s, AWS's 120 s), the worker flushes every running chunk at once as
before, so a SIGKILL that comes early still loses nothing, times that flush, and keeps generating
until the last moment that leaves room for the hand-over: one more flush of every running chunk and
the hand-back, each given as long as the flush just measured took (`HANDOVER_FLUSHES`), so the margin
is what this host takes now, under its own load, plus `HANDOVER_FLOOR_S` for what does not grow with
a flush: a busy host's scheduler holding the threads back, the cloud's SIGKILL a little early. No poll
is reserved: the stop rings the bell (fleet.worker.process.bell), which wakes every chunk's thread at
once, and the measured flush already holds that wake-up (the SIGTERM's drain rang it the same way).
The notice counts from the worker's own SIGTERM (its first: a second restarts nothing), which its
launcher passes on the moment it gets its own (fleet.worker.supervisor.launcher).
"""

from __future__ import annotations

import threading
import time

#: the hand-over after the notice's generation, in flushes of every running chunk as measured at the
#: SIGTERM: its last flush, then the hand-back (a requeue and a lease release per chunk, no slower)
HANDOVER_FLUSHES = 2.0
#: seconds added to the measured hand-over. A flush of a few ms measured at the SIGTERM left 2x that: on
#: the 2-core bench machine at load 2-7 the hand-back after it took 14-48 ms (flush, requeue, lease release,
#: each thread waiting for a core) and all 4 hand-overs of a 120 s notice run at 200x (0.6 s) missed the
#: SIGKILL, their notice's tokens made twice; 0.25 s is under 1 % of a 30 s notice
HANDOVER_FLOOR_S = 0.25


class DrainClock:
    """When each running chunk's flush for a SIGTERM ended (its CheckpointMiddleware says so)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.began: float | None = None
        self._flushed = 0

    def begin(self) -> None:
        with self._cond:
            self.began, self._flushed = time.monotonic(), 0

    def flushed(self) -> None:
        with self._cond:
            self._flushed += 1
            self._cond.notify_all()

    def wait(self, runs: int, timeout_s: float) -> float | None:
        """Seconds from `begin` until `runs` flushes ended; None if they did not within the timeout."""
        with self._cond:
            if self.began is None:
                return None
            if not self._cond.wait_for(lambda: self._flushed >= runs, timeout=timeout_s):
                return None
            return time.monotonic() - self.began


def generate_for(notice_s: float, since_term_s: float, flush_s: float | None) -> float:
    """Seconds from now to keep generating: the notice left, less the measured hand-over and its floor.
    A flush that did not end in time (None) leaves no room: the hand-over begins at once."""
    if flush_s is None:
        return 0.0
    return max(0.0, notice_s - since_term_s - HANDOVER_FLUSHES * flush_s - HANDOVER_FLOOR_S)
