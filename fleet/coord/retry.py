"""The one failure policy: what a failed chunk run means, for the worker, the reaper and
`fleet enqueue` alike (docs/architecture.md, "Failures").

It reads only the error's class (`fleet.errors.Fault`) and the chunk's history:
- the chunk's own failures spend attempts (`max_attempts`), a broken chunk object none;
- store, broker and network errors spend nothing and come back after a backoff;
- a worker loss or engine death is blamed on the chunk only on evidence: the process died
  within `crash_window_s` of taking the chunk's lease (the lease clock, fleet.coord.chunks).
  Those suspicions have their own, larger budget (`max_crashes`), and a loss after a longer
  run clears them, so random kills of a fleet never quarantine a healthy chunk;
- nothing is quarantined before its lease was taken.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass
from enum import Enum

import redis

from fleet.coord import chunks
from fleet.coord.chunkstate import Quarantine
from fleet.errors import Fault
from fleet.settings import Settings
from fleet.store import Store


class Action(Enum):
    #: send the chunk back to the queue (after `delay_s`)
    REQUEUE = "requeue"
    #: write failed/<index>.json; a person retries it with `fleet enqueue --retry-failed`
    QUARANTINE = "quarantine"


class Spend(Enum):
    """Which counter of the chunk's history the failure charges."""

    NOTHING = "nothing"
    ATTEMPT = "attempt"
    CRASH = "crash"
    RETRY = "retry"


@dataclass(frozen=True)
class History:
    """What Redis remembers of a chunk's past runs, plus the facts of the one that failed."""

    attempts: int = 0
    crashes: int = 0
    retries: int = 0
    #: seconds the failed run had run when it failed (inf when unknown: no evidence)
    ran_s: float = math.inf
    lease_taken: bool = True

    @classmethod
    def load(cls, r: redis.Redis, job: str, index: int, ran_s: float = math.inf, lease_taken: bool = True) -> History:
        """`ran_s` is the lease clock (fleet.coord.chunks.held_s): how long the failed run held the lease."""
        spent = chunks.counters(r, job, index)
        return cls(spent.attempts, spent.crashes, spent.retries, ran_s, lease_taken)


@dataclass(frozen=True)
class Decision:
    action: Action
    spend: Spend
    #: the count the spent counter reaches (what a quarantine record reports)
    count: int
    delay_s: float
    #: for logs and the quarantine record
    why: str


def fault_of(cause: BaseException) -> Fault:
    """The error class decides; a Redis or OS (network) error is never the chunk's fault."""
    fault = getattr(type(cause), "fault", None)
    if isinstance(fault, Fault):
        return fault
    if isinstance(cause, redis.RedisError | OSError | TimeoutError):
        return Fault.INFRA
    return Fault.CHUNK


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    max_crashes: int = 5
    crash_window_s: float = 10.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        return cls(settings.max_attempts, settings.max_crashes, settings.crash_window_s,
                   settings.retry_backoff_s, settings.retry_backoff_max_s)

    def backoff(self, retries: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(retries, 16))

    def decide(self, cause: BaseException, history: History) -> Decision:
        fault = fault_of(cause)
        if not history.lease_taken or fault is Fault.INFRA:
            n = history.retries + 1
            return Decision(Action.REQUEUE, Spend.RETRY, n, self.backoff(history.retries),
                            "not the chunk's fault: no attempt spent")
        if fault is Fault.HOPELESS:
            return Decision(Action.QUARANTINE, Spend.ATTEMPT, history.attempts + 1, 0.0, "retrying cannot help")
        if fault is Fault.CRASH:
            if history.ran_s > self.crash_window_s:
                return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                                f"ran {history.ran_s:.0f}s before the loss: not suspected, no attempt spent")
            n = history.crashes + 1
            if n >= self.max_crashes:
                return Decision(Action.QUARANTINE, Spend.CRASH, n, 0.0,
                                f"its process died within {self.crash_window_s:g}s of taking it {n} times in a row")
            return Decision(Action.REQUEUE, Spend.CRASH, n, 0.0,
                            f"suspected: died {history.ran_s:.1f}s after taking it ({n} of {self.max_crashes})")
        n = history.attempts + 1
        if n >= self.max_attempts:
            return Decision(Action.QUARANTINE, Spend.ATTEMPT, n, 0.0, f"failed {n} time(s)")
        return Decision(Action.REQUEUE, Spend.ATTEMPT, n, 0.0, f"attempt {n} of {self.max_attempts} failed")


def record(r: redis.Redis, job: str, index: int, decision: Decision) -> None:
    """Write what the decision spent; a loss after a long run clears the crash suspicion."""
    if decision.spend is not Spend.NOTHING:
        chunks.charge(r, job, index, decision.spend.value, decision.count)
    elif decision.action is Action.REQUEUE:
        chunks.clear_crashes(r, job, index)


def settle(r: redis.Redis, store: Store, policy: RetryPolicy, job: str, index: int, cause: BaseException,
           history: History, worker: str | None = None) -> Decision:
    """Decide a failed run, record what it spends, and write the quarantine record when that
    is the decision; the caller requeues (after its own backoff) otherwise. The worker and the
    reaper both come through here, so a failure is settled the same way wherever it is seen."""
    decision = policy.decide(cause, history)
    record(r, job, index, decision)
    if decision.action is Action.QUARANTINE:
        Quarantine(index=index, error=f"{cause} ({decision.why})", error_type=type(cause).__name__,
                   attempts=decision.count, traceback="".join(traceback.format_exception(cause)),
                   worker=worker).write(store, job)
    return decision
