"""The one owner of a chunk's queued marker in Redis, and the one way its message is sent.

- queued marker (keys.queued): set before a chunk's message is sent, cleared when a worker
  takes the message. `fleet enqueue` trusts it to avoid double sends; fleet.coord.queuescan
  clears the markers no message backs.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery

from fleet import metrics
from fleet.coord import counters, keys, leases
from fleet.coord.broker import PRIORITY_NORMAL, PRIORITY_RECOVERY, send_chunk


def queued_indexes(r: redis.Redis, job: str) -> set[int]:
    return {int(v) for v in r.smembers(keys.queued(job))}


def taken(r: redis.Redis, job: str, index: int) -> None:
    """A worker took the chunk's message off the queue: the marker goes."""
    r.srem(keys.queued(job), index)


def clear_markers(r: redis.Redis, job: str, indexes: set[int]) -> None:
    """Markers no message backs any more (fleet.coord.queuescan found them stale)."""
    if indexes:
        r.srem(keys.queued(job), *indexes)


@dataclass(frozen=True)
class ChunkQueue:
    """The one way a chunk's message is sent: the marker first, then the message.

    Marker first: a consumer fast enough to take the message clears it after us, not before,
    so the marker `fleet enqueue` trusts is never missing for a sent message.
    """

    app: Celery
    queue: str
    redis: redis.Redis

    def requeue(self, job: str, index: int) -> None:
        """Recovery priority: a chunk coming back jumps the queue instead of waiting behind the job."""
        self.redis.sadd(keys.queued(job), index)
        attempt = counters.next_attempt(self.redis, job, index)
        send_chunk(self.app, self.queue, job, index, attempt, PRIORITY_RECOVERY)
        metrics.CHUNKS_REQUEUED.inc()

    def enqueue(self, job: str, indexes: list[int]) -> list[int]:
        """First sends of a job's chunks; returns those sent. The marker is the ticket: of two
        enqueues running at once, only the one that sets it sends the chunk."""
        leases.add_job(self.redis, job)
        spent = counters.spent_attempts(self.redis, job)
        sent = []
        for index in indexes:
            if self.redis.sadd(keys.queued(job), index):
                attempt = counters.attempt_after(spent.get(index, 0))
                send_chunk(self.app, self.queue, job, index, attempt, PRIORITY_NORMAL)
                sent.append(index)
        return sent

