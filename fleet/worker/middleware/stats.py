"""Cache the result header in Redis so `fleet status` needs no store scan of records."""

from __future__ import annotations

import json

from fleet.coord import keys
from fleet.worker.chunk import ChunkRun
from fleet.worker.middleware.base import Middleware, Order
from fleet.worker.outcome import Committed, Outcome


class StatsMiddleware(Middleware[None]):
    order = Order.STATS

    def after(self, run: ChunkRun, state: None, outcome: Outcome) -> None:
        if isinstance(outcome, Committed):
            self.ctx.redis.hset(keys.chunk_stats(run.job), run.index, json.dumps(outcome.stats))
