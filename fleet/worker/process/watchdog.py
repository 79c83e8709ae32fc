"""The engine watchdog: an engine that stops making tokens without dying is found in `stall_s`.

A worker's heartbeat renews its leases whether or not its engine makes progress, so an engine
that hangs (a stuck collective, a CUDA fault that leaves the scheduler waiting, a deadlocked
detokenizer) would hold its chunks forever. The token stream says when the engine last made a
token while requests ran (`EngineClock`, ticked by fleet.worker.run.generate); the watchdog
thread compares that with `stall_s` and, once exceeded, has the runtime hand the chunks back
and restart (fleet.worker.runtime `Runtime.stalled`; docs/architecture.md, Failures).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class EngineClock:
    """When the engine last showed progress while it had requests: a token, or the first request
    after an idle spell (the time it sat idle is no stall). Ticked from the engine loop, read
    from the watchdog thread: plain attributes, a torn read only delays a verdict by a check."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.running = 0

    def enter(self) -> None:
        if self.running == 0:
            self.last = time.monotonic()
        self.running += 1

    def leave(self) -> None:
        self.running -= 1

    def tick(self) -> None:
        self.last = time.monotonic()

    def stalled_for(self, now: float | None = None) -> float:
        """Seconds the engine has made no token while requests ran (0 while it has none)."""
        if self.running <= 0:
            return 0.0
        return (now if now is not None else time.monotonic()) - self.last


class Watchdog:
    """A daemon thread that calls `on_stall(seconds)` once the clock shows no token for
    `stall_s`; started only once the engine is up, so loading weights or capturing graphs
    never counts."""

    def __init__(self, clock: EngineClock, stall_s: float, on_stall: Callable[[float], None]):
        self.clock, self.stall_s, self.on_stall = clock, stall_s, on_stall
        self._stop = threading.Event()
        self.fired = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="fleet-watchdog", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        every = max(0.2, min(5.0, self.stall_s / 4))
        while not self._stop.wait(every):
            stalled = self.clock.stalled_for()
            if stalled >= self.stall_s:
                self.fired = True
                try:
                    self.on_stall(stalled)
                except Exception:
                    log.exception("stall handling failed")
                return
