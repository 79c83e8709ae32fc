"""A dead engine stops its worker, so the supervisor starts a fresh one and this process
takes no more chunks. The death is counted against the worker (fleet.coord.suspects)
before the failed chunk's own fate is decided (fleet.coord.retry)."""

from __future__ import annotations

from fleet.coord.recovery import count_process_death
from fleet.errors import EngineError
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Failed, Outcome


class CrashMiddleware(Middleware[None]):
    order = Order.CRASH

    def after(self, run: ChunkRun, state: None, outcome: Outcome) -> None:
        if isinstance(outcome, Failed) and isinstance(outcome.cause, EngineError):
            self.ctx.stopping.set()
            self.ctx.restart(f"engine failed ({outcome.cause})")
            if outcome.leased_s is not None:  # it held the chunk lease: a death holding chunks
                count_process_death(self.ctx.redis, self.ctx.policy, self.ctx.owner)
