"""Policies around the chunk task, as small hooks (after dramatiq's middleware).

`before` runs in list order and may raise Skip; `progress` runs while the chunk
generates; `after` runs in reverse order for every hook whose `before` ran. A hook's
own failure is logged and never breaks the worker.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from typing import TYPE_CHECKING

import redis

from fleet import keys, metrics
from fleet.broker import PRIORITY_RECOVERY, send_chunk
from fleet.chunkstate import Quarantine
from fleet.errors import ChunkCorrupt, ChunkReleased, ChunkSuperseded, EngineError, ObjectMissing
from fleet.layout import decode_lines, encode_lines, partial_key, partial_prefix, result_key
from fleet.leases import Lease
from fleet.worker.chunk import ChunkRun, sample_key

if TYPE_CHECKING:
    from fleet.worker.runtime import Runtime

log = logging.getLogger(__name__)


class Skip(Exception):
    """The delivered chunk needs no work here (done, or leased by a live worker)."""


class ChunkHook:
    def before(self, run: ChunkRun) -> None: ...

    def progress(self, run: ChunkRun) -> None: ...

    def after(self, run: ChunkRun, exc: BaseException | None) -> None: ...


class LeaseHook(ChunkHook):
    """Take the chunk's lease or skip it; count the attempt; release at the end."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def before(self, run: ChunkRun) -> None:
        r = self.rt.redis
        r.srem(keys.queued(run.job), run.index)
        if self.rt.store.exists(result_key(run.job, run.index)):
            raise Skip("already has a result")
        lease = Lease(r, run.job, run.index, self.rt.lease_owner, self.rt.settings.lease_ttl_s)
        if not lease.acquire():
            raise Skip(f"lease held by {r.get(lease.key)!r}")
        run.attempt = int(r.hincrby(keys.attempts(run.job), run.index, 1))
        run.extras["lease"] = lease
        self.rt.heartbeat.add(lease)

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        lease: Lease = run.extras["lease"]
        self.rt.heartbeat.discard(lease)
        if isinstance(exc, ChunkReleased):
            # A graceful release is not a failed attempt.
            self.rt.redis.hincrby(keys.attempts(run.job), run.index, -1)
        lease.release()


class CheckpointHook(ChunkHook):
    """Flush finished records every N seconds; a rerun generates only what is missing."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def before(self, run: ChunkRun) -> None:
        store = self.rt.store
        for key in store.list(partial_prefix(run.job, run.index)):
            try:
                for row in decode_lines(store.get(key), key):
                    run.finished.setdefault(sample_key(row["id"], row["sample"]), row)
            except (ChunkCorrupt, ObjectMissing) as e:
                log.warning("ignoring unreadable checkpoint %s: %s", key, e)
        run.resumed = len(run.finished)
        run.extras["last_flush"] = time.monotonic()
        if run.resumed:
            log.info("chunk %s resumes with %d checkpointed samples", run.name, run.resumed)

    def flush(self, run: ChunkRun) -> None:
        fresh = run.take_fresh()
        run.extras["last_flush"] = time.monotonic()
        if not fresh:
            return
        # Nanoseconds name it: unique across flushes, runs and restarts of a same-named worker.
        key = partial_key(run.job, run.index, time.time_ns(), run.worker)
        self.rt.store.put(key, encode_lines(fresh))

    def progress(self, run: ChunkRun) -> None:
        age = time.monotonic() - run.extras["last_flush"]
        # While another worker assists the chunk, checkpoint at the assist cadence, so the
        # helper starts from fresh records and the two waste little work on each other.
        assist_flush_s = self.rt.settings.assist_poll_s / 2
        if age >= self.rt.settings.checkpoint_interval_s or (age >= assist_flush_s and run.extras.get("assisted")):
            self.flush(run)

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        if run.committed or run.extras.get("lost_race") or isinstance(exc, ChunkSuperseded):
            self.rt.store.delete_prefix(partial_prefix(run.job, run.index))
        elif exc is not None:
            self.flush(run)


class OutcomeHook(ChunkHook):
    """Decide what a failed attempt means: requeue, quarantine, or hand back on release."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        if exc is None or run.committed or isinstance(exc, ChunkSuperseded):
            return
        rt, settings = self.rt, self.rt.settings
        if isinstance(exc, ChunkReleased):
            self._requeue(run, run.attempt)
            log.info("chunk %s handed back on shutdown with %d samples checkpointed", run.name, len(run.finished))
            return
        if isinstance(exc, EngineError):
            rt.engine_failed(exc)  # first, so this worker takes no more chunks, the requeued one included
        hopeless = isinstance(exc, ChunkCorrupt | ObjectMissing)
        if hopeless or run.attempt >= settings.max_attempts:
            Quarantine(
                index=run.index,
                error=str(exc),
                error_type=type(exc).__name__,
                attempts=run.attempt,
                traceback="".join(traceback.format_exception(exc)),
                worker=run.worker,
            ).write(rt.store, run.job)
            log.error("chunk %s quarantined after %d attempt(s): %s", run.name, run.attempt, exc)
        else:
            self._requeue(run, run.attempt + 1)
            log.warning("chunk %s attempt %d failed (%s): requeued", run.name, run.attempt, exc)

    def _requeue(self, run: ChunkRun, attempt: int) -> None:
        send_chunk(self.rt.app, self.rt.settings.queue, run.job, run.index, attempt, PRIORITY_RECOVERY)
        self.rt.redis.sadd(keys.queued(run.job), run.index)


class AssistHook(ChunkHook):
    """An idle worker helps a straggler: one helper per chunk, held by an expiring key."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def before(self, run: ChunkRun) -> None:
        lease = Lease(self.rt.redis, run.job, run.index, self.rt.lease_owner, self.rt.settings.lease_ttl_s,
                      key=keys.assist(run.job, run.index))
        if not lease.acquire():
            raise Skip("another worker already assists it")
        if self.rt.store.exists(result_key(run.job, run.index)):
            lease.release()
            raise Skip("already has a result")
        run.extras["assist_lease"] = lease
        self.rt.heartbeat.add(lease)

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        lease: Lease = run.extras["assist_lease"]
        self.rt.heartbeat.discard(lease)
        lease.release()
        if exc is not None and not isinstance(exc, ChunkSuperseded | ChunkReleased):
            log.warning("assist of chunk %s failed (the owner goes on): %s", run.name, exc)


class ProgressHook(ChunkHook):
    """Publish how much a chunk lacks; notice when a helper (or the owner) committed first."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def before(self, run: ChunkRun) -> None:
        run.extras["last_progress"] = 0.0

    def progress(self, run: ChunkRun) -> None:
        now = time.monotonic()
        if now - run.extras["last_progress"] < self.rt.settings.assist_poll_s / 2:
            return
        run.extras["last_progress"] = now
        r = self.rt.redis
        unstarted = max(0, run.remaining() - run.inflight)
        if not run.assist:
            r.hset(keys.progress(run.job), run.index, unstarted)
        # Sticky: a helper that finished first has released its key by the time we look.
        helped = run.extras.get("assisted") or run.assist or bool(r.exists(keys.assist(run.job, run.index)))
        run.extras["assisted"] = helped
        if helped and self.rt.store.exists(result_key(run.job, run.index)):
            run.extras["superseded"] = True

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        if not run.assist:
            self.rt.redis.hdel(keys.progress(run.job), run.index)


class MetricsHook(ChunkHook):
    """Prometheus figures for this worker (fleet.metrics)."""

    def before(self, run: ChunkRun) -> None:
        metrics.RUNNING_CHUNKS.inc()

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        metrics.RUNNING_CHUNKS.dec()
        stats = run.extras.get("stats")
        if run.committed and stats:
            metrics.observe_chunk(
                stats["seconds"], prompt_tokens=stats["prompt_tokens"],
                completion_tokens=stats["completion_tokens"], records_ok=stats["samples"] - stats["errors"],
                records_error=stats["errors"], accept_length=stats.get("spec_accept_length"),
            )
        elif exc is not None and not isinstance(exc, ChunkSuperseded | ChunkReleased):
            metrics.CHUNKS_FAILED.inc()
            metrics.count_error(exc)


class StatsHook(ChunkHook):
    """Cache the result header in Redis so `fleet status` needs no store scan of records."""

    def __init__(self, rt: Runtime):
        self.rt = rt

    def after(self, run: ChunkRun, exc: BaseException | None) -> None:
        stats = run.extras.get("stats")
        if run.committed and stats:
            try:
                self.rt.redis.hset(keys.chunk_stats(run.job), run.index, json.dumps(stats))
            except redis.RedisError as e:
                log.warning("stats cache for %s not written: %s", run.name, e)


class Hooks:
    def __init__(self, hooks: list[ChunkHook]):
        self.hooks = hooks

    def before(self, run: ChunkRun, ran: list[ChunkHook]) -> None:
        """Fills `ran` as it goes, so hooks that ran get their after() even if a later one raises."""
        for hook in self.hooks:
            hook.before(run)
            ran.append(hook)

    def progress(self, run: ChunkRun, ran: list[ChunkHook]) -> None:
        for hook in ran:
            try:
                hook.progress(run)
            except Exception:
                log.exception("hook %s.progress failed", type(hook).__name__)

    def after(self, run: ChunkRun, ran: list[ChunkHook], exc: BaseException | None) -> None:
        for hook in reversed(ran):
            try:
                hook.after(run, exc)
            except Exception:
                log.exception("hook %s.after failed for chunk %s", type(hook).__name__, run.name)
