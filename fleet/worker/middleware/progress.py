"""Progress for assist: publish how much a chunk lacks, and notice when a helper (or the
owner) committed first, so the other copy stops at once."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fleet.coord import chunks
from fleet.store.layout import result_key
from fleet.worker.chunk import ChunkRun
from fleet.worker.middleware.base import Middleware, Order
from fleet.worker.outcome import Outcome, Superseded


@dataclass
class ProgressState:
    last_publish: float = 0.0


class ProgressMiddleware(Middleware[ProgressState]):
    order = Order.PROGRESS

    def new_state(self, run: ChunkRun) -> ProgressState:
        return ProgressState()

    def progress(self, run: ChunkRun, state: ProgressState) -> Outcome | None:
        now = time.monotonic()
        if now - state.last_publish < self.ctx.settings.assist_poll_s / 2:
            return None
        state.last_publish = now
        r = self.ctx.redis
        if not run.assist:
            chunks.publish_unstarted(r, run.job, run.index, max(0, run.remaining() - run.inflight))
        # The committing run caches its stats in Redis: a cheap sign, confirmed by the store,
        # that lasts after a helper that finished first has released its assist key.
        if chunks.stats_cached(r, run.job, run.index) and self.ctx.store.exists(result_key(run.job, run.index)):
            return Superseded(f"chunk {run.name} committed elsewhere first: dropped this copy")
        return None

    def after(self, run: ChunkRun, state: ProgressState, outcome: Outcome) -> None:
        if not run.assist:
            chunks.publish_unstarted(self.ctx.redis, run.job, run.index, None)
