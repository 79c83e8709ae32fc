"""Checkpoints: finished records and every running sample's new output ids, flushed every N
seconds, at once when the worker is told to stop, and when the run ends without a result; a
rerun generates only what is missing and continues each sample where its ids stop. Deleted
only once the chunk's result exists. `resume` row keeps finished records only and chunk keeps
nothing: the peers' coarser ways, settings of fleet so a benchmark can set them side by side."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fleet.coord import suspects
from fleet.coord.chunkstate import delete_checkpoints
from fleet.errors import ChunkCorrupt, ObjectMissing, StoreError
from fleet.store.checkpoints import Segment, encode_checkpoint, longest_prefixes, read_checkpoint
from fleet.store.layout import checkpoint_key, checkpoint_prefix, result_key
from fleet.worker.run.chunk import ChunkRun, sample_key, turn_key
from fleet.worker.run.middleware.base import Middleware, Order
from fleet.worker.run.outcome import Outcome, result_exists

log = logging.getLogger(__name__)


@dataclass
class CheckpointState:
    last_flush: float = field(default_factory=time.monotonic)
    #: sticky: a helper that finished first has released its key by the time we look
    assisted: bool = False
    #: the worker was told to stop (SIGTERM) and this run flushed for it
    drained: bool = False


class CheckpointMiddleware(Middleware[CheckpointState]):
    order = Order.CHECKPOINT

    def new_state(self, run: ChunkRun) -> CheckpointState:
        return CheckpointState(assisted=run.assist)

    def before(self, run: ChunkRun, state: CheckpointState) -> Outcome | None:
        if self.ctx.settings.resume == "chunk":
            return None
        store = self.ctx.store
        segments: list[Segment] = []
        for key in store.list(checkpoint_prefix(run.job, run.index)):
            try:
                found = read_checkpoint(store.get(key), key, self.ctx.identity_hash)
            except (ChunkCorrupt, ObjectMissing) as e:
                log.warning("ignoring unreadable checkpoint %s: %s", key, e)
                continue
            if found is None:
                log.warning("ignoring checkpoint %s: made under another engine configuration", key)
                continue
            for row in found.rows:
                run.finished.setdefault(sample_key(row["id"], row["sample"]), row)
            for row in found.turns:
                run.turns.setdefault(sample_key(row["id"], row["sample"]), {}).setdefault(row["turn"], row)
            segments += found.segments
        for key in run.finished.keys() & run.turns.keys():
            del run.turns[key]
        run.partials = {turn_key(i, n, t): p for (i, n, t), p in longest_prefixes(segments).items()
                        if sample_key(i, n) not in run.finished}  # fmt: skip
        if run.partials and not run.assist and suspects.suspicion(self.ctx.redis, run.job, run.index):
            # An engine died while this chunk ran. A continuation's prefill (prompt + ids made) is the
            # likeliest request to bring it down: vLLM's CPU build once died of every seeded one. So the
            # suspect's running samples start again from token 0, their ids made twice, instead of the
            # same prefill killing engine after engine until the whole chunk is quarantined; the chunk's
            # finished rows are kept (docs/architecture.md, "Failures")
            log.warning("chunk %s is suspected of killing an engine: %d running sample(s) start again from token 0 "
                        "(%d tokens made twice) instead of being continued", run.name, len(run.partials),
                        sum(len(p.ids) for p in run.partials.values()))
            run.restarted += len(run.partials)
            run.partials = {}
        if run.partials and self.ctx.settings.resume == "row":
            # The peers' row-level resume: a running sample's ids are made again from token 0
            run.restarted += len(run.partials)
            run.partials = {}
        run.resumed = len(run.finished)
        if run.resumed or run.partials or run.turns:
            log.info("chunk %s resumes with %d checkpointed samples, %d finished turns of running ones and %d "
                     "partial ones (%d tokens)", run.name, run.resumed, sum(map(len, run.turns.values())),
                     len(run.partials), sum(len(p.ids) for p in run.partials.values()))
        return None

    def flush(self, run: ChunkRun, state: CheckpointState, last: bool = False) -> None:
        """Finished rows and running samples' new ids in one object. What the store refuses is
        sent again at the next flush; the last flush of a run that ends without a result goes to
        the spool instead (fleet.worker.process.storewriter), which this worker commits once the store answers.
        Segments are taken before finished turns (turns = all): a turn's segments are never
        stored before the turn that precedes it, so a later turn never continues from ids made
        under another prompt."""
        segments = run.segments() if self.ctx.settings.resume == "token" else []
        fresh, turns = run.take_fresh(), run.take_fresh_turns()
        state.last_flush = time.monotonic()
        if not (fresh or turns or segments):
            return
        # Nanoseconds name it: unique across flushes, runs and restarts of a same-named worker.
        key = checkpoint_key(run.job, run.index, time.time_ns(), run.worker)
        data = encode_checkpoint(fresh, self.ctx.identity_hash, [seg for _, seg in segments], turns)
        try:
            spooled = self.ctx.writer.checkpoint(key, data, last)
        except StoreError:
            run.keep_fresh(fresh, turns)
            raise
        if spooled:
            log.warning("chunk %s: the store refuses its checkpoint: spooled for this worker to commit", run.name)
        with run.lock:
            for live, seg in segments:
                live.stored(seg)

    def progress(self, run: ChunkRun, state: CheckpointState) -> Outcome | None:
        now, settings = time.monotonic(), self.ctx.settings
        if settings.resume == "chunk":
            return None
        # While another worker assists the chunk, checkpoint at the assist cadence, so the
        # helper starts from fresh records and the two waste little work on each other. The
        # heartbeat reads the helper's assist lease with its renewals (fleet.coord.heartbeat).
        assist_flush_s = settings.assist_poll_s / 2
        if not state.assisted:
            lease = self.ctx.heartbeat.held(run.job, run.index)
            tally = self.ctx.heartbeat.tally(lease) if lease is not None else None
            state.assisted = tally is not None and tally.assisted
        age = now - state.last_flush
        draining = self.ctx.draining.is_set() and not state.drained
        if draining or age >= settings.checkpoint_interval_s or (state.assisted and age >= assist_flush_s):
            state.drained = state.drained or draining
            self.flush(run, state)
            if draining:
                self.ctx.drain_clock.flushed()
        return None

    def after(self, run: ChunkRun, state: CheckpointState, outcome: Outcome) -> None:
        try:
            self._keep_or_drop(run, state, outcome)
        finally:
            if self.ctx.draining.is_set() and not state.drained:
                # ended before its drain flush (committed, failed): the notice's clock counts it, or the
                # worker would wait half its notice for a flush that never comes (fleet.worker.process.notice)
                state.drained = True
                self.ctx.drain_clock.flushed()

    def _keep_or_drop(self, run: ChunkRun, state: CheckpointState, outcome: Outcome) -> None:
        if result_exists(outcome) or self.committed_elsewhere(run):
            delete_checkpoints(self.ctx.store, run.job, run.index)
        elif self.ctx.settings.resume == "chunk":
            return  # the peers' chunk-level resume: what this run made is made again
        else:  # failed, handed back, or cancelled: keep what this run generated
            self.flush(run, state, last=True)

    def committed_elsewhere(self, run: ChunkRun) -> bool:
        """A run stopped without a result (a SIGTERM, a helper's copy cancelled) whose chunk
        another worker has committed meanwhile: its checkpoint would be kept for a chunk that
        no one runs again. Not known (the store refuses) counts as not committed: flush."""
        try:
            return self.ctx.store.exists(result_key(run.job, run.index))
        except StoreError:
            return False
