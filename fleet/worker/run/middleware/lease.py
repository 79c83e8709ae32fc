"""The chunk lease: one live owner per chunk, renewed by the worker's heartbeat."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from fleet.coord import chunkqueue, leases
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.leases import Lease, run_owner
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Failed, HandedBack, Outcome, Skipped

log = logging.getLogger(__name__)


@dataclass
class LeaseState:
    lease: Lease | None = None
    #: this run holds the chunk in its process (fleet.worker.process.context.OwnedRuns)
    owned: bool = False


class LeaseMiddleware(Middleware[LeaseState]):
    """Take the lease or skip the delivery; retake a lease lost while alive, or cancel at
    once if another worker holds it; release at the end. The lease names this run, not its
    process, and a delivery of a chunk this process already runs is skipped: one process
    never runs two copies of a chunk. A failure seen while the chunk lease was held carries
    how long it was held (`Failed.leased_s`, the lease clock): the only run a failure may be
    charged to, and the crash evidence fleet.coord.retry reads."""

    order = Order.LEASE
    #: a helper's lease (fleet.coord.keys.assist) is not watched by the reaper
    assist = False

    def new_state(self, run: ChunkRun) -> LeaseState:
        return LeaseState()

    def before(self, run: ChunkRun, state: LeaseState) -> Outcome | None:
        ctx = self.ctx
        if not self.assist:
            chunkqueue.taken(ctx.redis, run.job, run.index)  # the message is off the queue
            if not ctx.owned.claim(run.job, run.index, run.serial):
                return Skipped(f"chunk {run.name} runs in this process already")
            state.owned = True
        ttl_s = LeaseClock.of(ctx.settings).ttl_s
        lease = Lease(ctx.redis, run.job, run.index, run_owner(ctx.owner, run.serial), ttl_s, assist=self.assist,
                      store=ctx.queue.store)
        if not lease.acquire():
            return Skipped(f"lease {lease.key} held by {lease.holder()!r}")
        state.lease = lease
        ctx.heartbeat.add(lease)
        return None

    def progress(self, run: ChunkRun, state: LeaseState) -> Outcome | None:
        lease = state.lease
        if lease is None or not lease.lost:
            return None
        if lease.retake():
            log.warning("lease on %s expired while running (a broker pause or wipe): taken again", run.name)
            return None
        return Skipped(f"lease on {run.name} taken by {leases.holder(self.ctx.redis, run.job, run.index)!r}: "
                       "run cancelled")

    def after(self, run: ChunkRun, state: LeaseState, outcome: Outcome) -> Outcome | None:
        if state.owned:
            self.ctx.owned.release(run.job, run.index, run.serial)
        lease = state.lease
        if lease is None:
            return None
        self.ctx.heartbeat.discard(lease)
        held = lease.held_s()
        lease.release()
        if isinstance(outcome, Failed) and lease.watched:
            return replace(outcome, leased_s=held)
        return None


class AssistLeaseMiddleware(LeaseMiddleware):
    """An idle worker helps a straggler: one helper per chunk, held by its own expiring key."""

    assist = True

    def after(self, run: ChunkRun, state: LeaseState, outcome: Outcome) -> Outcome | None:
        super().after(run, state, outcome)
        if isinstance(outcome, Failed):
            log.warning("assist of chunk %s failed (the owner goes on): %s", run.name, outcome.cause)
        elif isinstance(outcome, HandedBack):
            log.info("assist of chunk %s stopped (%s): the owner goes on", run.name, outcome.reason)
        return None
