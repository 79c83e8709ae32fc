"""The heartbeat: one thread per worker process renewing every lease it holds
(fleet.coord.chunks.Lease), so a live worker's leases never expire."""

from __future__ import annotations

import logging
import threading

from fleet.coord.chunks import Lease

log = logging.getLogger(__name__)


class Heartbeat:
    """One thread per worker process renewing every lease it holds."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)

    def discard(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def held(self, job: str, index: int) -> Lease | None:
        """The chunk lease (not an assist's) this process holds on the chunk, if any."""
        with self._lock:
            return next((x for x in self._leases if x.watched and (x.job, x.index) == (job, index)), None)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                leases = list(self._leases)
            for lease in leases:
                try:
                    lease.renew()
                except Exception as e:  # one failed renewal must not end the thread: every lease would expire
                    log.warning("heartbeat for %s/%d failed: %s", lease.job, lease.index, e)
