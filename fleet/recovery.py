"""Fast recovery: chunks whose lease expired without a result go back to the queue.

Run by every worker's periodic check, by `fleet enqueue` and by `fleet run`, so a
SIGKILLed worker's chunk runs elsewhere within about TTL + the check interval, whatever
Celery's visibility timeout is. A chunk that keeps losing its worker is quarantined.
"""

from __future__ import annotations

import logging

import redis
from celery import Celery

from fleet import keys, metrics
from fleet.broker import PRIORITY_RECOVERY, send_chunk
from fleet.chunkstate import Quarantine, attempts, done_indexes, failed_indexes, running_indexes
from fleet.layout import result_key
from fleet.settings import Settings
from fleet.store import Store

log = logging.getLogger(__name__)


def requeue_expired(r: redis.Redis, store: Store, app: Celery, settings: Settings) -> list[str]:
    """Requeue (or quarantine) every chunk in the running set whose lease is gone."""
    touched = []
    for raw in r.smembers(keys.running()):
        member = raw.decode()
        job, index = keys.parse_member(member)
        if r.exists(keys.lease(job, index)):
            continue
        if store.exists(result_key(job, index)):
            r.srem(keys.running(), member)
            continue
        guard_s = max(5, int(settings.lease_ttl_s))
        if not r.set(keys.requeue_guard(job, index), "1", nx=True, ex=guard_s):
            continue
        tried = attempts(r, job, index)
        if tried >= settings.max_attempts:
            Quarantine(
                index=index,
                error=f"worker lost {tried} time(s): lease expired with no result",
                error_type="WorkerLost",
                attempts=tried,
            ).write(store, job)
            log.error("chunk %s quarantined after %d lost workers", member, tried)
        else:
            send_chunk(app, settings.queue, job, index, tried + 1, PRIORITY_RECOVERY)
            r.sadd(keys.queued(job), index)
            metrics.CHUNKS_REQUEUED.inc()
            log.warning("chunk %s lease expired without result: requeued (attempt %d)", member, tried + 1)
        r.srem(keys.running(), member)
        touched.append(member)
    return touched


class StallWatch:
    """Re-enqueue a job's missing chunks when nothing is queued or running for two checks.

    Covers the one gap leases cannot: a message taken off the queue by a worker killed
    before it took the lease (kombu has the same window between pop and its unacked
    record). Duplicates are harmless: a delivery of a done or leased chunk is skipped.
    """

    def __init__(self) -> None:
        self.idle_checks: dict[str, int] = {}
        #: jobs whose every chunk has a result: never checked again
        self.finished: set[str] = set()

    def check(self, r: redis.Redis, store: Store, app: Celery, settings: Settings, job: str, chunks: int) -> list[int]:
        if job in self.finished:
            return []
        if any(r.llen(q) for q in keys.queue_lists(settings.queue)) or running_indexes(r, job):
            self.idle_checks[job] = 0
            return []
        done = done_indexes(store, job)
        if len(done) == chunks:
            self.finished.add(job)
            return []
        missing = set(range(chunks)) - done - failed_indexes(store, job)
        if not missing:
            return []
        self.idle_checks[job] = self.idle_checks.get(job, 0) + 1
        if self.idle_checks[job] < 2:
            return []
        self.idle_checks[job] = 0
        if not r.set(keys.stall_guard(job), "1", nx=True, ex=max(5, int(settings.reaper_interval_s * 3))):
            return []
        for index in sorted(missing):
            send_chunk(app, settings.queue, job, index, attempts(r, job, index) + 1, PRIORITY_RECOVERY)
            r.sadd(keys.queued(job), index)
            metrics.CHUNKS_REQUEUED.inc()
        log.warning("job %s stalled with %d chunks missing and none queued: re-enqueued", job, len(missing))
        return sorted(missing)
