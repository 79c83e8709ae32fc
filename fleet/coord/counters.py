"""The one owner of a chunk's attempt, crash and retry counters in Redis: what
fleet.coord.retry spent on the chunk (keys.attempts, crashes, retries)."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from fleet.coord import keys

#: fleet.coord.retry's Spend values -> the counter each charges
_COUNTERS = {"attempt": keys.attempts, "crash": keys.crashes, "retry": keys.retries}


@dataclass(frozen=True)
class Counters:
    attempts: int = 0
    crashes: int = 0
    retries: int = 0


def spent(r: redis.Redis, job: str, index: int) -> Counters:
    """What was spent on the chunk so far, per counter."""
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


def spent_attempts(r: redis.Redis, job: str) -> dict[int, int]:
    """Attempts spent per chunk of the job (chunks with none are absent)."""
    return {int(i): int(n) for i, n in r.hgetall(keys.attempts(job)).items()}


def next_attempt(r: redis.Redis, job: str, index: int) -> int:
    return attempt_after(int(r.hget(keys.attempts(job), index) or 0))

