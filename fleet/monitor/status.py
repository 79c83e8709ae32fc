"""Job progress from the store (done, failed) and Redis (running, queued, cached stats).

Never asks Flower or the workers: inspect calls with other transport options would
shorten the visibility timeout (docs/architecture.md, Celery facts).
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from fleet.coord import figures
from fleet.coord.chunkqueue import queued_indexes
from fleet.coord.chunkstate import done_indexes, failed_indexes, read_failures
from fleet.coord.enginestarts import engine_starts
from fleet.coord.leases import running_indexes
from fleet.coord.mismatch import mismatched_workers
from fleet.coord.storeoutages import store_outages
from fleet.coord.suspects import dying_workers, healthy_others, stalled_workers
from fleet.coord.witness import host_losses
from fleet.errors import StoreError
from fleet.monitor.redostatus import redo_progress
from fleet.settings import FailureSettings
from fleet.store import Store
from fleet.store.manifest import Manifest, require_manifest
from fleet.store.options import load_options
from fleet.store.results import ChunkStats, read_result

RATE_WINDOW_S = 300.0
#: seconds after which a running chunk's pace that was not renewed is its dead run's
PACE_STALE_S = 30.0
BENCH_AFTER: int = FailureSettings.model_fields["bench_after"].default


@dataclass
class JobStatus:
    job: str
    chunks_total: int
    chunks_done: int = 0
    chunks_failed: int = 0
    chunks_running: int = 0
    chunks_queued: int = 0
    records_total: int = 0
    samples_total: int = 0
    records_done: int = 0
    samples_done: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    record_errors: int = 0
    #: samples that stopped at max tokens, and those of them cut before the think block closed
    records_truncated: int = 0
    records_truncated_in_thinking: int = 0
    #: samples the model ended (no max-tokens cut) before their think block closed: no answer
    records_ended_in_thinking: int = 0
    #: times the engine retracted a running request for KV room (SGLang): the batch is too big
    retractions: int = 0
    #: samples the repetition stop ended in an exact loop: no answer, left out by --only-finished
    records_repetition: int = 0
    #: samples that did not finish (cut, ended inside the thinking, errors, loops): what `--redo` takes
    samples_unfinished: int = 0
    #: this job's redo jobs (and theirs), each with its chunks done, and how many of its unfinished
    #: samples they have finished since (fleet.monitor.redostatus; read only where asked, `fleet status`)
    redo_jobs: dict[str, str] = field(default_factory=dict)
    redo_finished: int = 0
    #: output tokens made for chunks not yet committed, counted as they stream (broker's count)
    tokens_in_flight: int = 0
    #: output tokens made more than once: lost between a run's last flush and its death, or
    #: made by a helper's copy that lost (committed chunks' headers, and the broker's count)
    tokens_made_twice: int = 0
    #: checkpointed output tokens that samples were continued from instead of being made again
    tokens_continued: int = 0
    #: samples started again from token 0: their sampling cannot cross a seam on their engine
    samples_restarted: int = 0
    #: the audit at commit (fleet.audit): samples checked against their own ids, those that failed,
    #: and the first defects named
    audit_checked: int = 0
    audit_failed: int = 0
    audit_defects: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    #: output tok/s: the running chunks' pace while they report one (right seconds after a start),
    #: else committed chunks' tokens over the recent window
    tok_s: float = 0.0
    eta_s: float | None = None
    workers: list[str] = field(default_factory=list)
    #: output tok/s per worker over the recent window
    worker_tok_s: dict[str, float] = field(default_factory=dict)
    #: mean speculative accept length over done chunks, when the engine reports it
    spec_accept_length: float | None = None
    cost_usd: float = 0.0
    projected_cost_usd: float | None = None
    usd_per_m_tokens: float | None = None
    failed: list[dict[str, Any]] = field(default_factory=list)
    #: workers whose engine settings differ from the job's: {worker, differences, at, ...}
    mismatched_workers: list[dict[str, Any]] = field(default_factory=list)
    #: workers whose processes died before finishing a batch, in a row (broker-wide):
    #: {worker, deaths, deaths_in_a_row, last_death_at, benched}
    dying_workers: list[dict[str, Any]] = field(default_factory=list)
    #: workers whose engine made no token for stall_s while requests ran, since they last committed:
    #: {worker, stalls, stalled_s, at}
    stalled_workers: list[dict[str, Any]] = field(default_factory=list)
    #: workers the store refuses now: {worker, unreachable_s, results_waiting (in their spool)}
    store_outages: list[dict[str, Any]] = field(default_factory=list)
    #: host -> worker processes lost with it, no one seeing them die (broker-wide): counted against
    #: the host, never the chunks they ran (fleet.coord.witness)
    lost_hosts: dict[str, int] = field(default_factory=dict)
    #: what starting engines cost (broker-wide, fleet.coord.enginestarts): worker processes whose engine got
    #: ready, and their seconds and GPU-seconds from process start to engine ready; `since` when the first was
    engine_starts: dict[str, Any] = field(default_factory=dict)
    #: the job's options (fleet.store.options), one line: priority, retry policy
    options: str = ""
    #: why the job's chunks that have not started wait (its deadline passed, its token budget is
    #: spent: JobOptions.held, as the workers decide it); "" while they may start
    held: str = ""
    broker: bool = True
    done: bool = False

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


#: defects of the audit at commit that status names (the count covers them all)
MAX_DEFECTS_SHOWN = 10


def done_stats(store: Store, r: redis.Redis | None, job: str, done: set[int],
               known: dict[int, ChunkStats] | None = None) -> list[ChunkStats]:
    """Result headers of done chunks: cached in Redis, read from the store when missing
    (a result written without a header counts as done, with no figures). A committed result
    never changes: a caller that looks again (job-metrics) passes `known`, the headers it read
    before, and only the chunks done since are asked of Redis (and added to it)."""
    known = {} if known is None else known
    cached = figures.cached_stats(r, job, done - known.keys()) if r is not None else {}
    out = []
    for index in sorted(done):
        stats = known.get(index) or cached.get(index)
        if stats is None:
            stats = read_result(store, job, index)[0]
            if stats is None:
                continue
            if r is not None:
                figures.cache_stats(r, job, index, stats)
        known[index] = stats
        out.append(stats)
    return out


@dataclass
class LiveFigures:
    """What the running chunks' runs report as their tokens stream (fleet.coord.figures, pace)."""

    rate: float
    first_started: float
    finished_samples: int
    finished_tokens: int


def live_figures(st: JobStatus, r: redis.Redis, job: str, done: set[int], now: float) -> LiveFigures | None:
    """Tokens in flight (made for chunks not committed yet) into `st`; the running chunks' pace,
    each its run's tokens over its run's time, summed: right seconds after a start, long before
    the first chunk commits. Paces not renewed for PACE_STALE_S belong to runs that died."""
    st.tokens_in_flight = sum(n for i, n in figures.made(r, job).items() if i not in done)
    fresh_ms = (now - PACE_STALE_S) * 1000
    paces = [p for i, p in figures.paces(r, job).items() if i not in done and p["at_ms"] > fresh_ms]
    if not paces:
        return None
    rate = sum(p["made"] / max((p["at_ms"] - p["started_ms"]) / 1000, 1e-3) for p in paces)
    return LiveFigures(rate, min(p["started_ms"] for p in paces) / 1000, sum(p.get("samples", 0) for p in paces),
                       sum(p.get("sample_tokens", 0) for p in paces))


def recent_rate(stats: list[ChunkStats], now: float, window_s: float = RATE_WINDOW_S,
                finished: bool = False) -> float:
    """Output tok/s over the recent window ending now (over the whole run while it is
    younger); for a finished job, over the window ending at its last result."""
    timed = [s for s in stats if s.started is not None and s.finished is not None]
    if not timed:
        return 0.0
    first = min(s.started for s in timed if s.started is not None)
    last = max(s.finished for s in timed if s.finished is not None)
    end = last if finished or now - last >= window_s else max(last, now)
    start = max(first, end - window_s)
    tokens = sum(s.completion_tokens for s in timed if s.finished is not None and s.finished >= start)
    return tokens / max(end - start, 1e-6)


def job_status(store: Store, r: redis.Redis | None, job: str, usd_per_gpu_hour: float = 0.0,
               manifest: Manifest | None = None, bench_after: int = BENCH_AFTER, redo: bool = False,
               known_stats: dict[int, ChunkStats] | None = None) -> JobStatus:
    """`manifest` saves a read of it per call where the caller polls (fleet run, --watch); `redo`
    adds what redo jobs finished of this job's unfinished samples (reads their results);
    `known_stats`, the done chunks' headers a caller that polls read before (done_stats)."""
    manifest = manifest or require_manifest(store, job)
    done = done_indexes(store, job)
    failed = failed_indexes(store, job) - done
    st = JobStatus(job=job, chunks_total=manifest.chunks, records_total=manifest.records,
                   samples_total=manifest.samples)
    st.chunks_done, st.chunks_failed = len(done), len(failed)
    if r is not None:
        try:
            st.chunks_running = len(running_indexes(r, job) - done)
            st.chunks_queued = len(queued_indexes(r, job) - done - failed)
            st.mismatched_workers = mismatched_workers(r, job)
            st.dying_workers = [{"worker": h.worker, "deaths": h.deaths, "deaths_in_a_row": h.streak,
                                 "last_death_at": h.at,
                                 "benched": h.streak >= bench_after and healthy_others(r, h.worker)}
                                for h in dying_workers(r)]
            st.stalled_workers = stalled_workers(r)
            st.store_outages = store_outages(r)
            st.lost_hosts = host_losses(r)
            st.engine_starts = asdict(engine_starts(r))
        except redis.RedisError:
            st.broker, r = False, None
    stats = done_stats(store, r, job, done, known_stats)
    now = time.time()
    live = None
    if r is not None:
        with contextlib.suppress(redis.RedisError):
            live = live_figures(st, r, job, done, now)
    for s in stats:
        st.records_done += s.records
        st.samples_done += s.samples
        st.prompt_tokens += s.prompt_tokens
        st.completion_tokens += s.completion_tokens
        st.record_errors += s.errors
        st.records_truncated += s.records_truncated
        st.records_truncated_in_thinking += s.records_truncated_in_thinking
        st.records_ended_in_thinking += s.records_ended_in_thinking
        st.retractions += s.retractions
        st.records_repetition += s.records_repetition
        st.samples_unfinished += s.errors + s.records_truncated + s.records_ended_in_thinking + s.records_repetition
        st.tokens_made_twice += s.tokens_made_twice
        st.tokens_continued += s.tokens_continued
        st.samples_restarted += s.samples_restarted
        st.audit_checked += s.audit_checked
        st.audit_failed += s.audit_failed
        st.audit_defects += s.audit_defects[: max(0, MAX_DEFECTS_SHOWN - len(st.audit_defects))]
    st.workers = sorted({s.worker for s in stats if s.worker is not None})
    timed = [s for s in stats if s.timed()]
    finished = len(done) == manifest.chunks
    if timed:
        first = min(s.started for s in timed if s.started is not None)
        last = max(s.finished for s in timed if s.finished is not None)
        st.elapsed_s = round((last if finished else now) - first, 3)
        st.tok_s = round(recent_rate(timed, now, finished=finished), 2)
        by_worker: dict[str, list[ChunkStats]] = {}
        for s in timed:  # one pass: a thousand workers' rates must not cost a pass each
            if s.worker is not None:
                by_worker.setdefault(s.worker, []).append(s)
        for worker in st.workers:
            st.worker_tok_s[worker] = round(recent_rate(by_worker.get(worker, []), now, finished=finished), 2)
        accept = [s.spec_accept_length for s in stats if s.spec_accept_length]
        st.spec_accept_length = round(sum(accept) / len(accept), 3) if accept else None
    if live is not None and not finished:
        st.tok_s = round(live.rate, 2)
        st.elapsed_s = max(st.elapsed_s, round(now - live.first_started, 3))
    samples = st.samples_done + (live.finished_samples if live else 0)
    if st.tok_s > 0 and samples:
        per_sample = (st.completion_tokens + (live.finished_tokens if live else 0)) / samples
        left = max(0.0, (manifest.samples - st.samples_done) * per_sample - st.tokens_in_flight)
        st.eta_s = round(left / st.tok_s, 1)
    gpus = max(1, len(st.workers))
    st.cost_usd = round(usd_per_gpu_hour * gpus * st.elapsed_s / 3600, 4)
    if st.eta_s is not None:
        st.projected_cost_usd = round(st.cost_usd + usd_per_gpu_hour * gpus * st.eta_s / 3600, 4)
    if st.completion_tokens and usd_per_gpu_hour:
        st.usd_per_m_tokens = round(st.cost_usd / st.completion_tokens * 1e6, 4)
    with contextlib.suppress(StoreError):
        st.failed = [{k: f.get(k) for k in ("index", "error_type", "error", "attempts")}
                     for f in read_failures(store, job, failed)]
    st.done = st.chunks_done == manifest.chunks
    with contextlib.suppress(StoreError):
        options = load_options(store, job)
        st.options = options.summary()
        if not st.done:
            made = None
            if r is not None and options.token_budget is not None:
                with contextlib.suppress(redis.RedisError):
                    made = figures.made_total(r, job)
            st.held = options.held(made) or ""
    progress = redo_progress(store, job) if redo else None
    if progress is not None:
        st.redo_jobs, st.redo_finished = progress.jobs, progress.finished
    return st
