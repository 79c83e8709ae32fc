"""The one owner of a running chunk's figures in Redis: samples a running chunk has not started
(keys.progress, for assist), output tokens made (keys.made) and the current run's pace
(keys.pace), and the done chunks' `ChunkStats` (keys.chunk_stats, a cache of the result headers).

The heartbeat adds a run's figures with its lease renewals (fleet.coord.leases.beat, under
the keys `figure_keys` gives); a run's end, status and assist read and clear them here.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import redis

from fleet.coord import keys
from fleet.coord.slices import SLICE, hash_items
from fleet.store.results import ChunkStats


class FigureKeys(NamedTuple):
    """A job's figure keys, in the order the beat's script takes them."""

    made: str
    pace: str
    unstarted: str
    stats: str


def figure_keys(job: str) -> FigureKeys:
    """The keys the beat writes a run's figures to and reads its committed mark from."""
    return FigureKeys(keys.made(job), keys.pace(job), keys.progress(job), keys.chunk_stats(job))


def stragglers(r: redis.Redis, job: str, top: int) -> list[tuple[int, int]]:
    """The `top` running chunks with the most samples not started yet, most first: (index, samples)."""
    return [(int(i), int(n)) for i, n in r.zrevrange(keys.progress(job), 0, top - 1, withscores=True) if n > 0]


def end_run(r: redis.Redis, job: str, index: int, tokens: int, owner: bool) -> None:
    """A run ended: its last `tokens` made are counted and, for the owner's run, its pace and
    unstarted samples go (between beats the heartbeat carries them, fleet.coord.leases.beat)."""
    with r.pipeline(transaction=False) as p:
        if tokens:
            p.hincrby(keys.made(job), index, tokens)
        if owner:
            p.zrem(keys.progress(job), index)
            p.hdel(keys.pace(job), index)
        p.execute()


def made(r: redis.Redis, job: str) -> dict[int, int]:
    """Output tokens made per chunk over all its runs (committed chunks included)."""
    return {int(i): int(n) for i, n in hash_items(r, keys.made(job)).items()}


def made_total(r: redis.Redis, job: str) -> int:
    """Output tokens made for the job, every run of every chunk: what its token budget counts."""
    return sum(made(r, job).values())


def made_by(r: redis.Redis, job: str, index: int) -> int:
    return int(r.hget(keys.made(job), index) or 0)


def paces(r: redis.Redis, job: str) -> dict[int, dict[str, int]]:
    """The current runs' {made, started_ms, at_ms} by chunk."""
    return {int(i): json.loads(v) for i, v in hash_items(r, keys.pace(job)).items()}


def cache_stats(r: redis.Redis, job: str, index: int, stats: ChunkStats) -> None:
    r.hset(keys.chunk_stats(job), index, stats.model_dump_json(exclude_unset=True))


def cached_stats(r: redis.Redis, job: str, indexes: set[int] | None = None) -> dict[int, ChunkStats]:
    """The cached headers of `indexes` (an HMGET a slice), or of every chunk (an HSCAN a slice)."""
    if indexes is None:
        raw = hash_items(r, keys.chunk_stats(job))
    else:
        wanted = sorted(indexes)
        raw = {}
        for start in range(0, len(wanted), SLICE):
            part = wanted[start:start + SLICE]
            raw.update({i: v for i, v in zip(part, r.hmget(keys.chunk_stats(job), part), strict=True) if v})
    return {int(i): ChunkStats.model_validate_json(v) for i, v in raw.items()}

