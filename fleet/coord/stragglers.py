"""Which running chunk an idle worker should assist: the one of another worker lacking the most samples
(docs/architecture.md, "Keeping the engine full"). Its own module in coord because the worker's assist
policy and the control-plane bench's idle workers ask the broker the same question."""

from __future__ import annotations

import redis

from fleet.coord import figures, leases, suspects

#: running chunks per job an idle worker considers for assist, those lacking the most samples
STRAGGLERS_READ = 16


def straggler(r: redis.Redis, store: str, owner: str, assisted: set[tuple[str, int]]) -> tuple[str, int] | None:
    """The running chunk with the most unstarted samples that another worker holds and nobody assists;
    never a suspect, never one this worker assisted already."""
    best = None
    for job in leases.known_jobs(r, store):
        suspected = suspects.suspected_indexes(r, job)
        for index, unstarted in figures.stragglers(r, job, STRAGGLERS_READ):
            if (best and unstarted <= best[0]) or (job, index) in assisted:
                continue
            if index in suspected:
                continue
            holder = leases.holder(r, job, index)
            if holder is None or holder == owner or leases.assisted(r, job, index):
                continue
            best = (unstarted, job, index)
    return (best[1], best[2]) if best else None
