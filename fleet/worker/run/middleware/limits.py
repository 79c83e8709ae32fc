"""A job's limits (fleet.store.options: deadline, token_budget): a chunk of a job past its
deadline or over its token budget is not started. It is handed back behind the waiting chunks,
no lease taken and no attempt spent, its checkpoints kept (nothing generated is lost), and the
slot idles a while so the fleet does not spin on it; it starts once `fleet job set` moves the
deadline or raises the budget. Chunks already running finish: a budget is spent when the tokens
made reach it, so a job may end over it by what its running chunks make (docs/architecture.md,
"Job options")."""

from __future__ import annotations

import threading
import time

from fleet.coord.figures import made_total
from fleet.worker.process.context import WorkerContext
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import HandedBack, Outcome

#: seconds a slot idles after handing back a held chunk: how soon a moved deadline or a raised
#: budget is acted on, against how often a held job's chunks go round the queue
HELD_HOLD_S = 5.0
#: seconds a worker trusts its sum of a job's tokens made (one HGETALL over the job's chunks)
MADE_MAX_AGE_S = 1.0


class LimitsGate(Middleware[None]):
    order = Order.LIMITS

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        self._made: dict[str, tuple[float, int]] = {}
        self._lock = threading.Lock()

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        options = self.ctx.options.get(run.job)
        if options.deadline is None and options.token_budget is None:
            return None
        why = options.held(self.made(run.job) if options.token_budget is not None else None)
        return None if why is None else HandedBack(f"job {run.job} is {why}", hold_s=HELD_HOLD_S, tail=True)

    def made(self, job: str) -> int:
        """Output tokens the engines made for the job so far, every run of every chunk."""
        now = time.monotonic()
        with self._lock:
            at, total = self._made.get(job, (-MADE_MAX_AGE_S, 0))
        if now - at < MADE_MAX_AGE_S:
            return total
        total = made_total(self.ctx.redis, job)
        with self._lock:
            self._made[job] = (now, total)
        return total
