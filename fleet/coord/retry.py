"""The one failure policy: what a failed chunk run means, for the worker, the reaper and
`fleet enqueue` alike (docs/architecture.md, "Failures").

It reads only the error's class (`fleet.errors.Fault`) and the chunk's history:
- the chunk's own failures spend attempts (`max_attempts`, the job's option over the fleet's
  setting: `RetryPolicy.for_job`), a broken chunk object none;
- store, broker and network errors spend nothing and come back after a backoff;
- a worker loss or engine death is evidence against the worker and the set of chunks it
  ran, not each of them: a death within the crash window of taking a chunk's lease (the
  lease clock, fleet.coord.leases; a fraction of the job's median chunk run time, capped by
  `crash_window_s`) makes it a suspect, which runs alone after `solo_after` such deaths;
  only deaths in solo runs count, and two on two hosts (or `max_crashes` on one) quarantine it;
  a death while it waits to run alone (its worker's other chunks still running) counts for
  nothing and clears nothing; nor does a death within the window that no survivor saw
  (fleet.coord.witness: the whole host gone, as a spot preemption takes it), which counts
  against the host alone.
  A worker whose processes keep dying before finishing a batch is the suspect instead: its
  chunks are not suspected, and it is benched (`bench_after`);
- nothing is quarantined before its lease was taken.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, replace
from enum import Enum

import redis

from fleet.coord import counters, suspects
from fleet.coord.chunkstate import Quarantine
from fleet.coord.suspects import Suspicion, host_of, worker_of
from fleet.errors import Fault
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.options import JobOptions


class Action(Enum):
    #: send the chunk back to the queue (after `delay_s`)
    REQUEUE = "requeue"
    #: write failed/<index>.json; a person retries it with `fleet enqueue --retry-failed`
    QUARANTINE = "quarantine"


class Spend(Enum):
    """Which counter of the chunk's history the failure charges."""

    NOTHING = "nothing"
    ATTEMPT = "attempt"
    #: a death in a solo run: counts towards quarantine
    CRASH = "crash"
    #: a death beside other chunks: the chunk runs alone next, nothing counts
    SUSPECT = "suspect"
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
    #: the failed run ran alone in its process (fleet.worker.run.middleware.admission)
    solo: bool = False
    #: the process died while the chunk waited, leased, for its other chunks to end to run
    #: alone: it never ran, so its death is no evidence either way
    waiting: bool = False
    #: the worker whose process ran it ("" when unknown)
    worker: str = ""
    #: that worker's deaths in a row before finishing a batch, before this one
    worker_streak: int = 0
    #: the quick deaths the chunk was in since its last clean run
    suspicion: Suspicion = Suspicion()
    #: median run time of the job's committed chunks so far (None before the first)
    median_s: float | None = None
    #: another worker committed lately: a dying worker can be told apart from its chunks
    others_healthy: bool = False
    #: something that outlived the process saw it die on its own (its launcher reaped it, or the process
    #: itself saw its engine die); False: it vanished with its host, evidence against the host only
    witnessed: bool = True

    @classmethod
    def load(cls, r: redis.Redis, job: str, index: int, ran_s: float = math.inf, lease_taken: bool = True,
             solo: bool = False, owner: str | None = None, waiting: bool = False,
             witnessed: bool = True) -> History:
        """`ran_s` is the lease clock (fleet.coord.leases.held_s): how long the failed run held the lease
        (since it started alone, for a solo run); `owner` the process that ran it; `witnessed` whether its
        death was seen (fleet.coord.witness)."""
        spent = counters.spent(r, job, index)
        streak = suspects.streak_before_death(r, owner) if owner else None
        worker = worker_of(owner) if owner else ""
        return cls(spent.attempts, spent.crashes, spent.retries, ran_s, lease_taken, solo, waiting, worker,
                   streak or 0, suspects.suspicion(r, job, index), suspects.median_duration(r, job),
                   bool(worker) and suspects.healthy_others(r, worker), witnessed)


@dataclass(frozen=True)
class Decision:
    action: Action
    spend: Spend
    #: the count the spent counter reaches (what a quarantine record reports)
    count: int
    delay_s: float
    #: for logs and the quarantine record
    why: str
    #: a clean run: the chunk's crash suspicion ends
    clears: bool = False


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
    max_crashes: int = 3
    crash_window_s: float = 10.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    crash_window_fraction: float = 0.5
    bench_after: int = 3
    bench_backoff_s: float = 10.0
    bench_backoff_max_s: float = 300.0
    solo_after: int = 2

    @classmethod
    def from_settings(cls, settings: Settings) -> RetryPolicy:
        f = settings.failure
        return cls(f.max_attempts, f.max_crashes, f.crash_window_s, f.retry_backoff_s, f.retry_backoff_max_s,
                   f.crash_window_fraction, f.bench_after, f.bench_backoff_s, f.bench_backoff_max_s, f.solo_after)

    def for_job(self, options: JobOptions) -> RetryPolicy:
        """This policy with what the job's options set (fleet.store.options): a job's option over the
        fleet's setting, as dramatiq's message options over its actor's."""
        return replace(self, max_attempts=options.max_attempts or self.max_attempts,
                       max_crashes=options.max_crashes or self.max_crashes)

    def backoff(self, retries: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(retries, 16))

    def window(self, median_s: float | None) -> float:
        """Seconds after a start within which a death is evidence: a fraction of the job's
        median chunk run time, capped by the setting (the cap alone before any chunk is done)."""
        if median_s is None:
            return self.crash_window_s
        return min(self.crash_window_s, self.crash_window_fraction * median_s)

    def benched_for(self, streak: int, others_healthy: bool = True) -> float | None:
        """Seconds a worker takes no chunk after its last death, doubling with each more; None
        while it is not benched. After them it runs one chunk at a time until one commits. Only
        beside a healthy worker: when every worker dies alike (a fleet under random kills),
        benching them all would stall the job and single out none."""
        if streak < self.bench_after or not others_healthy:
            return None
        return min(self.bench_backoff_max_s, self.bench_backoff_s * 2.0 ** min(streak - self.bench_after, 16))

    def runs_alone(self, suspicion: Suspicion) -> bool:
        """A chunk in `solo_after` quick deaths beside others (or one alone) runs alone next:
        one death beside K chunks says little about any of them, and a solo run drains its worker."""
        return suspicion.deaths >= self.solo_after or bool(suspicion.solo)

    def _crash(self, history: History) -> Decision:
        if history.waiting:
            return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                            "died while it waited for its worker's other chunks to end, to run alone: it never ran, "
                            "so nothing is spent and its suspicion stands")
        window = self.window(history.median_s)
        if history.ran_s > window:
            return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                            f"ran {history.ran_s:.1f}s before the loss (window {window:.1f}s): not suspected, "
                            "no attempt spent", clears=True)
        if not history.witnessed:
            return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                            f"no one saw its process {history.worker or '?'} die: lost with its host, which is "
                            "evidence against the host only, never the chunk")
        if not history.solo:
            if history.worker_streak > 0 and history.others_healthy:
                return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                                f"its worker {history.worker} keeps dying before finishing a batch "
                                f"({history.worker_streak + 1} in a row): the worker is blamed, not its chunks")
            n = history.suspicion.deaths + 1
            nxt = "runs alone next" if n >= self.solo_after else "runs on another worker next"
            return Decision(Action.REQUEUE, Spend.SUSPECT, n, 0.0,
                            f"suspected with the rest of its worker's chunks: died {history.ran_s:.1f}s after "
                            f"starting it (window {window:.1f}s); {nxt}")
        if history.worker_streak >= self.bench_after and history.others_healthy:
            return Decision(Action.REQUEUE, Spend.NOTHING, 0, 0.0,
                            f"its worker {history.worker} is benched (its processes keep dying before finishing a "
                            "chunk): the worker is blamed, not the chunk it ran alone")
        n = history.crashes + 1
        hosts = {host_of(w) for w in (*history.suspicion.solo, history.worker) if w}
        if len(hosts) >= 2 or n >= self.max_crashes:
            return Decision(Action.QUARANTINE, Spend.CRASH, n, 0.0,
                            f"its process died within {window:.1f}s of starting it alone {n} times, "
                            f"on {len(hosts)} host(s): {', '.join(sorted(hosts))}")
        return Decision(Action.REQUEUE, Spend.CRASH, n, 0.0,
                        f"suspected: died {history.ran_s:.1f}s after starting it alone on {history.worker or '?'} "
                        f"({n} of {self.max_crashes} on one host, or 2 on two hosts)")

    def decide(self, cause: BaseException, history: History) -> Decision:
        fault = fault_of(cause)
        if not history.lease_taken or fault is Fault.INFRA:
            n = history.retries + 1
            return Decision(Action.REQUEUE, Spend.RETRY, n, self.backoff(history.retries),
                            "not the chunk's fault: no attempt spent")
        if fault is Fault.HOPELESS:
            return Decision(Action.QUARANTINE, Spend.ATTEMPT, history.attempts + 1, 0.0, "retrying cannot help")
        if fault is Fault.CRASH:
            return self._crash(history)
        n = history.attempts + 1
        if n >= self.max_attempts:
            return Decision(Action.QUARANTINE, Spend.ATTEMPT, n, 0.0, f"failed {n} time(s)")
        return Decision(Action.REQUEUE, Spend.ATTEMPT, n, 0.0, f"attempt {n} of {self.max_attempts} failed")


def record(r: redis.Redis, job: str, index: int, decision: Decision, worker: str = "") -> None:
    """Write what the decision spent; a loss after a long run clears the crash suspicion."""
    if decision.spend in (Spend.CRASH, Spend.SUSPECT):
        suspects.note_death(r, job, index, worker, solo=decision.spend is Spend.CRASH)
    if decision.spend in (Spend.ATTEMPT, Spend.CRASH, Spend.RETRY):
        counters.charge(r, job, index, decision.spend.value, decision.count)
    elif decision.clears:
        suspects.clear_suspicion(r, job, index)


def settle(r: redis.Redis, store: Store, policy: RetryPolicy, job: str, index: int, cause: BaseException,
           history: History, worker: str | None = None) -> Decision:
    """Decide a failed run, record what it spends, and write the quarantine record when that
    is the decision; the caller requeues (after its own backoff) otherwise. The worker and the
    reaper both come through here, so a failure is settled the same way wherever it is seen.
    The quarantine record is written before the spend: if it fails, nothing is counted, and the
    reaper's next round (which keeps the evidence) decides the same death once more."""
    decision = policy.decide(cause, history)
    if decision.action is Action.QUARANTINE:
        Quarantine(index=index, error=f"{cause} ({decision.why})", error_type=type(cause).__name__,
                   attempts=decision.count, traceback="".join(traceback.format_exception(cause)),
                   worker=worker).write(store, job)
    record(r, job, index, decision, history.worker or worker or "")
    return decision
