"""Progress: report how much a chunk lacks (for assist) and the tokens it made as they stream
(for `fleet status`: tok/s before anything is committed, tokens made twice), and notice when a
helper (or the owner) committed first, so the other copy stops at once.

The figures go to the broker with the process's next heartbeat, one round trip for every
chunk it runs (fleet.coord.heartbeat); what the beat read back says whether the chunk was
committed elsewhere. This middleware never asks the broker while the run goes on."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.coord import figures, leases
from fleet.coord.leases import Lease
from fleet.store.layout import result_key
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Outcome, Superseded


@dataclass
class ProgressState:
    last_report: float = 0.0
    #: the run's tokens already handed to the heartbeat
    reported: int = 0
    started_ms: int = 0


class ProgressMiddleware(Middleware[ProgressState]):
    order = Order.PROGRESS

    def new_state(self, run: ChunkRun) -> ProgressState:
        return ProgressState(started_ms=leases.now_ms())

    def before(self, run: ChunkRun, state: ProgressState) -> Outcome | None:
        run.made_before = figures.made_by(self.ctx.redis, run.job, run.index)
        return None

    def _lease(self, run: ChunkRun) -> Lease | None:
        return self.ctx.heartbeat.held(run.job, run.index, assist=run.assist)

    def report(self, run: ChunkRun, state: ProgressState, lease: Lease) -> None:
        made = run.tokens_made
        pace = unstarted = None
        if not run.assist:  # a helper's copy has no pace of its own and assists no one
            fresh = [row for row in list(run.finished.values()) if row.get("worker") == run.worker]
            pace = {"made": made, "started_ms": state.started_ms, "samples": len(fresh),
                    "sample_tokens": sum(row.get("completion_tokens", 0) for row in fresh)}
            unstarted = max(0, run.remaining() - run.inflight)
        self.ctx.heartbeat.report(lease, made - state.reported, pace, unstarted)
        state.reported = made

    def progress(self, run: ChunkRun, state: ProgressState) -> Outcome | None:
        now = time.monotonic()
        if now - state.last_report < self.ctx.settings.assist_poll_s / 2:
            return None
        state.last_report = now
        lease = self._lease(run)
        if lease is None:
            return None
        self.report(run, state, lease)
        tally = self.ctx.heartbeat.tally(lease)
        # The committing run caches its stats in Redis (the beat reads it): a cheap sign, confirmed
        # by the store, that lasts after a helper that finished first has released its assist key.
        if tally is not None and tally.committed and self.ctx.store.exists(result_key(run.job, run.index)):
            return Superseded(f"chunk {run.name} committed elsewhere first: dropped this copy")
        return None

    def after(self, run: ChunkRun, state: ProgressState, outcome: Outcome) -> None:
        lease = self._lease(run)
        pending = self.ctx.heartbeat.settle(lease) if lease is not None else 0
        figures.end_run(self.ctx.redis, run.job, run.index, pending + run.tokens_made - state.reported,
                       owner=not run.assist)
