"""The chunk task: read chunk, generate, commit. It knows nothing of leases, retries or
checkpoints (fleet.worker.middleware) and reports how it ended as an Outcome."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any

from fleet.errors import FleetError
from fleet.store import Store
from fleet.store.layout import read_chunk, result_key
from fleet.store.results import ChunkStats, encode_result, sample_counts
from fleet.worker.chunk import ChunkRun
from fleet.worker.enginehost import EngineHost
from fleet.worker.generate import generate_chunk
from fleet.worker.outcome import Committed, Outcome, Superseded

POLL_S = 0.5


def mean_of(rows: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in rows if r.get(field) is not None]
    return round(sum(values) / len(values), 4) if values else None


class ChunkTask:
    def __init__(self, store: Store, host: EngineHost):
        self.store, self.host = store, host

    def __call__(self, run: ChunkRun, poll: Callable[[], Outcome | None]) -> Outcome:
        run.records = read_chunk(self.store, run.job, run.index)
        stop = self.generate(run, poll)
        return stop if stop is not None else self.commit(run)

    def generate(self, run: ChunkRun, poll: Callable[[], Outcome | None]) -> Outcome | None:
        """Wait for the engine, polling the middleware; stop at once when one says so."""
        future = self.host.submit(generate_chunk(run, self.host.engine, self.host.gate, self.host.clock))
        while True:
            # wait(), not result(timeout=): on Python 3.11 an engine's own asyncio.TimeoutError
            # is concurrent.futures.TimeoutError, and would read as "not done yet" forever.
            concurrent.futures.wait([future], timeout=POLL_S)
            if future.done():
                future.result()  # raises what the generation raised
                return None
            stop = poll()
            if stop is not None:
                future.cancel()
                return stop

    def commit(self, run: ChunkRun) -> Outcome:
        rows = list(run.finished.values())
        expected = run.expected()
        if len(rows) != expected:
            raise FleetError(f"chunk {run.name} has {len(rows)} of {expected} samples; not committing")
        stats = self.stats(run, rows)
        if self.store.put_if_absent(result_key(run.job, run.index), encode_result(stats, rows)):
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
            tokens_continued=sum(sum(r.get("continued_at") or ()) for r in rows),
            seconds=round(time.time() - run.started, 3),
            assist=run.assist,
            spec_accept_length=mean_of(rows, "spec_accept_length"),
            started=run.started,
            finished=time.time(),
            worker=run.worker,
            attempt=run.attempt,
        )
