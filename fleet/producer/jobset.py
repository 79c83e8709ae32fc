"""Change a job's options (fleet.store.options) without it becoming another job: `fleet enqueue`'s
option flags and `fleet job set` both come here.

The store holds the options (the source of truth, read by the workers' and reaper's caches within
seconds); a new priority also moves the job's waiting messages to its new list at once
(`ChunkQueue.reprioritise`), so workers take them in the new order without a restart.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from fleet.coord.chunkqueue import ChunkQueue
from fleet.store import Store
from fleet.store.options import JobOptions, load_options, write_options


@dataclass(frozen=True)
class OptionsChange:
    before: JobOptions
    after: JobOptions
    #: waiting messages moved to the list of the new priority
    moved: int = 0


def planned(store: Store, job: str, assignments: dict[str, object]) -> OptionsChange:
    """The change `assignments` would make, checked (ConfigError naming a bad one); nothing is written."""
    before = load_options(store, job)
    return OptionsChange(before, before.changed(assignments) if assignments else before)


def apply_change(store: Store, r: redis.Redis | None, queue: ChunkQueue | None, job: str,
                 change: OptionsChange) -> OptionsChange:
    """Write the options, then move the job's waiting messages when its priority changed: written
    first, so a chunk sent meanwhile (a requeue, an enqueue) reads the new priority."""
    if change.after == change.before:
        return change
    write_options(store, job, change.after)
    if change.after.priority == change.before.priority or r is None or queue is None:
        return change
    return OptionsChange(change.before, change.after, queue.reprioritise(job, change.after.priority))
