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
from fleet.coord.broker import PRIORITY_NORMAL, PRIORITY_RECOVERY, chunk_queue, send_chunk, store_of
from fleet.errors import JobConflict
from fleet.settings import Settings


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
    #: the id of the store whose chunks this queue carries (fleet.store.identity)
    store: str

    @classmethod
    def of(cls, app: Celery, settings: Settings, r: redis.Redis) -> ChunkQueue:
        """The queue of the settings' store."""
        return cls(app, chunk_queue(settings), r, store_of(settings))

    def requeue(self, job: str, index: int, recovery: bool = True) -> None:
        """Recovery priority: a chunk coming back jumps the queue instead of waiting behind the job.
        Without it (`recovery=False`) it goes behind every chunk waiting: a worker that could not
        run it leaves it to the others first."""
        self.redis.sadd(keys.queued(job), index)
        attempt = counters.next_attempt(self.redis, job, index)
        send_chunk(self.app, self.queue, job, index, attempt, PRIORITY_RECOVERY if recovery else PRIORITY_NORMAL)
        metrics.CHUNKS_REQUEUED.inc()

    def enqueue(self, job: str, indexes: list[int]) -> list[int]:
        """First sends of a job's chunks; returns those sent. The marker is the ticket: of two
        enqueues running at once, only the one that sets it sends the chunk. A job name another
        store's job holds on this broker is refused: the per-job keys would be shared."""
        owner = leases.add_job(self.redis, job, self.store)
        if owner != self.store:
            raise JobConflict(other_store(job, owner, self.store))
        spent = counters.spent_attempts(self.redis, job)
        sent = []
        for index in indexes:
            if self.redis.sadd(keys.queued(job), index):
                attempt = counters.attempt_after(spent.get(index, 0))
                send_chunk(self.app, self.queue, job, index, attempt, PRIORITY_NORMAL)
                sent.append(index)
        return sent


def other_store(job: str, owner: str, store: str) -> str:
    """Why a job name is refused: another store's job on the broker has it."""
    return (f"job {job!r} is another store's on this broker (store id {owner}; this store's id is {store}): "
            "use another --job name, or the FLEET_STORE_URL that job was enqueued with")
