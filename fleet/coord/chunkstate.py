"""What the store says about a job's chunks: done, quarantined, and their checkpoints.

The store decides done and quarantined; what runs and what waits is Redis's
(fleet.coord.leases, chunkqueue, counters, figures), which may lose it all without losing work.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from fleet.store import Store
from fleet.store.layout import checkpoint_prefix, failed_key, failed_prefix, index_of, results_prefix


def done_indexes(store: Store, job: str) -> set[int]:
    return {index_of(k) for k in store.list(results_prefix(job))}


def failed_indexes(store: Store, job: str) -> set[int]:
    return {index_of(k) for k in store.list(failed_prefix(job)) if k.endswith(".json")}


def delete_checkpoints(store: Store, job: str, index: int) -> None:
    """Call only once the chunk's result is known to exist: before that, checkpoints are the
    work done. Every caller has just seen the result, so this does not look again."""
    store.delete_prefix(checkpoint_prefix(job, index))


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
