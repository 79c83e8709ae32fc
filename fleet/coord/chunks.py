"""The one owner of a chunk's state in Redis: queued marker, lease and running set, the
lease clock, and the attempt, crash and retry counters.

The producer, the worker and the reaper change that state only through this module, and
no other module names those keys (tests/test_architecture.py checks). Redis may lose it
all without losing work: the store decides done and quarantined.

- queued marker (keys.queued): set before a chunk's message is sent, cleared when a worker
  takes the message. `fleet enqueue` trusts it to avoid double sends.
- lease (keys.lease) and running set (keys.running): one live owner per chunk; a chunk in
  the running set without a lease lost its worker, and the reaper sends it round again.
- lease clock (keys.lease_started, keys.lease_beat): when the lease was taken and last
  renewed. How long a run held its lease is the one crash evidence fleet.coord.retry
  reads, for a failure the worker saw (taken -> now) and for a lost worker (taken -> beat).
- counters (keys.attempts, crashes, retries): what fleet.coord.retry spent on the chunk.
- running figures: samples a running chunk still lacks (keys.progress, for assist), and the
  done chunks' `ChunkStats` (keys.chunk_stats, a cache of the result headers).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass

import redis
from celery import Celery

from fleet import metrics
from fleet.coord import keys
from fleet.coord.broker import PRIORITY_NORMAL, PRIORITY_RECOVERY, send_chunk
from fleet.store.results import ChunkStats

log = logging.getLogger(__name__)

# A watched lease also (re)registers its job: a broker that lost everything relearns the
# job from the chunks still running, and the reapers' stall watch finds the rest again.
# ARGV[4] starts the lease clock, ARGV[6] beats it (a retaken lease keeps its start).
_ACQUIRE = (
    "if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end "
    "if ARGV[3] ~= '' then redis.call('sadd', KEYS[2], ARGV[3]); redis.call('sadd', KEYS[5], ARGV[5]); "
    "redis.call('hset', KEYS[3], ARGV[3], ARGV[4]); redis.call('hset', KEYS[4], ARGV[3], ARGV[6]) end "
    "return 1"
)
# Renewal also stamps the chunk's beat: after the holder dies, the reaper reads how long
# it held the lease (beat - started).
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "if ARGV[3] ~= '' then redis.call('hset', KEYS[2], ARGV[3], ARGV[4]) end "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
# Only the owner releases, and only then does the chunk leave the running set: a stale
# worker must not hide a chunk whose new owner may still die.
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); "
    "if ARGV[2] ~= '' then redis.call('hdel', KEYS[3], ARGV[2]); redis.call('hdel', KEYS[4], ARGV[2]) end "
    "return redis.call('srem', KEYS[2], ARGV[2]) else return 0 end"
)
# Only the owner restarts the clock of its lease.
_RESTART_CLOCK = (
    "if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end "
    "redis.call('hset', KEYS[2], ARGV[2], ARGV[3]); redis.call('hset', KEYS[3], ARGV[2], ARGV[3]); return 1"
)
# Leave the running set only while no lease exists, in one step: a worker that took the
# lease since the scan keeps its chunk watched, and no duplicate message is sent for it.
# Also reads the lease clock, the evidence of how long the lost worker held the lease; the
# clock stays until the reaper has carried out its decision (drop_clock).
_FORGET_IF_UNLEASED = (
    "if redis.call('exists', KEYS[1]) == 1 then return false end "
    "if redis.call('srem', KEYS[2], ARGV[1]) == 0 then return false end "
    "local s = redis.call('hget', KEYS[3], ARGV[1]); local b = redis.call('hget', KEYS[4], ARGV[1]); "
    "return {s or '', b or ''}"
)
# A new owner's clock (its lease is live) is not the lost worker's: it stays.
_DROP_CLOCK_IF_UNLEASED = (
    "if redis.call('exists', KEYS[1]) == 1 then return 0 end "
    "redis.call('hdel', KEYS[2], ARGV[1]); redis.call('hdel', KEYS[3], ARGV[1]); return 1"
)


def now_ms() -> int:
    return int(time.time() * 1000)


def held_s(started_ms: int | None, until_ms: int | None) -> float:
    """The lease clock: seconds a lease was held, inf when unknown (no evidence)."""
    if started_ms is None or until_ms is None:
        return math.inf
    return (until_ms - started_ms) / 1000


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def run_owner(process: str, run: int) -> str:
    """The lease owner of one run: "gpu0@host:1234#7". Per run, not per process: a stale run
    (its lease ran out in a broker pause and another run of the chunk took it) must fail its
    renewal even in the same process."""
    return f"{process}#{run}"


def process_of(owner: str) -> str:
    """"gpu0@host:1234#7" (a run's lease owner) -> "gpu0@host:1234" (its process)."""
    return owner.partition("#")[0]


# --- leases and the running set -------------------------------------------------------


class Lease:
    """A short-lived key per running chunk, renewed by a heartbeat (fleet.coord.heartbeat).

    Celery over Redis redelivers a killed worker's chunk only after the visibility timeout
    (hours). A lease expires within a minute, so the reaper can hand the chunk to another
    worker long before that, and a duplicate delivery sees the live lease and skips.
    Only the chunk lease is watched (running set, lease clock); an assist lease is not.
    """

    def __init__(self, r: redis.Redis, job: str, index: int, owner: str, ttl_s: float, assist: bool = False):
        """`owner` names the run (`run_owner`), or the process where one run per process is meant."""
        self.r, self.job, self.index, self.owner = r, job, index, owner
        self.key = keys.assist(job, index) if assist else keys.lease(job, index)
        #: only the chunk lease puts the chunk in the running set the reaper watches
        self.watched = not assist
        self.ttl_ms = max(1, int(ttl_s * 1000))
        #: set by a failed renewal; the lease middleware retakes the lease or cancels the run
        self.lost = False
        #: ms epoch this owner last took the lease (the start of the lease clock)
        self.taken_ms: int | None = None

    @property
    def _member(self) -> str:
        return keys.member(self.job, self.index) if self.watched else ""

    def acquire(self) -> bool:
        """Take the lease; a watched one also enters the running set and stamps its start, atomically."""
        return self._take(now_ms())

    def retake(self) -> bool:
        """Take the lease again after it ran out under this run (a broker pause, a wipe): the
        lease clock keeps its start, so the crash evidence still times the whole run."""
        return self._take(self.taken_ms or now_ms())

    def _take(self, started: int) -> bool:
        ok = bool(self.r.eval(_ACQUIRE, 5, self.key, keys.running(), keys.lease_started(), keys.lease_beat(),
                              keys.jobs(), self.owner, self.ttl_ms, self._member, started, self.job, now_ms()))
        if ok:
            self.lost, self.taken_ms = False, started
        return ok

    def renew(self) -> bool:
        ok = bool(self.r.eval(_RENEW, 2, self.key, keys.lease_beat(), self.owner, self.ttl_ms,
                              self._member, now_ms()))
        if not ok and not self.lost:
            self.lost = True
            log.warning("lease on %s/%d lost (expired or taken over)", self.job, self.index)
        return ok

    def release(self) -> None:
        self.r.eval(_RELEASE, 4, self.key, keys.running(), keys.lease_started(), keys.lease_beat(),
                    self.owner, self._member)

    def restart_clock(self) -> None:
        """The run starts only now (it waited, leased, for its worker's other chunks to end so
        as to run alone): the lease clock, the crash evidence, starts again here, for the
        reaper (in Redis) and for a failure this owner sees."""
        if not self.watched:
            return
        now = now_ms()
        if self.r.eval(_RESTART_CLOCK, 3, self.key, keys.lease_started(), keys.lease_beat(), self.owner,
                       self._member, now):
            self.taken_ms = now

    def held_s(self) -> float:
        """How long this owner has held the lease now: the crash evidence of a failure it saw."""
        return held_s(self.taken_ms, now_ms())

    def holder(self) -> str | None:
        """The process holding the lease now (whichever run of it)."""
        value = _text(self.r.get(self.key))
        return process_of(value) if value else None


def holder(r: redis.Redis, job: str, index: int) -> str | None:
    """The process holding the chunk's lease now (whichever run of it)."""
    value = _text(r.get(keys.lease(job, index)))
    return process_of(value) if value else None


def leased(r: redis.Redis, job: str, index: int) -> bool:
    return bool(r.exists(keys.lease(job, index)))


def assisted(r: redis.Redis, job: str, index: int) -> bool:
    """Whether a helper holds the chunk's assist lease now."""
    return bool(r.exists(keys.assist(job, index)))


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


def watched_indexes(r: redis.Redis, job: str) -> set[int]:
    """Chunks of the job in the running set, leased or not: a reaper still has to decide those
    whose lease ran out."""
    members = [keys.parse_member(m.decode()) for m in r.smembers(keys.running())]
    return {i for j, i in members if j == job}


def scan_leases(r: redis.Redis) -> tuple[list[tuple[str, int]], int]:
    """The running set's chunks whose lease is gone, every job, and how many have a live one."""
    out, live = [], 0
    for raw in r.smembers(keys.running()):
        job, index = keys.parse_member(raw.decode())
        if r.exists(keys.lease(job, index)):
            live += 1
        else:
            out.append((job, index))
    return out, live


def forget_unleased(r: redis.Redis, job: str, index: int) -> float | None:
    """Remove a lease-less chunk from the running set; None if it has a lease (or is gone),
    else how long its lost worker held the lease (the lease clock; inf when unknown). The
    clock stays until `drop_clock`."""
    got = r.eval(_FORGET_IF_UNLEASED, 4, keys.lease(job, index), keys.running(), keys.lease_started(),
                 keys.lease_beat(), keys.member(job, index))
    if not got:
        return None
    started, beat = (_text(v) for v in got)
    return held_s(int(started) if started else None, int(beat) if beat else None)


def lease_clock(r: redis.Redis, job: str, index: int) -> tuple[int | None, int | None]:
    """When the chunk's lease was taken and last renewed (ms epoch; None when unknown): its last
    beat plus the TTL is when a lost lease ran out."""
    with r.pipeline(transaction=False) as p:
        p.hget(keys.lease_started(), keys.member(job, index))
        p.hget(keys.lease_beat(), keys.member(job, index))
        started, beat = p.execute()
    return (int(started) if started else None), (int(beat) if beat else None)


def drop_clock(r: redis.Redis, job: str, index: int) -> None:
    """The lost worker's lease clock, once the reaper has judged its chunk: until then a failed
    round leaves the evidence to the next (a clock read as unknown would clear the suspicion)."""
    r.eval(_DROP_CLOCK_IF_UNLEASED, 3, keys.lease(job, index), keys.lease_started(), keys.lease_beat(),
           keys.member(job, index))


def rewatch(r: redis.Redis, job: str, index: int) -> None:
    """Put a forgotten chunk back in the running set, for the next reaper round to retry."""
    r.sadd(keys.running(), keys.member(job, index))


def claim_recovery(r: redis.Redis, job: str, index: int, ttl_s: int) -> bool:
    """Whether this reaper is the one (for `ttl_s`) that recovers the lost chunk."""
    return bool(r.set(keys.requeue_guard(job, index), "1", nx=True, ex=ttl_s))


# --- queued marker and sending ----------------------------------------------------------


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
        send_chunk(self.app, self.queue, job, index, next_attempt(self.redis, job, index), PRIORITY_RECOVERY)
        metrics.CHUNKS_REQUEUED.inc()

    def enqueue(self, job: str, indexes: list[int]) -> list[int]:
        """First sends of a job's chunks; returns those sent. The marker is the ticket: of two
        enqueues running at once, only the one that sets it sends the chunk."""
        self.redis.sadd(keys.jobs(), job)
        spent = {int(i): int(n) for i, n in self.redis.hgetall(keys.attempts(job)).items()}
        sent = []
        for index in indexes:
            if self.redis.sadd(keys.queued(job), index):
                send_chunk(self.app, self.queue, job, index, attempt_after(spent.get(index, 0)), PRIORITY_NORMAL)
                sent.append(index)
        return sent


# --- counters ---------------------------------------------------------------------------

#: fleet.coord.retry's Spend values -> the counter each charges
_COUNTERS = {"attempt": keys.attempts, "crash": keys.crashes, "retry": keys.retries}


@dataclass(frozen=True)
class Counters:
    attempts: int = 0
    crashes: int = 0
    retries: int = 0


def counters(r: redis.Redis, job: str, index: int) -> Counters:
    with r.pipeline(transaction=False) as p:
        for counter in _COUNTERS.values():
            p.hget(counter(job), index)
        attempts, crashes, retries = p.execute()
    return Counters(int(attempts or 0), int(crashes or 0), int(retries or 0))


def charge(r: redis.Redis, job: str, index: int, spend: str, count: int) -> None:
    """Set the counter a decision spent ("attempt", "crash" or "retry") to `count`."""
    r.hset(_COUNTERS[spend](job), index, count)


def clear_crashes(r: redis.Redis, job: str, index: int) -> None:
    r.hdel(keys.crashes(job), index)


def forget(r: redis.Redis, job: str, index: int) -> None:
    """A person retries a quarantined chunk: it starts with a clean history."""
    with r.pipeline(transaction=False) as p:
        for counter in _COUNTERS.values():
            p.hdel(counter(job), index)
        p.execute()


def attempt_after(spent: int) -> int:
    """The attempt number a message carries once `spent` attempts are spent (logs and result stats)."""
    return 1 + spent


def next_attempt(r: redis.Redis, job: str, index: int) -> int:
    return attempt_after(int(r.hget(keys.attempts(job), index) or 0))


# --- running figures and the stats cache ------------------------------------------------


def publish_unstarted(r: redis.Redis, job: str, index: int, samples: int | None) -> None:
    """Samples a running chunk has not started yet (None: it stopped), for idle workers to assist."""
    if samples is None:
        r.hdel(keys.progress(job), index)
    else:
        r.hset(keys.progress(job), index, samples)


def unstarted(r: redis.Redis, job: str) -> dict[int, int]:
    return {int(i): int(n) for i, n in r.hgetall(keys.progress(job)).items()}


def add_made(r: redis.Redis, job: str, index: int, tokens: int, pace: dict[str, int] | None) -> None:
    """A running chunk made `tokens` more output tokens; `pace` is its owner run's own figures
    ({made, started_ms, samples, sample_tokens}: tokens since it started, samples it finished and
    their tokens); a helper's copy sets none."""
    with r.pipeline(transaction=False) as p:
        if tokens:
            p.hincrby(keys.made(job), index, tokens)
        if pace is not None:
            p.hset(keys.pace(job), index, json.dumps(pace | {"at_ms": now_ms()}))
        p.execute()


def end_pace(r: redis.Redis, job: str, index: int) -> None:
    r.hdel(keys.pace(job), index)


def made(r: redis.Redis, job: str) -> dict[int, int]:
    """Output tokens made per chunk over all its runs (committed chunks included)."""
    return {int(i): int(n) for i, n in r.hgetall(keys.made(job)).items()}


def made_by(r: redis.Redis, job: str, index: int) -> int:
    return int(r.hget(keys.made(job), index) or 0)


def paces(r: redis.Redis, job: str) -> dict[int, dict[str, int]]:
    """The current runs' {made, started_ms, at_ms} by chunk."""
    return {int(i): json.loads(v) for i, v in r.hgetall(keys.pace(job)).items()}


def cache_stats(r: redis.Redis, job: str, index: int, stats: ChunkStats) -> None:
    r.hset(keys.chunk_stats(job), index, stats.model_dump_json(exclude_unset=True))


def stats_cached(r: redis.Redis, job: str, index: int) -> bool:
    return bool(r.hexists(keys.chunk_stats(job), index))


def cached_stats(r: redis.Redis, job: str) -> dict[int, ChunkStats]:
    return {int(i): ChunkStats.model_validate_json(v) for i, v in r.hgetall(keys.chunk_stats(job)).items()}


# --- jobs -------------------------------------------------------------------------------


def known_jobs(r: redis.Redis) -> list[str]:
    """The jobs this broker knows (enqueued, or relearned from a running chunk's lease)."""
    return sorted(_text(m) or "" for m in r.smembers(keys.jobs()))


def drop_job(r: redis.Redis, job: str) -> None:
    r.srem(keys.jobs(), job)
