"""The one owner of a chunk's queued marker in Redis, and the one way its message is sent.

- queued marker (keys.queued): set before a chunk's message is sent, cleared when a worker
  takes the message. `fleet enqueue` trusts it to avoid double sends; fleet.coord.queuescan
  clears the markers no message backs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis
from celery import Celery

from fleet import metrics
from fleet.coord import counters, keys, leases
from fleet.coord.broker import PRIORITY_RECOVERY, chunk_queue, message_priority, send_chunk, store_of
from fleet.coord.queuescan import PAGE, chunk_of
from fleet.coord.slices import set_members
from fleet.errors import JobConflict
from fleet.settings import Settings


def queued_indexes(r: redis.Redis, job: str) -> set[int]:
    return {int(v) for v in set_members(r, keys.queued(job))}


def waiting(r: redis.Redis, queue: str) -> bool:
    """Whether any message waits in the queue's lists: one EXISTS over every priority's list
    (kombu deletes an emptied list), not an LLEN each: idle workers ask every assist poll."""
    return bool(r.exists(*keys.queue_lists(queue)))


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

    def requeue(self, job: str, index: int, recovery: bool = True, priority: int = 0) -> None:
        """Recovery priority: a chunk coming back jumps the queue instead of waiting behind the job.
        Without it (`recovery=False`) it goes behind every chunk of its job's `priority` (its options')
        waiting: a worker that could not run it leaves it to the others first."""
        self.redis.sadd(keys.queued(job), index)
        attempt = counters.next_attempt(self.redis, job, index)
        send_chunk(self.app, self.queue, job, index, attempt,
                   PRIORITY_RECOVERY if recovery else message_priority(priority))
        metrics.CHUNKS_REQUEUED.inc()

    def reprioritise(self, job: str, priority: int) -> int:
        """Move the job's waiting fresh messages to the list of its new `priority` (fleet.store.options),
        so a change reaches a running fleet: workers take them in the new order without a restart.
        Each move is one atomic script (the message leaves its list only if no worker took it first, and
        lands in the new one in the same step); recovery's list stays as it is, and messages workers
        already took (at most K each) run as they are. Returns the messages moved; reads every waiting
        message of the queue once."""
        target = message_priority(priority)
        lists = keys.queue_lists(self.queue)
        moved = 0
        for step, name in zip(keys.PRIORITY_STEPS, lists, strict=True):
            if step in (PRIORITY_RECOVERY, target):
                continue
            mine = []
            for start in range(0, self.redis.llen(name), PAGE):
                for raw in self.redis.lrange(name, start, start + PAGE - 1):
                    payload = _payload_of(raw, job)
                    if payload is not None:
                        payload["properties"]["priority"] = target  # a restored copy keeps the new list
                        mine.append((raw, json.dumps(payload)))
            # lrange lists the newest first; the oldest goes first, so the job's own order holds
            for raw, moved_payload in reversed(mine):
                moved += int(self.redis.eval(_MOVE, 2, name, lists[keys.PRIORITY_STEPS.index(target)], raw,
                                             moved_payload))
        return moved

    def enqueue(self, job: str, indexes: list[int], priority: int = 0) -> list[int]:
        """First sends of a job's chunks, at its `priority` (its options'); returns those sent. The
        marker is the ticket: of two enqueues running at once, only the one that sets it sends the
        chunk. A job name another store's job holds on this broker is refused: the per-job keys
        would be shared."""
        owner = leases.add_job(self.redis, job, self.store)
        if owner != self.store:
            raise JobConflict(other_store(job, owner, self.store))
        spent = counters.spent_attempts(self.redis, job)
        sent = []
        for index in indexes:
            if self.redis.sadd(keys.queued(job), index):
                attempt = counters.attempt_after(spent.get(index, 0))
                send_chunk(self.app, self.queue, job, index, attempt, message_priority(priority))
                sent.append(index)
        return sent


#: move one message from KEYS[1] to KEYS[2] (rewritten as ARGV[2]) unless a worker took it first
_MOVE = ("if redis.call('lrem', KEYS[1], 1, ARGV[1]) == 1 then redis.call('lpush', KEYS[2], ARGV[2]) return 1 end "
         "return 0")


def _payload_of(raw: bytes, job: str) -> dict | None:
    """The kombu message `raw` if it carries a chunk of `job`, else None."""
    try:
        payload = json.loads(raw)
        chunk = chunk_of(payload)
    except (ValueError, TypeError, AttributeError):
        return None  # another application's message on this Redis: not ours
    if chunk is None or chunk[0] != job or not isinstance(payload.get("properties"), dict):
        return None
    return payload


def other_store(job: str, owner: str, store: str) -> str:
    """Why a job name is refused: another store's job on the broker has it."""
    return (f"job {job!r} is another store's on this broker (store id {owner}; this store's id is {store}): "
            "use another --job name, or the FLEET_STORE_URL that job was enqueued with")
