"""Leases: a short-lived Redis key per running chunk, renewed by a heartbeat.

Celery over Redis redelivers a killed worker's chunk only after the visibility timeout
(hours). A lease expires within a minute, so the reaper can hand the chunk to another
worker long before that, and a duplicate delivery sees the live lease and skips.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from fleet.coord import keys

log = logging.getLogger(__name__)

# Renewal also stamps the chunk's beat: after the holder dies, the reaper reads how long
# it ran the chunk (beat - started), the evidence fleet.coord.retry blames a crash on.
_RENEW = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then "
    "if ARGV[3] ~= '' then redis.call('hset', KEYS[2], ARGV[3], ARGV[4]) end "
    "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
)
# A watched lease also (re)registers its job: a broker that lost everything relearns the
# job from the chunks still running, and the reapers' stall watch finds the rest again.
_ACQUIRE = (
    "if not redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end "
    "if ARGV[3] ~= '' then redis.call('sadd', KEYS[2], ARGV[3]); redis.call('sadd', KEYS[5], ARGV[5]); "
    "redis.call('hset', KEYS[3], ARGV[3], ARGV[4]); redis.call('hset', KEYS[4], ARGV[3], ARGV[4]) end "
    "return 1"
)
# Only the owner releases, and only then does the chunk leave the running set: a stale
# worker must not hide a chunk whose new owner may still die.
_RELEASE = (
    "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('del', KEYS[1]); "
    "if ARGV[2] ~= '' then redis.call('hdel', KEYS[3], ARGV[2]); redis.call('hdel', KEYS[4], ARGV[2]) end "
    "return redis.call('srem', KEYS[2], ARGV[2]) else return 0 end"
)


def now_ms() -> int:
    return int(time.time() * 1000)


class Lease:
    def __init__(self, r: redis.Redis, job: str, index: int, owner: str, ttl_s: float, key: str | None = None):
        self.r, self.job, self.index, self.owner = r, job, index, owner
        self.key = key or keys.lease(job, index)
        #: only the chunk lease puts the chunk in the running set the reaper watches
        self.watched = key is None
        self.ttl_ms = max(1, int(ttl_s * 1000))
        #: set by a failed renewal; the lease middleware retakes the lease or cancels the run
        self.lost = False

    @property
    def _member(self) -> str:
        return keys.member(self.job, self.index) if self.watched else ""

    def acquire(self) -> bool:
        """Take the lease; a watched one also enters the running set and stamps its start, atomically."""
        ok = bool(self.r.eval(_ACQUIRE, 5, self.key, keys.running(), keys.lease_started(), keys.lease_beat(),
                              keys.jobs(), self.owner, self.ttl_ms, self._member, now_ms(), self.job))
        if ok:
            self.lost = False
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


def holder(r: redis.Redis, job: str, index: int) -> str | None:
    value = r.get(keys.lease(job, index))
    return value.decode() if isinstance(value, bytes) else value


class Heartbeat:
    """One thread per worker process renewing every lease it holds."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._leases: set[Lease] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, lease: Lease) -> None:
        with self._lock:
            self._leases.add(lease)

    def discard(self, lease: Lease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            with self._lock:
                leases = list(self._leases)
            for lease in leases:
                try:
                    lease.renew()
                except Exception as e:  # one failed renewal must not end the thread: every lease would expire
                    log.warning("heartbeat for %s/%d failed: %s", lease.job, lease.index, e)
