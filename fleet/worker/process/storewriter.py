"""The worker's writes to the store, and the one owner of its spool (fleet.worker.process.spool).

A chunk's result and its checkpoints go to the store at once; while the store refuses them (an
endpoint or network outage) the result, and a run's last checkpoint flush, wait in the spool
instead of being thrown away with the GPU work they hold. The run's task, the checkpoint
middleware and the process's start all write through here, so what is spooled, when it is
committed and when an outage is reported is decided in this one place (docs/architecture.md,
"Failures").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import redis

from fleet import metrics
from fleet.coord import storeoutages
from fleet.errors import StoreError
from fleet.store import Store
from fleet.worker.process.spool import Kind, Spool, Spooled

log = logging.getLogger(__name__)

#: seconds between tries to commit a spooled result while the store refuses it (doubling)
COMMIT_RETRY_S, COMMIT_RETRY_MAX_S = 1.0, 30.0
#: how often a wait for the store asks whether the run must stop
POLL_S = 0.5
#: the most seconds between tries to drain what an earlier process spooled
DRAIN_RETRY_MAX_S = 30.0

#: called with (unreachable since, epoch s, or None once it answers; results waiting in the spool)
Report = Callable[[float | None, int], None]
Stop = TypeVar("Stop")


def outage_reporter(r: redis.Redis, worker: str) -> Report:
    """A store outage as a metric and a line in `fleet status` (fleet.coord.storeoutages): while
    the store is unreachable the broker is where a worker says so."""

    def report(since: float | None, waiting: int) -> None:
        metrics.STORE_UNREACHABLE_SINCE.set(since or 0)
        metrics.SPOOLED_RESULTS.set(waiting)
        try:
            if since is None:
                storeoutages.clear_store_outage(r, worker)
            else:
                storeoutages.note_store_outage(r, worker, int(since * 1000), waiting)
        except Exception as e:  # noqa: BLE001 - a report the broker misses must not fail a write
            log.warning("could not report the store outage: %s", e)

    return report


class StoreWriter:
    """Results and checkpoints to the store, or to the spool while it refuses them."""

    def __init__(self, store: Store, spool: Spool | None = None, report: Report | None = None):
        self.store, self.spool = store, spool
        self.report: Report = report or (lambda since, waiting: None)
        #: epoch seconds the store first refused this worker in the current outage
        self.unreachable_since: float | None = None
        #: outages this worker saw end: a result waiting out its back-off tries again at once when
        #: another write found the store back (its slot would idle up to COMMIT_RETRY_MAX_S otherwise)
        self.outages_ended = 0
        self._lock = threading.Lock()

    def waiting(self) -> int:
        """Results in the spool."""
        return len(self.spool.entries(Kind.RESULT)) if self.spool is not None else 0

    def refused(self) -> None:
        """The store refused a write: an outage begins, or goes on."""
        with self._lock:
            if self.unreachable_since is None:
                self.unreachable_since = time.time()
        self.report(self.unreachable_since, self.waiting())

    def answered(self) -> None:
        """The store took a write: any outage is over."""
        with self._lock:
            was, self.unreachable_since = self.unreachable_since, None
            if was is not None:
                self.outages_ended += 1
        if was is not None:
            log.warning("store answers again after %.0fs unreachable", time.time() - was)
            self.report(None, self.waiting())

    def checkpoint(self, key: str, data: bytes, last: bool) -> bool:
        """Put a checkpoint; True when it went to the spool. A refused flush raises StoreError (the
        run keeps what it held and sends it with its next flush), except a run's last flush, which
        has no next: that one is spooled, for this worker to commit once the store answers."""
        try:
            self.store.put(key, data)
        except StoreError:
            if not (last and self.spool is not None):
                raise
            self.spool.put(Kind.CHECKPOINT, key, data)  # SpoolFull: the rows are generated again
            self.refused()
            return True
        self.answered()
        return False

    def commit(self, key: str, data: bytes, stop: Callable[[], Stop | None]) -> bool | Stop:
        """A chunk's result, with the store's conditional put: True when written, False when
        another copy was committed first. While the store refuses it, the result is spooled and
        retried with back-off until written, or until `stop` says the run must end (what it
        returns is returned; the result stays spooled for this worker's next process)."""
        try:
            written = self.store.put_if_absent(key, data)
        except StoreError as e:
            if self.spool is None:
                raise
            self.spool.put(Kind.RESULT, key, data)  # SpoolFull: the run fails as an infra fault
            self.refused()
            log.warning("the store refuses result %s (%s): spooled; retrying, lease kept", key, e)
            return self._retry(key, data, stop)
        self.answered()
        return written

    def _retry(self, key: str, data: bytes, stop: Callable[[], Stop | None]) -> bool | Stop:
        assert self.spool is not None
        wait = COMMIT_RETRY_S
        while True:
            deadline, ended = time.monotonic() + wait, self.outages_ended
            while time.monotonic() < deadline and self.outages_ended == ended:
                stopped = stop()
                if stopped is not None:
                    log.warning("result %s stays spooled: %s", key, stopped)
                    return stopped
                time.sleep(POLL_S)
            try:
                written = self.store.put_if_absent(key, data)
            except StoreError:
                self.refused()
                # another write found the store back since this wait began (this try may have begun in the
                # outage and failed after it, a client's own retries long): not the old outage's back-off
                # (CI on a16a9fd: a try that failed 0.5 s after the store returned waited 30 s more)
                wait = COMMIT_RETRY_S if self.outages_ended != ended else min(wait * 2, COMMIT_RETRY_MAX_S)
                continue
            self.spool.drop(Kind.RESULT, key)
            self.answered()
            log.info("spooled result %s committed once the store answered", key)
            return written

    def start_drain(self, name: str, stop: threading.Event) -> None:
        """What an earlier process of this worker spooled, committed in the background."""
        if self.spool is not None and self.spool.entries():
            threading.Thread(target=self._drain, args=(name, stop), name="fleet-spool", daemon=True).start()

    def _drain(self, name: str, stop: threading.Event) -> None:
        wait = 1.0
        while not stop.is_set():
            try:
                written, dropped = self.drain()
                log.info("spool of %s: %d object(s) committed, %d dropped (another copy won)", name, written, dropped)
                return
            except Exception as e:  # noqa: BLE001 - tried again until the store answers
                log.warning("spool of %s: the store still refuses (%s); retrying in %.0fs", name, e, wait)
                stop.wait(wait)
                wait = min(wait * 2, DRAIN_RETRY_MAX_S)

    def drain(self) -> tuple[int, int]:
        """Commit everything spooled (results first); (written, discarded as another copy won).
        Stops at the first StoreError, which it raises: the rest waits for the next try."""
        assert self.spool is not None
        written = discarded = 0
        for entry in self.spool.entries(Kind.RESULT) + self.spool.entries(Kind.CHECKPOINT):
            try:
                done = self._commit_spooled(entry)
            except StoreError:
                self.refused()
                raise
            self.answered()
            if done:
                written += 1
                log.info("spooled %s %s committed", entry.kind.value, entry.key)
            else:
                discarded += 1
                log.info("spooled result %s discarded: another copy of the chunk was committed first", entry.key)
        return written, discarded

    def _commit_spooled(self, entry: Spooled) -> bool:
        data = entry.path.read_bytes()
        if entry.kind is Kind.RESULT:
            written = self.store.put_if_absent(entry.key, data)
        else:
            self.store.put(entry.key, data)
            written = True
        entry.path.unlink(missing_ok=True)
        return written
