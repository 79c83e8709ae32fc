"""Admission: a suspected chunk runs alone, on another worker than the one it last died on;
a benched worker (its processes keep dying before finishing a batch) backs off, then runs
one chunk at a time until one commits (docs/architecture.md, "Failures"). The judgement
is fleet.coord.retry's; the record fleet.coord.suspects'.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

from fleet import metrics
from fleet.coord import suspects
from fleet.coord.suspects import WorkerHealth
from fleet.worker.process.context import WorkerContext
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Committed, Failed, HandedBack, Outcome

log = logging.getLogger(__name__)

#: seconds a slot stays idle after handing back a chunk it may not run now
HOLD_S = 1.0
#: at most this long per hand-back while benched, so the bench's end is noticed
BENCH_HOLD_S = 5.0
#: seconds the worker trusts its read of its own death record
HEALTH_MAX_AGE_S = 1.0


@dataclass
class AdmissionState:
    entered: bool = False
    suspect: bool = False
    #: the run claimed its process to run alone (waiting for the others to end, then running)
    claimed: bool = False
    #: when the run started alone (None: it ran beside others)
    alone_since: float | None = None


class AdmissionMiddleware(Middleware[AdmissionState]):
    order = Order.ADMISSION

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self._lock = threading.Lock()
        self._health: tuple[float, WorkerHealth, float | None] = (-HEALTH_MAX_AGE_S, WorkerHealth(ctx.name), None)
        self._said_benched = False

    def new_state(self, run: ChunkRun) -> AdmissionState:
        return AdmissionState()

    def health(self) -> tuple[WorkerHealth, float | None]:
        """This worker's death record, and its bench time (None: not benched)."""
        now = time.monotonic()
        with self._lock:
            at, health, bench_s = self._health
            if now - at >= HEALTH_MAX_AGE_S:
                r, name = self.ctx.redis, self.ctx.name
                health = suspects.worker_health(r, name)
                bench_s = self.ctx.policy.benched_for(health.streak, health.streak > 0 and
                                                      suspects.healthy_others(r, name))
                self._health = (now, health, bench_s)
                metrics.WORKER_DEATHS.labels(kind="all").set(health.deaths)
                metrics.WORKER_DEATHS.labels(kind="in_a_row").set(health.streak)
                metrics.WORKER_BENCHED.set(int(bench_s is not None))
            return health, bench_s

    def before(self, run: ChunkRun, state: AdmissionState) -> Outcome | None:
        ctx, slots = self.ctx, self.ctx.run_slots
        if run.assist:  # a helper never runs beside a chunk that must run alone
            if not slots.enter(run):
                return HandedBack("a chunk runs alone on this worker")
            state.entered = True
            return None
        health, bench_s = self.health()
        if bench_s is not None:
            self._say_benched(health, bench_s)
            left = health.at + bench_s - time.time()
            if left > 0:
                return HandedBack(f"worker {ctx.name} is benched for {left:.0f}s more", hold_s=min(left, BENCH_HOLD_S))
        suspicion = suspects.suspicion(ctx.redis, run.job, run.index)
        since = time.time() - suspicion.at
        hold_s = ctx.settings.failure.suspect_hold_s
        if suspicion and (bench_s is not None or suspicion.last == ctx.name) and since < hold_s:
            return HandedBack(f"suspected chunk, last died on {suspicion.last}: left to other workers for "
                              f"{hold_s - since:.0f}s", hold_s=HOLD_S)
        alone = ctx.policy.runs_alone(suspicion) or bench_s is not None
        if not slots.enter(run, alone):
            return HandedBack("a chunk runs alone on this worker", hold_s=HOLD_S)
        state.entered, state.suspect, state.claimed = True, bool(suspicion), alone
        if alone:  # a death while it waits for the others is no evidence either way
            suspects.wait_solo(ctx.redis, run.job, run.index, ctx.owner)
        suspects.note_holder(ctx.redis, run.job, run.index, ctx.owner)
        if alone:
            if not slots.wait_alone(run, ctx.stopping):
                return HandedBack(f"on shutdown of worker {ctx.name}")
            lease = ctx.heartbeat.held(run.job, run.index)
            if lease is not None:
                lease.restart_clock()  # the wait for the others is not this chunk's run
            suspects.start_solo(ctx.redis, run.job, run.index, ctx.owner)
            state.alone_since = time.time()
            log.warning("chunk %s runs alone on %s: %s", run.name, ctx.name,
                        f"suspected ({suspicion.deaths} quick death(s), last on {suspicion.last})" if suspicion
                        else "this worker is benched")
        return None

    def after(self, run: ChunkRun, state: AdmissionState, outcome: Outcome) -> Outcome | None:
        """A failure of a run alone says so (the retry policy counts only those deaths)."""
        if not state.entered:
            return None
        ctx = self.ctx
        ctx.run_slots.leave(run)
        alone = state.alone_since is not None
        if state.claimed:
            suspects.end_solo(ctx.redis, run.job, run.index, ctx.owner)
        if not run.assist:
            suspects.drop_holder(ctx.redis, run.job, run.index, ctx.owner)
        if isinstance(outcome, Failed):
            return replace(outcome, solo=alone)
        if not isinstance(outcome, Committed):
            return None
        if ctx.run_slots.committed():
            suspects.note_commit(ctx.redis, ctx.owner)
        if not run.assist and not run.resumed:
            suspects.note_duration(ctx.redis, run.job, time.time() - (state.alone_since or run.started))
        if state.suspect:
            suspects.clear_suspicion(ctx.redis, run.job, run.index)
            log.info("suspected chunk %s committed%s: suspicion cleared", run.name, " alone" if alone else "")
        return None

    def _say_benched(self, health: WorkerHealth, bench_s: float) -> None:
        with self._lock:
            if self._said_benched:
                return
            self._said_benched = True
        log.critical("worker %s is benched: %d of its processes in a row died before finishing a batch (%d deaths "
                     "in all); it takes no chunk until %.0fs after the last death, then one at a time until one "
                     "commits. Check this host (GPU, driver, memory).", health.worker, health.streak, health.deaths,
                     bench_s)
