"""Cache the result header in Redis so `fleet status` needs no store scan of records."""

from __future__ import annotations

from fleet.coord import figures
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Committed, Outcome


class StatsMiddleware(Middleware[None]):
    order = Order.STATS

    def after(self, run: ChunkRun, state: None, outcome: Outcome) -> None:
        if isinstance(outcome, Committed):
            figures.cache_stats(self.ctx.redis, run.job, run.index, outcome.stats)
