"""Fast recovery: chunks whose lease expired without a result go back to the queue.

Run by every worker's periodic check, by `fleet enqueue` and by `fleet run`, so a
SIGKILLed worker's chunk runs elsewhere within about TTL + the check interval, whatever
Celery's visibility timeout is. What a lost worker means for the chunk is fleet.coord.retry's
decision (a worker loss is the chunk's fault only on evidence).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import redis
from celery import Celery

from fleet.coord import keys, suspects
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.chunkstate import delete_checkpoints, done_indexes, failed_indexes, running_indexes
from fleet.coord.retry import Action, History, RetryPolicy, next_attempt, settle
from fleet.errors import WorkerLost
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.layout import partials_prefix, result_key

log = logging.getLogger(__name__)

# Leave the running set only while no lease exists, in one step: a worker that took the
# lease since the scan keeps its chunk watched, and no duplicate message is sent for it.
# Also pops the lease clock, the evidence of how long the lost worker ran the chunk.
_FORGET_IF_UNLEASED = (
    "if redis.call('exists', KEYS[1]) == 1 then return false end "
    "if redis.call('srem', KEYS[2], ARGV[1]) == 0 then return false end "
    "local s = redis.call('hget', KEYS[3], ARGV[1]); local b = redis.call('hget', KEYS[4], ARGV[1]); "
    "redis.call('hdel', KEYS[3], ARGV[1]); redis.call('hdel', KEYS[4], ARGV[1]); "
    "return {s or '', b or ''}"
)


def forget_unleased(r: redis.Redis, job: str, index: int) -> float | None:
    """Remove a lease-less chunk from the running set; None if it has a lease (or is gone),
    else the seconds its lost worker had run it (inf when unknown)."""
    member = keys.member(job, index)
    got = r.eval(_FORGET_IF_UNLEASED, 4, keys.lease(job, index), keys.running(), keys.lease_started(),
                 keys.lease_beat(), member)
    if not got:
        return None
    started, beat = (v.decode() if isinstance(v, bytes) else v for v in got)
    return (int(beat) - int(started)) / 1000 if started and beat else math.inf


def requeue_expired(r: redis.Redis, store: Store, app: Celery, settings: Settings) -> list[str]:
    """Requeue (or, on evidence, quarantine) every chunk in the running set whose lease is gone."""
    queue, policy = ChunkQueue(app, settings.queue, r), RetryPolicy.from_settings(settings)
    touched = []
    for raw in r.smembers(keys.running()):
        member = raw.decode()
        job, index = keys.parse_member(member)
        if r.exists(keys.lease(job, index)):
            continue
        if store.exists(result_key(job, index)):
            if forget_unleased(r, job, index) is not None:
                delete_checkpoints(store, job, index)
            continue
        guard_s = max(5, int(settings.lease_ttl_s))
        if not r.set(keys.requeue_guard(job, index), "1", nx=True, ex=guard_s):
            continue
        ran_s = forget_unleased(r, job, index)
        if ran_s is None:
            continue  # a new owner took it since the scan
        try:
            requeue_lost(r, store, queue, policy, job, index, ran_s)
        except Exception as e:  # the chunk left the running set: put it back for the next round
            r.sadd(keys.running(), member)
            log.warning("chunk %s: recovery failed, retried next round: %s", member, e)
            continue
        touched.append(member)
    return touched


def requeue_lost(r: redis.Redis, store: Store, queue: ChunkQueue, policy: RetryPolicy, job: str, index: int,
                 ran_s: float) -> None:
    """What a lost worker's chunk comes to: the retry policy requeues or quarantines it. The
    death is recorded against its process's worker first (once per process)."""
    member = keys.member(job, index)
    owner, solo = suspects.take_lost(r, job, index)
    if owner is not None:
        note_death(r, policy, owner)
    history = History.load(r, job, index, ran_s=ran_s, solo=solo, owner=owner)
    lost = WorkerLost(f"worker lost: lease of {member} expired with no result"
                      + (f" (held by {owner}{', alone' if solo else ''})" if owner else ""))
    decision = settle(r, store, policy, job, index, lost, history, history.worker or None)
    if decision.action is Action.QUARANTINE:
        log.error("chunk %s quarantined: %s", member, decision.why)
    else:  # a lost worker never spends an attempt: the history's count is still current
        queue.requeue(job, index, history.attempts + 1)
        log.warning("chunk %s lease expired without result: requeued (%s)", member, decision.why)


def note_death(r: redis.Redis, policy: RetryPolicy, owner: str) -> None:
    """Count a process's death against its worker; say so loudly when it benches the worker."""
    first, before = suspects.note_process_death(r, owner)
    if not first:
        return
    worker = suspects.worker_of(owner)
    health = suspects.worker_health(r, worker)
    bench_s = policy.benched_for(health.streak)
    if bench_s is not None and health.streak > before:
        log.critical("worker %s benched: %d of its processes in a row died before finishing a chunk (%d deaths in "
                     "all); it takes no chunk for %.0fs, then one at a time until one commits", worker,
                     health.streak, health.deaths, bench_s)
    else:
        log.warning("process %s died holding chunks (worker %s: %d deaths, %d in a row before finishing a chunk)",
                    owner, worker, health.deaths, health.streak)


def watch_jobs(r: redis.Redis, store: Store, app: Celery, settings: Settings, stall: StallWatch,
               chunks_of: Callable[[str], int | None]) -> None:
    """One recovery round over every job of the broker. A job fails alone: its error is
    logged and the others are still checked; a job with no manifest in this store leaves
    the job set (an old job whose prefix was deleted, or another store's)."""
    try:
        requeue_expired(r, store, app, settings)
    except redis.RedisError as e:  # the broker may be restarting; the jobs below get their turn
        log.warning("expired-lease scan failed: %s", e)
    for raw in r.smembers(keys.jobs()):
        job = raw.decode()
        if job in stall.finished:
            continue
        try:
            chunks = chunks_of(job)
            if chunks is None:
                r.srem(keys.jobs(), job)
                log.warning("job %s has no manifest in %s: dropped from the job set", job, store.url)
                continue
            stall.check(r, store, app, settings, job, chunks)
        except Exception as e:  # one broken job must not stop recovery of the others
            log.warning("recovery check of job %s failed: %s", job, e)


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
            store.delete_prefix(partials_prefix(job))  # job end: every chunk has its result
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
        queue = ChunkQueue(app, settings.queue, r)
        for index in sorted(missing):
            queue.requeue(job, index, next_attempt(r, job, index))
        log.warning("job %s stalled with %d chunks missing and none queued: re-enqueued", job, len(missing))
        return sorted(missing)
