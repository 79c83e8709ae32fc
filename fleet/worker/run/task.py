"""The chunk task: read chunk, generate, commit. It knows nothing of leases, retries or
checkpoints (fleet.worker.run.middleware) and reports how it ended as an Outcome."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fleet.audit.job import JobAudit
from fleet.coord.leaseclock import LeaseClock
from fleet.errors import FleetError
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.layout import read_chunk, result_key
from fleet.store.results import ChunkStats, encode_result, sample_counts
from fleet.worker.process.bell import Bell
from fleet.worker.process.enginehost import EngineHost
from fleet.worker.process.storewriter import StoreWriter
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.generate import generate_chunk
from fleet.worker.run.outcome import Committed, Outcome, Superseded

#: seconds between a run's looks at its middleware where no bell wakes it (a worker's runs have one:
#: fleet.worker.process.bell, and poll at `poll_s_of` the settings)
POLL_S = 0.5
#: a poll this much later than its interval is logged: hand-backs, checkpoints and tokens made waited
LATE_POLL_S = 1.0
log = logging.getLogger(__name__)


def mean_of(rows: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in rows if r.get(field) is not None]
    return round(sum(values) / len(values), 4) if values else None


def poll_s_of(settings: Settings) -> float:
    """A run's poll where the bell wakes it: as often as the heartbeat carries what the middleware
    report (its figures, a lease lost, a copy committed elsewhere), a helper looks for fresh
    checkpoints or a checkpoint is due, whichever is soonest, and never more often than POLL_S."""
    return max(POLL_S, min(LeaseClock.of(settings).beat_s, settings.assist_poll_s, settings.checkpoint_interval_s))


class ChunkTask:
    def __init__(self, store: Store, host: EngineHost, writer: StoreWriter | None = None, bell: Bell | None = None,
                 poll_s: float = POLL_S):  # fmt: skip
        self.store, self.host = store, host
        #: where the result goes (spooled while the store refuses it, where the worker has a spool)
        self.writer = writer or StoreWriter(store)
        #: wakes a waiting run at once when the process stops or drains (none: it sees that at its next poll)
        self.bell = bell or Bell()
        self.poll_s = poll_s

    def __call__(self, run: ChunkRun, poll: Callable[[], Outcome | None]) -> Outcome:
        run.records = read_chunk(self.store, run.job, run.index)
        stop = self.generate(run, poll)
        return stop if stop is not None else self.commit(run, poll)

    def generate(self, run: ChunkRun, poll: Callable[[], Outcome | None]) -> Outcome | None:
        """Wait for the engine, polling the middleware every `poll_s`, and at once when the generation
        ends or the bell rings; stop at once when a middleware says so."""
        future = self.host.submit(generate_chunk(run, self.host.engine, self.host.gate, self.host.clock))
        woken = threading.Event()
        future.add_done_callback(lambda _: woken.set())
        with self.bell.listening(woken):
            while True:
                began = time.monotonic()
                woke = self.wait(woken, self.poll_s)
                if not woke and (late := time.monotonic() - began - self.poll_s) >= LATE_POLL_S:
                    log.warning("chunk %s: its poll came %.1fs late (this thread did not run)", run.name, late)
                woken.clear()  # a ring from here on wakes the next wait: the poll below reads what rang
                if future.done():
                    # result(), not a wait on it: on Python 3.11 an engine's own asyncio.TimeoutError is
                    # concurrent.futures.TimeoutError, and would read as "not done yet" forever.
                    future.result()  # raises what the generation raised
                    return None
                stop = poll()
                if stop is not None:
                    future.cancel()
                    return stop

    @staticmethod
    def wait(woken: threading.Event, timeout: float) -> bool:
        """True when woken (the generation ended, the bell rang), False when the poll is due."""
        return woken.wait(timeout)

    def commit(self, run: ChunkRun, poll: Callable[[], Outcome | None] = lambda: None) -> Outcome:
        rows = list(run.finished.values())
        expected = run.expected()
        if len(rows) != expected:
            raise FleetError(f"chunk {run.name} has {len(rows)} of {expected} samples; not committing")
        stats = self.stats(run, rows).model_copy(update=self.audit(run, rows))
        key, data = result_key(run.job, run.index), encode_result(stats, rows)
        got = self.writer.commit(key, data, poll)
        if not isinstance(got, bool):
            log.warning("chunk %s stops with its result spooled: %s", run.name, got)
            return got
        return self.outcome(run, stats, got)

    def audit(self, run: ChunkRun, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Every sample checked against its own ids before the result is written (fleet.audit), with the
        engine's own decoding, where the engine keeps its tokenizer work; a defect is logged and named in
        the result's header. The audit never holds back a commit: a failure to run it is logged."""
        engine = self.host.engine
        assert run.manifest is not None
        audit = JobAudit(run.manifest, engine.decode, prompts=False)  # its prompt counts are this run's own
        records = {r.pos: r for r in run.records}
        try:
            counts, _ = self.host.submit(engine.off_loop(audit.check, rows, records, engine.context_budget)).result()
        except Exception as e:  # noqa: BLE001 - the tokens are made; the export audits them again
            log.warning("chunk %s: the audit could not run: %s: %s", run.name, type(e).__name__, e)
            return {"context": engine.context_budget}
        for defect in counts.defects:
            log.error("audit: %s", defect)
        return {"audit_checked": counts.checked, "audit_failed": counts.failed, "audit_defects": counts.defects,
                "context": engine.context_budget}

    @staticmethod
    def outcome(run: ChunkRun, stats: ChunkStats, written: bool) -> Outcome:
        if written:
            return Committed(stats)
        return Superseded(f"chunk {run.name} already committed by another worker: dropped this copy")

    @staticmethod
    def stats(run: ChunkRun, rows: list[dict[str, Any]]) -> ChunkStats:
        return ChunkStats(
            job=run.job,
            chunk=run.index,
            records=len(run.records),
            **sample_counts(rows),
            resumed=run.resumed,
            tokens_made=run.made_before + run.tokens_made,
            tokens_continued=sum(sum(t.get("continued_at") or ()) for r in rows for t in r.get("turns") or [r]),
            seconds=round(time.time() - run.started, 3),
            assist=run.assist,
            spec_accept_length=mean_of(rows, "spec_accept_length"),
            started=run.started,
            finished=time.time(),
            worker=run.worker,
            attempt=run.attempt,
            samples_restarted=run.restarted,
        )
