"""Gates: cheap checks that end a run before any work, without blame."""

from __future__ import annotations

from fleet.coord import chunkqueue
from fleet.coord.chunkstate import delete_checkpoints
from fleet.errors import ManifestMissing
from fleet.store.layout import result_key
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Failed, HandedBack, Outcome, Skipped


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
    """The job's manifest must be in this worker's store. Another store's job (a shared
    broker, a wrong FLEET_STORE_URL) fails before the lease with an infra fault: the retry
    policy requeues it after a doubling backoff, spending a retry, never an attempt, and
    never quarantines it. A failure, not a hand-back: a worker that keeps meeting the job
    backs off further each time instead of taking it straight back."""

    order = Order.MANIFEST

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        run.manifest = self.ctx.manifests.get(run.job)
        if run.manifest is None:
            return Failed(ManifestMissing(
                f"job {run.job!r} has no manifest in this worker's store {self.ctx.store.url}: "
                "chunk requeued with backoff (is FLEET_STORE_URL the one `fleet enqueue` used?)"))
        return None


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
