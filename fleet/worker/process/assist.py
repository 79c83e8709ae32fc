"""The assist policy: once the queue is empty and the engine has room, an idle worker runs a
copy of the most lagging chunk of another worker; the first committed copy wins
(docs/architecture.md, "Keeping the engine full")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from fleet.coord import chunkqueue
from fleet.coord.stragglers import straggler
from fleet.worker.process.context import WorkerContext

log = logging.getLogger(__name__)

class Assister:
    """One background loop per worker process; one assist at a time, each chunk at most once."""

    def __init__(self, ctx: WorkerContext, max_running: int, inflight: Callable[[], int],
                 run_assist: Callable[[str, int], object]):
        self.ctx, self.max_running = ctx, max_running
        #: requests the engine runs or queues now
        self.inflight = inflight
        #: runs one assist copy of a chunk to its end
        self.run_assist = run_assist
        self._assisted: set[tuple[str, int]] = set()
        #: the assist copy running now, if any (a stopping process waits for it: `join`)
        self._run: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        threading.Thread(target=self._loop, args=(stop,), name="fleet-assist", daemon=True).start()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.ctx.settings.assist_poll_s):
            try:
                if not self.idle():
                    continue
                if chunkqueue.waiting(self.ctx.redis, self.ctx.queue.queue):
                    continue
                target = self.straggler()
                if target is not None:
                    self.begin(*target)
            except Exception as e:  # noqa: BLE001 - the next poll tries again
                log.warning("assist check failed: %s", e)

    def idle(self) -> bool:
        """Room for a copy: none runs, the engine has room, no suspect runs alone, and the worker is not
        stopping nor under a SIGTERM's notice: a copy begun then is handed back at its end, every token it
        made made twice (its owner runs the same samples)."""
        ctx = self.ctx
        if self.assisting or ctx.stopping.is_set() or ctx.draining.is_set() or ctx.run_slots.alone:
            return False
        return self.inflight() < self.max_running

    def straggler(self) -> tuple[str, int] | None:
        """The running chunk of another worker with the most unstarted samples; never a suspect
        (it may kill its helper, and it runs alone to settle that). Reads each job's top few
        (figures.stragglers), not every running chunk: the fleet's idle workers ask this every
        assist poll at a job's end."""
        return straggler(self.ctx.redis, self.ctx.queue.store, self.ctx.owner, self._assisted)

    @property
    def assisting(self) -> bool:
        """An assist copy runs now (its thread is alive from `begin` until the copy has ended)."""
        return self._run is not None and self._run.is_alive()

    def begin(self, job: str, index: int) -> None:
        """Run one assist copy of the chunk on its own thread (one at a time)."""
        self._run = threading.Thread(target=self._assist, args=(job, index), name="fleet-assist-run", daemon=True)
        self._run.start()

    def join(self, timeout_s: float) -> bool:
        """Wait for the assist copy running now to end, so its middleware's `after` runs before the
        process exits: a stopped copy flushes what it made since its last checkpoint, or drops its
        checkpoints when the owner committed meanwhile (a copy cut off by the exit left a checkpoint of
        a committed chunk behind). False when it is still running after `timeout_s`."""
        run = self._run
        if run is not None:
            run.join(timeout_s)
        return run is None or not run.is_alive()

    def _assist(self, job: str, index: int) -> None:
        self._assisted.add((job, index))
        log.info("queue empty: assisting straggler chunk %s/%d", job, index)
        self.run_assist(job, index)
