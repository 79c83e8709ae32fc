"""The chunk task body: read chunk, generate, commit. Policies live in hooks.py."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

from pydantic import ValidationError

from fleet.broker import PRIORITY_RECOVERY, send_chunk
from fleet.errors import ChunkCorrupt, ChunkReleased, ChunkSuperseded, FleetError
from fleet.layout import chunk_key, decode_lines, result_key
from fleet.records import InputRecord
from fleet.results import chunk_stats, encode_result
from fleet.worker.chunk import ChunkRun
from fleet.worker.generate import generate_chunk
from fleet.worker.hooks import ChunkHook, Hooks, Skip
from fleet.worker.runtime import Runtime

log = logging.getLogger(__name__)
POLL_S = 0.5


def read_chunk(rt: Runtime, run: ChunkRun) -> list[InputRecord]:
    key = chunk_key(run.job, run.index)
    rows = decode_lines(rt.store.get(key), key)
    try:
        return [InputRecord.model_validate(row) for row in rows]
    except ValidationError as e:
        raise ChunkCorrupt(f"{key} holds an invalid record: {e}") from e


def wait_generated(rt: Runtime, run: ChunkRun, hooks: Hooks, ran: list[ChunkHook]) -> None:
    """Wait for the engine, running progress hooks; hand the chunk back if told to stop."""
    future = rt.host.submit(generate_chunk(run, rt.engine, rt.host.gate))
    while True:
        try:
            future.result(timeout=POLL_S)
            return
        except concurrent.futures.TimeoutError:
            hooks.progress(run, ran)
            if rt.release_now.is_set() and not run.assist:
                future.cancel()
                raise ChunkReleased(f"worker {run.worker} stopping: chunk {run.name} handed back") from None
            if run.extras.get("superseded") or (run.assist and rt.release_now.is_set()):
                future.cancel()
                raise ChunkSuperseded(f"chunk {run.name} committed elsewhere first: dropped this copy") from None


def mean_of(rows: list[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in rows if r.get(field) is not None]
    return round(sum(values) / len(values), 4) if values else None


def commit(rt: Runtime, run: ChunkRun) -> None:
    rows = list(run.finished.values())
    expected = run.expected()
    if len(rows) != expected:
        raise FleetError(f"chunk {run.name} has {len(rows)} of {expected} samples; not committing")
    stats = {
        "job": run.job,
        "chunk": run.index,
        "records": len(run.records),
        **chunk_stats(rows),
        "resumed": run.resumed,
        "seconds": round(time.time() - run.started, 3),
        "assist": run.assist,
        "spec_accept_length": mean_of(rows, "spec_accept_length"),
        "started": run.started,
        "finished": time.time(),
        "worker": run.worker,
        "attempt": run.attempt,
    }
    won = rt.store.put_if_absent(result_key(run.job, run.index), encode_result(stats, rows))
    if won:
        run.committed = True
        run.extras["stats"] = stats
    else:
        run.extras["lost_race"] = True
        log.warning("chunk %s already committed by another worker: dropped this copy", run.name)


def run_chunk(rt: Runtime, job: str, index: int, attempt: int = 1, assist: bool = False) -> dict[str, Any]:
    if rt.release_now.is_set() and not assist:
        # Stopping, or the engine is gone: hand the delivery straight back, no attempt spent.
        send_chunk(rt.app, rt.settings.queue, job, index, attempt, PRIORITY_RECOVERY)
        return {"job": job, "index": index, "committed": False, "skipped": "worker stopping", "error": None}
    run = ChunkRun(job=job, index=index, attempt=attempt, worker=rt.name, assist=assist)
    hooks = rt.assist_hooks if assist else rt.hooks
    ran: list[ChunkHook] = []
    exc: BaseException | None = None
    rt.active.add(run)
    try:
        hooks.before(run, ran)
        run.manifest = rt.manifest(job)
        run.records = read_chunk(rt, run)
        wait_generated(rt, run, hooks, ran)
        commit(rt, run)
    except Skip as skip:
        run.skipped = str(skip)
        log.info("chunk %s skipped: %s", run.name, skip)
    except Exception as e:  # every failure is decided by OutcomeHook, never lost
        exc = e
    finally:
        hooks.after(run, ran, exc)
        rt.active.discard(run)
    if isinstance(exc, ChunkSuperseded):
        log.info("%s", exc)
    elif exc is not None and not isinstance(exc, ChunkReleased):
        log.error("chunk %s attempt %d failed: %s: %s", run.name, run.attempt, type(exc).__name__, exc)
    return {
        "job": job,
        "index": index,
        "committed": run.committed,
        "skipped": run.skipped,
        "error": None if exc is None else f"{type(exc).__name__}: {exc}",
    }
