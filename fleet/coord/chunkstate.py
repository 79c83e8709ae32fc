"""What the store and the broker say about a job's chunks: done, failed, running, queued.

The store decides done and failed; Redis only knows what runs and what waits, and may
lose it all without losing work.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import redis

from fleet.coord import keys
from fleet.store import Store
from fleet.store.layout import failed_key, failed_prefix, index_of, partial_prefix, results_prefix


def done_indexes(store: Store, job: str) -> set[int]:
    return {index_of(k) for k in store.list(results_prefix(job))}


def failed_indexes(store: Store, job: str) -> set[int]:
    return {index_of(k) for k in store.list(failed_prefix(job)) if k.endswith(".json")}


def running_indexes(r: redis.Redis, job: str) -> set[int]:
    """Chunks whose lease is live right now."""
    members = [keys.parse_member(m.decode()) for m in r.smembers(keys.running())]
    indexes = [i for j, i in members if j == job]
    if not indexes:
        return set()
    with r.pipeline(transaction=False) as p:
        for i in indexes:
            p.exists(keys.lease(job, i))
        alive = p.execute()
    return {i for i, ok in zip(indexes, alive, strict=True) if ok}


def queued_indexes(r: redis.Redis, job: str) -> set[int]:
    return {int(v) for v in r.smembers(keys.queued(job))}


def delete_checkpoints(store: Store, job: str, index: int) -> None:
    """Call only once the chunk's result is known to exist: before that, checkpoints are the
    work done. Every caller has just seen the result, so this does not look again."""
    store.delete_prefix(partial_prefix(job, index))


@dataclass
class Quarantine:
    index: int
    error: str
    error_type: str
    attempts: int
    traceback: str | None = None
    worker: str | None = None

    def write(self, store: Store, job: str) -> None:
        body = {**self.__dict__, "job": job, "at": time.time()}
        store.put(failed_key(job, self.index), json.dumps(body, indent=2).encode())


def read_failures(store: Store, job: str, indexes: set[int] | None = None) -> list[dict]:
    """The quarantine records of a job, or of the given chunk indexes (no second listing)."""
    wanted = failed_indexes(store, job) if indexes is None else indexes
    return [json.loads(store.get(failed_key(job, i))) for i in sorted(wanted)]
