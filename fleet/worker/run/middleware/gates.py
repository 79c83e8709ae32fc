"""Gates: cheap checks that end a run before any work, without blame."""

from __future__ import annotations

import logging
import threading

from fleet.coord import chunkqueue
from fleet.coord.chunkstate import delete_checkpoints
from fleet.coord.mismatch import clear_mismatch, record_misplaced
from fleet.store.layout import result_key
from fleet.worker.process.context import WorkerContext
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import HandedBack, Outcome, Skipped

log = logging.getLogger(__name__)

#: how long a worker whose store lacks a job's manifest keeps the slot idle after handing a
#: chunk of it back, so the store's other workers take it first
MISPLACED_HOLD_S = 5.0


class StopGate(Middleware[None]):
    """A stopping worker (grace over, engine dead) hands chunks back, before and while running."""

    order = Order.STOP

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        return self.progress(run, state)

    def progress(self, run: ChunkRun, state: None) -> Outcome | None:
        if self.ctx.stopping.is_set():
            return HandedBack(f"on shutdown of worker {self.ctx.name}")
        return None


class ManifestGate(Middleware[None]):
    """The job's manifest must be in this worker's store. Each store's chunks come through a
    queue of their own (fleet.coord.broker.chunk_queue), so a chunk whose manifest this store
    lacks means the worker is misconfigured, not unlucky: its store is not the one its URL names
    to the rest of the store's fleet (a local path on another host), or the job's prefix was
    deleted. It says so once as CRITICAL, is listed by `fleet status` (fleet.coord.mismatch),
    and hands the chunk back behind every waiting chunk, keeping the slot idle a while, so the
    store's other workers take it first; nothing leased, no attempt or retry spent."""

    order = Order.MANIFEST

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        #: jobs whose manifest this worker's store lacked (said once each)
        self._missing: set[str] = set()
        self._lock = threading.Lock()

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        ctx = self.ctx
        run.manifest = ctx.manifests.get(run.job)
        with self._lock:
            first = run.manifest is None and run.job not in self._missing
            found = run.manifest is not None and run.job in self._missing
            (self._missing.discard if run.manifest else self._missing.add)(run.job)
        if found:
            clear_mismatch(ctx.redis, ctx.name)  # the job's manifest is here now (enqueued again)
        if run.manifest is not None:
            return None
        record_misplaced(ctx.redis, ctx.name, run.job, ctx.store.url)
        if first:
            log.critical("worker %s is misconfigured for job %r: its store %s holds no manifest of the job, which "
                         "came through this store's queue (is FLEET_STORE_URL the store `fleet enqueue` used, on "
                         "this host?); handing its chunks back to the store's other workers", ctx.name, run.job,
                         ctx.store.url)
        return HandedBack(f"no manifest of the job in this worker's store {ctx.store.url}", hold_s=MISPLACED_HOLD_S,
                          tail=True)


class ResultGate(Middleware[None]):
    """A delivery of a chunk that has its result (redelivery after commit, a stall-watch
    duplicate) does nothing but drop the checkpoints the committing run may have left. It
    runs before every gate that hands back, so a done chunk is never sent round again; a
    result only ever appears, so checking before the lease is safe."""

    order = Order.RESULT

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        ctx = self.ctx
        if ctx.store.exists(result_key(run.job, run.index)):
            if not run.assist:
                chunkqueue.taken(ctx.redis, run.job, run.index)  # the message is off the queue
            delete_checkpoints(ctx.store, run.job, run.index)
            return Skipped("already has a result")
        return None
