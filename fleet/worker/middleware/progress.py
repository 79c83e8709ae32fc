"""Progress: publish how much a chunk lacks (for assist) and the tokens it made as they stream
(for `fleet status`: tok/s before anything is committed, tokens made twice), and notice when a
helper (or the owner) committed first, so the other copy stops at once."""

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
    #: the run's tokens already added to the chunk's count in Redis
    published_made: int = 0
    started_ms: int = 0


class ProgressMiddleware(Middleware[ProgressState]):
    order = Order.PROGRESS

    def new_state(self, run: ChunkRun) -> ProgressState:
        return ProgressState(started_ms=chunks.now_ms())

    def before(self, run: ChunkRun, state: ProgressState) -> Outcome | None:
        run.made_before = chunks.made_by(self.ctx.redis, run.job, run.index)
        return None

    def publish_made(self, run: ChunkRun, state: ProgressState) -> None:
        made = run.tokens_made
        fresh = [row for row in list(run.finished.values()) if row.get("worker") == run.worker]
        pace = None if run.assist else {"made": made, "started_ms": state.started_ms, "samples": len(fresh),
                                         "sample_tokens": sum(row.get("completion_tokens", 0) for row in fresh)}
        chunks.add_made(self.ctx.redis, run.job, run.index, made - state.published_made, pace)
        state.published_made = made

    def progress(self, run: ChunkRun, state: ProgressState) -> Outcome | None:
        now = time.monotonic()
        if now - state.last_publish < self.ctx.settings.assist_poll_s / 2:
            return None
        state.last_publish = now
        r = self.ctx.redis
        self.publish_made(run, state)
        if not run.assist:
            chunks.publish_unstarted(r, run.job, run.index, max(0, run.remaining() - run.inflight))
        # The committing run caches its stats in Redis: a cheap sign, confirmed by the store,
        # that lasts after a helper that finished first has released its assist key.
        if chunks.stats_cached(r, run.job, run.index) and self.ctx.store.exists(result_key(run.job, run.index)):
            return Superseded(f"chunk {run.name} committed elsewhere first: dropped this copy")
        return None

    def after(self, run: ChunkRun, state: ProgressState, outcome: Outcome) -> None:
        self.publish_made(run, state)
        if not run.assist:
            chunks.publish_unstarted(self.ctx.redis, run.job, run.index, None)
            chunks.end_pace(self.ctx.redis, run.job, run.index)
