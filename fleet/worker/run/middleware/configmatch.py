"""The worker's own configuration against the job's: a worker whose engine would shape
output differently (another model snapshot, dtype, context length, engine kwargs, sim
parameters) must not run the job, or one result could mix two configurations."""

from __future__ import annotations

import logging
import threading

from fleet.coord.mismatch import clear_mismatch, record_mismatch
from fleet.engines.identity import config_mismatch
from fleet.worker.process.context import WorkerContext
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import HandedBack, Outcome

log = logging.getLogger(__name__)

#: how long a mismatched worker keeps the slot idle after handing a chunk back behind every
#: waiting chunk, so it does not take it straight back while matching workers are there to run it
MISMATCH_HOLD_S = 5.0


class ConfigGate(Middleware[None]):
    """Hand the chunk back, no attempt spent; say it once as CRITICAL and record the worker
    for `fleet status` (fleet.coord.mismatch)."""

    order = Order.GATE

    def __init__(self, ctx: WorkerContext):
        super().__init__(ctx)
        #: jobs this worker found mismatched (logged once each, cleared when they match again)
        self._mismatched: set[str] = set()
        self._lock = threading.Lock()

    def before(self, run: ChunkRun, state: None) -> Outcome | None:
        if run.manifest is None or not self.ctx.identity:
            return None
        ctx = self.ctx
        differences = config_mismatch(ctx.identity, run.manifest)
        with self._lock:
            first = differences is not None and run.job not in self._mismatched
            cleared = differences is None and run.job in self._mismatched
            (self._mismatched.add if differences else self._mismatched.discard)(run.job)
        if cleared:
            clear_mismatch(ctx.redis, ctx.name)
        if differences is None:
            return None
        record_mismatch(ctx.redis, ctx.name, run.job, ctx.identity_hash, differences)
        if first:
            log.critical("worker %s cannot run job %r: its engine configuration differs from the job's "
                         "(job's -> this worker's): %s; handing its chunks back, restart it with the job's settings",
                         ctx.name, run.job, "; ".join(differences))
        return HandedBack("engine configuration differs from the job's", hold_s=MISMATCH_HOLD_S, tail=True)
