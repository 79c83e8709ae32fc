"""The chunk lease: one live owner per chunk, renewed by the worker's heartbeat."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from fleet.coord import keys
from fleet.coord.leases import Lease, holder
from fleet.worker.chunk import ChunkRun
from fleet.worker.middleware.base import Middleware, Order
from fleet.worker.outcome import Failed, HandedBack, Outcome, Skipped

log = logging.getLogger(__name__)


@dataclass
class LeaseState:
    lease: Lease | None = None


class LeaseMiddleware(Middleware[LeaseState]):
    """Take the lease or skip the delivery; retake a lease lost while alive, or cancel at
    once if another worker holds it; release at the end."""

    order = Order.LEASE

    def new_state(self, run: ChunkRun) -> LeaseState:
        return LeaseState()

    def key(self, run: ChunkRun) -> str | None:
        return None  # the chunk lease, watched by the reaper

    def before(self, run: ChunkRun, state: LeaseState) -> Outcome | None:
        ctx = self.ctx
        if not run.assist:
            ctx.redis.srem(keys.queued(run.job), run.index)  # the message is off the queue
        lease = Lease(ctx.redis, run.job, run.index, ctx.owner, ctx.settings.lease_ttl_s, key=self.key(run))
        if not lease.acquire():
            return Skipped(f"lease {lease.key} held by {ctx.redis.get(lease.key)!r}")
        state.lease = lease
        run.leased = not run.assist
        ctx.heartbeat.add(lease)
        return None

    def progress(self, run: ChunkRun, state: LeaseState) -> Outcome | None:
        lease = state.lease
        if lease is None or not lease.lost:
            return None
        if lease.acquire():
            log.warning("lease on %s expired while running: taken again", run.name)
            return None
        return Skipped(f"lease on {run.name} taken by {holder(self.ctx.redis, run.job, run.index)!r}: run cancelled")

    def after(self, run: ChunkRun, state: LeaseState, outcome: Outcome) -> None:
        if state.lease is not None:
            self.ctx.heartbeat.discard(state.lease)
            state.lease.release()


class AssistLeaseMiddleware(LeaseMiddleware):
    """An idle worker helps a straggler: one helper per chunk, held by its own expiring key."""

    def key(self, run: ChunkRun) -> str | None:
        return keys.assist(run.job, run.index)

    def after(self, run: ChunkRun, state: LeaseState, outcome: Outcome) -> None:
        super().after(run, state, outcome)
        if isinstance(outcome, Failed):
            log.warning("assist of chunk %s failed (the owner goes on): %s", run.name, outcome.cause)
        elif isinstance(outcome, HandedBack):
            log.info("assist of chunk %s stopped (%s): the owner goes on", run.name, outcome.reason)
