"""Crash evidence beyond a chunk's own counters: which process held a chunk when it died,
which runs ran alone (or waited to), which chunks are suspected, which workers keep dying,
and how long the job's chunks run (docs/architecture.md, "Failures"). No other module
names these keys (tests/test_architecture.py checks).

One death is evidence against the worker and against the set of chunks it ran, never
against each of them: they become suspects and run alone next, and only deaths in such
solo runs count towards quarantine. fleet.coord.retry decides; this module only keeps
the record.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import redis

from fleet.coord import counters, keys
from fleet.coord.leases import now_ms
from fleet.coord.slices import hash_items

#: how long the per-process marks (dead, committed) live: longer than any process's death takes to be seen
PROCESS_MARK_TTL_S = 24 * 3600
#: committed chunk run times kept per job for the median
DURATIONS_KEPT = 100
#: a worker that committed this recently is a healthy alternative to a dying one
HEALTHY_RECENT_S = 600.0


def worker_of(owner: str) -> str:
    """"gpu0@host:1234" (a lease owner) -> "gpu0@host" (the worker, kept across restarts)."""
    return owner.rpartition(":")[0] or owner


def host_of(worker: str) -> str:
    """"gpu0@host" -> "host"; a name without a host part is its own host."""
    return worker.partition("@")[2] or worker


# -- who ran a chunk, and whether alone --------------------------------------------------

_DEL_IF_OWNER = (
    "if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('hdel', KEYS[1], ARGV[1]) end "
    "return 0"
)


def note_holder(r: redis.Redis, job: str, index: int, owner: str) -> None:
    r.hset(keys.lease_holder(), keys.member(job, index), owner)


def drop_holder(r: redis.Redis, job: str, index: int, owner: str) -> None:
    """Only our own mark: a new owner's must survive for the reaper."""
    r.eval(_DEL_IF_OWNER, 1, keys.lease_holder(), keys.member(job, index), owner)


def wait_solo(r: redis.Redis, job: str, index: int, owner: str) -> None:
    """The run waits, leased, for its process's other chunks to end before it runs alone: a
    death now is no evidence against it (it generated nothing) nor for it (it did not run)."""
    r.hset(keys.solo_waits(), keys.member(job, index), owner)


def start_solo(r: redis.Redis, job: str, index: int, owner: str) -> None:
    """The run starts alone (its lease clock restarted by its owner, leases.Lease.restart_clock)."""
    with r.pipeline(transaction=True) as p:
        p.hset(keys.solo_runs(), keys.member(job, index), owner)
        p.hdel(keys.solo_waits(), keys.member(job, index))
        p.execute()


def end_solo(r: redis.Redis, job: str, index: int, owner: str) -> None:
    """Only our own marks, waiting or running: a new owner's must survive for the reaper."""
    for key in (keys.solo_waits(), keys.solo_runs()):
        r.eval(_DEL_IF_OWNER, 1, key, keys.member(job, index), owner)


class Run(Enum):
    """How the lost process held the chunk."""

    #: beside its other chunks (or unknown)
    SHARED = "shared"
    #: waiting for its other chunks to end, to run alone: not started
    WAITING = "waiting"
    ALONE = "alone"


@dataclass(frozen=True)
class Lost:
    """The marks a lost chunk's process left: who held it (None if unknown), and how."""

    owner: str | None
    run: Run = Run.SHARED


def lost_marks(r: redis.Redis, job: str, index: int) -> Lost:
    """For the reaper: who held a lost chunk, and how. The marks stay until `drop_lost`, once the
    reaper has carried out its decision: a failed round leaves the evidence to the next one."""
    member = keys.member(job, index)
    with r.pipeline(transaction=True) as p:
        p.hget(keys.lease_holder(), member)
        p.hget(keys.solo_runs(), member)
        p.hget(keys.solo_waits(), member)
        holder, solo, waits = p.execute()
    if not holder:
        return Lost(None)
    if solo == holder:
        return Lost(holder.decode(), Run.ALONE)
    return Lost(holder.decode(), Run.WAITING if waits == holder else Run.SHARED)


def drop_lost(r: redis.Redis, job: str, index: int, lost: Lost | None = None) -> None:
    """Remove the lost process's marks once its chunk is judged (a new holder's survive);
    without `lost`, whatever marks the chunk has (its process died after the commit)."""
    lost = lost or lost_marks(r, job, index)
    if lost.owner is not None:
        drop_holder(r, job, index, lost.owner)
        end_solo(r, job, index, lost.owner)


# -- suspected chunks ---------------------------------------------------------------------


@dataclass(frozen=True)
class Suspicion:
    """The quick deaths a chunk was in since its last clean run."""

    #: deaths of processes running it, with others or alone
    deaths: int = 0
    #: workers whose solo runs of it died (the evidence that isolates it)
    solo: tuple[str, ...] = field(default_factory=tuple)
    #: the worker whose process died with it last, and when (epoch seconds)
    last: str = ""
    at: float = 0.0

    def __bool__(self) -> bool:
        return self.deaths > 0

    def with_death(self, worker: str, solo: bool, at: float | None = None) -> Suspicion:
        return Suspicion(self.deaths + 1, self.solo + ((worker,) if solo else ()), worker,
                         time.time() if at is None else at)

    def to_json(self) -> str:
        return json.dumps({"deaths": self.deaths, "solo": list(self.solo), "last": self.last, "at": self.at})

    @classmethod
    def from_json(cls, raw: bytes | str | None) -> Suspicion:
        if not raw:
            return cls()
        try:
            d = json.loads(raw)
            return cls(int(d["deaths"]), tuple(d.get("solo", ())), str(d.get("last", "")), float(d.get("at", 0)))
        except (ValueError, KeyError, TypeError):
            return cls()  # written by another fleet version: no evidence


def suspicion(r: redis.Redis, job: str, index: int) -> Suspicion:
    return Suspicion.from_json(r.hget(keys.suspects(job), index))


def suspected_indexes(r: redis.Redis, job: str) -> set[int]:
    return {int(i) for i in r.hkeys(keys.suspects(job))}


def note_death(r: redis.Redis, job: str, index: int, worker: str, solo: bool) -> Suspicion:
    """One more quick death of a process running the chunk (one reaper or one worker per
    death: the requeue guard and the lease see to it)."""
    s = suspicion(r, job, index).with_death(worker, solo)
    r.hset(keys.suspects(job), index, s.to_json())
    return s


def clear_suspicion(r: redis.Redis, job: str, index: int) -> None:
    """A clean run (a result, or a loss long after the start) ends the suspicion."""
    r.hdel(keys.suspects(job), index)
    counters.clear_crashes(r, job, index)


# -- the job's chunk run time -------------------------------------------------------------


def note_duration(r: redis.Redis, job: str, seconds: float) -> None:
    with r.pipeline(transaction=False) as p:
        p.lpush(keys.chunk_seconds(job), round(seconds, 3))
        p.ltrim(keys.chunk_seconds(job), 0, DURATIONS_KEPT - 1)
        p.execute()


def median_duration(r: redis.Redis, job: str) -> float | None:
    """Median run time of the job's last committed chunks; None before the first."""
    values = [float(v) for v in r.lrange(keys.chunk_seconds(job), 0, -1)]
    return statistics.median(values) if values else None


# -- workers whose processes die -----------------------------------------------------------


@dataclass(frozen=True)
class WorkerHealth:
    worker: str
    #: deaths of its processes while holding chunks
    deaths: int = 0
    #: of them in a row, each before the process finished a batch of chunks
    streak: int = 0
    #: epoch seconds of the last death
    at: float = 0.0


# Once per process (whichever reaper or worker sees it first): count the death, and in the
# streak unless the process had committed a chunk; keep the streak from before it, the
# judge of every chunk the process held.
_DEATH = (
    "local prev = redis.call('get', KEYS[1]) "
    "if prev then return {0, tonumber(prev)} end "
    "local streak = tonumber(redis.call('hget', KEYS[2], ARGV[1]) or '0') "
    "redis.call('set', KEYS[1], streak, 'EX', ARGV[3]) "
    "redis.call('hincrby', KEYS[3], ARGV[1], 1) "
    "if redis.call('exists', KEYS[4]) == 0 then redis.call('hincrby', KEYS[2], ARGV[1], 1) end "
    "redis.call('hset', KEYS[5], ARGV[1], ARGV[2]) "
    "return {1, streak}"
)


def note_process_death(r: redis.Redis, owner: str) -> tuple[bool, int]:
    """Record a process's death once; (first time seen, the worker's streak before it)."""
    first, before = r.eval(_DEATH, 5, keys.process_dead(owner), keys.worker_streak(), keys.worker_deaths(),
                           keys.process_committed(owner), keys.worker_last_death(),
                           worker_of(owner), now_ms(), PROCESS_MARK_TTL_S)
    return bool(first), int(before)


def streak_before_death(r: redis.Redis, owner: str) -> int | None:
    """The streak the worker had before this process died; None if its death is not recorded."""
    raw = r.get(keys.process_dead(owner))
    return int(raw) if raw is not None else None


def note_commit(r: redis.Redis, owner: str) -> None:
    """A process that finished a batch of chunks (as many as it ran at once) is healthy: its
    death will not be an early one, and its worker's streak ends. A crash-looping process may
    finish a short chunk or two before it dies with the rest of its batch: that is no cure."""
    with r.pipeline(transaction=False) as p:
        p.set(keys.process_committed(owner), 1, ex=PROCESS_MARK_TTL_S)
        p.hdel(keys.worker_streak(), worker_of(owner))
        p.hset(keys.worker_last_commit(), worker_of(owner), now_ms())
        p.hdel(keys.worker_stalls(), worker_of(owner))
        p.execute()


def healthy_others(r: redis.Redis, worker: str, within_s: float = HEALTHY_RECENT_S) -> bool:
    """Whether another worker committed lately: only then is a dying worker's death evidence
    against the worker rather than its chunks (alone, a machine cannot tell the two apart,
    and its poison chunk must still be quarantined)."""
    since = now_ms() - within_s * 1000
    return any(w.decode() != worker and int(ms) >= since for w, ms in hash_items(r, keys.worker_last_commit()).items())


def worker_health(r: redis.Redis, worker: str) -> WorkerHealth:
    with r.pipeline(transaction=False) as p:
        p.hget(keys.worker_deaths(), worker)
        p.hget(keys.worker_streak(), worker)
        p.hget(keys.worker_last_death(), worker)
        deaths, streak, at = p.execute()
    return WorkerHealth(worker, int(deaths or 0), int(streak or 0), int(at or 0) / 1000)


def dying_workers(r: redis.Redis) -> list[WorkerHealth]:
    """Workers with deaths in a row before finishing a batch, worst first (`fleet status`)."""
    streaks = {k.decode(): int(v) for k, v in hash_items(r, keys.worker_streak()).items() if int(v) > 0}
    out = [worker_health(r, w) for w in streaks]
    return sorted(out, key=lambda h: (-h.streak, h.worker))


# -- workers whose engines stall -----------------------------------------------------------


def note_stall(r: redis.Redis, owner: str, stalled_s: float) -> int:
    """A process's engine made no token for `stalled_s` while requests ran: evidence against the
    worker as a death is (the process restarts; a worker that keeps stalling is benched), never
    against its chunks. Returns the worker's stalls since it last committed."""
    worker = worker_of(owner)
    raw = r.hget(keys.worker_stalls(), worker)
    stalls = (json.loads(raw)["stalls"] if raw else 0) + 1
    r.hset(keys.worker_stalls(), worker, json.dumps({"stalls": stalls, "stalled_s": round(stalled_s, 1),
                                                     "at_ms": now_ms()}))
    note_process_death(r, owner)
    return stalls


def stalled_workers(r: redis.Redis) -> list[dict[str, Any]]:
    """Workers whose engine stalled since they last committed (`fleet status`): {worker, stalls,
    stalled_s (how long it had made no token when declared hung), at}."""
    out = []
    for worker, raw in hash_items(r, keys.worker_stalls()).items():
        data = json.loads(raw)
        out.append({"worker": worker.decode(), "stalls": data["stalls"], "stalled_s": data["stalled_s"],
                    "at": data["at_ms"] / 1000})
    return sorted(out, key=lambda d: d["worker"])
