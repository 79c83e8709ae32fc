"""Outcome of an owner's run: requeue a handed-back chunk, and let fleet.coord.retry decide what
a failure means (requeue with or without an attempt spent, or quarantine), under the job's own
options over the fleet's settings (fleet.store.options)."""

from __future__ import annotations

import logging
import math

import redis

from fleet.coord.retry import Action, History, settle
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Failed, HandedBack, Outcome

log = logging.getLogger(__name__)


class RetryMiddleware(Middleware[None]):
    order = Order.RETRY

    def after(self, run: ChunkRun, state: None, outcome: Outcome) -> None:
        if isinstance(outcome, HandedBack):
            # the runtime logs the hand-back (log_outcome)
            self._requeue(run, outcome.delay_s, outcome.hold_s, recovery=not outcome.tail)
        elif isinstance(outcome, Failed):
            self._failed(run, outcome)

    def _failed(self, run: ChunkRun, outcome: Failed) -> None:
        ctx, cause, leased_s = self.ctx, outcome.cause, outcome.leased_s
        try:
            history = History.load(ctx.redis, run.job, run.index, ran_s=math.inf if leased_s is None else leased_s,
                                   lease_taken=leased_s is not None, solo=outcome.solo, owner=ctx.owner)
        except redis.RedisError:
            history = History(lease_taken=False)  # the broker is down: the safest reading
        policy = ctx.policy.for_job(ctx.options.get(run.job))
        decision = settle(ctx.redis, ctx.store, policy, run.job, run.index, cause, history, run.worker)
        # The run's one failure line: it says what the policy decided, what was spent and why
        if decision.action is Action.QUARANTINE:
            log.error("chunk %s failed (%s: %s): quarantined, %s", run.name, type(cause).__name__, cause,
                      decision.why)
            return
        log.warning("chunk %s failed (%s: %s): requeued in %.1fs, %s",
                    run.name, type(cause).__name__, cause, decision.delay_s, decision.why)
        self._requeue(run, decision.delay_s)

    def _requeue(self, run: ChunkRun, delay_s: float, hold_s: float = 0.0, recovery: bool = True) -> None:
        # Backoff holds this slot, not the lease (released already): a worker whose store or
        # broker fails takes fewer chunks, and a stopping worker requeues at once.
        self.ctx.stopping.wait(delay_s)
        self.ctx.queue.requeue(run.job, run.index, recovery=recovery,
                               priority=0 if recovery else self.ctx.options.get(run.job).priority)
        self.ctx.stopping.wait(hold_s)
