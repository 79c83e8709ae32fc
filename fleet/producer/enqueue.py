"""The producer: validate the input, write chunks and the manifest, enqueue what is missing.

Idempotent: a rerun writes nothing new for an existing job and enqueues only chunks with
no result, no live lease and no waiting message, so it also rebuilds a lost queue.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import redis
from celery import Celery

from fleet import keys
from fleet.broker import make_celery, redis_client, send_chunk
from fleet.chunkstate import done_indexes, failed_indexes, queued_indexes, running_indexes
from fleet.engines import job_config
from fleet.layout import failed_key, manifest_key
from fleet.manifest import Manifest, check_compatible, config_hash, load_manifest
from fleet.producer.chunker import write_chunks
from fleet.producer.reader import read_records, validate
from fleet.producer.source import local_input
from fleet.progress import Progress, counted
from fleet.recovery import requeue_expired
from fleet.settings import Settings
from fleet.store import Store, open_store

log = logging.getLogger(__name__)


@dataclass
class EnqueueReport:
    job: str
    chunks: int
    enqueued: list[int] = field(default_factory=list)
    done: int = 0
    running: int = 0
    queued: int = 0
    failed: int = 0
    created: bool = False


def store_for(settings: Settings) -> Store:
    return open_store(
        settings.resolved_store_url, settings.s3_max_attempts, settings.multipart_threshold_mb
    )


def prepare_job(
    settings: Settings, store: Store, input_url: str, job: str, progress: Progress | None = None
) -> tuple[Manifest, bool]:
    """The job's manifest, creating chunks and manifest on first sight of the job."""
    config = job_config(settings)
    existing = load_manifest(store, job)
    if existing is not None:
        check_compatible(existing, config)
        return existing, False
    with local_input(input_url) as path:
        if progress:
            progress("validate", 0, None)
        total = validate(path)
        if progress:
            progress("validate", total, total)
        records = counted(read_records(path), progress, "write chunks", total)
        counts = write_chunks(store, job, records, settings.chunk_size, settings.sampling.n)
    manifest = Manifest(
        job=job,
        input=input_url,
        chunk_size=settings.chunk_size,
        chunks=counts.chunks,
        records=counts.records,
        samples=counts.samples,
        config=config,
        config_hash=config_hash(config),
    )
    # The manifest goes last: a job exists only once all its chunks do.
    if not store.put_if_absent(manifest_key(job), manifest.to_bytes()):
        winner = load_manifest(store, job)
        assert winner is not None
        check_compatible(winner, config)
        return winner, False
    return manifest, True


def enqueue_missing(
    r: redis.Redis, app: Celery, store: Store, settings: Settings, manifest: Manifest,
    retry_failed: bool = False,
) -> EnqueueReport:
    job = manifest.job
    requeue_expired(r, store, app, settings)
    report = EnqueueReport(job=job, chunks=manifest.chunks)
    done = done_indexes(store, job)
    failed = failed_indexes(store, job)
    if retry_failed and failed:
        for index in failed - done:
            store.delete(failed_key(job, index))
            r.hdel(keys.attempts(job), index)
        failed = set()
    running = running_indexes(r, job)
    queued = queued_indexes(r, job)
    r.sadd(keys.jobs(), job)
    for index in range(manifest.chunks):
        if index in done or index in failed or index in running or index in queued:
            continue
        send_chunk(app, settings.queue, job, index, 1 + int(r.hget(keys.attempts(job), index) or 0))
        r.sadd(keys.queued(job), index)
        report.enqueued.append(index)
    report.done = len(done)
    report.failed = len(failed - done)
    report.running = len(running - done)
    report.queued = len(queued - done - running)
    return report


def enqueue(
    settings: Settings, input_url: str, job: str, retry_failed: bool = False, progress: Progress | None = None
) -> EnqueueReport:
    store = store_for(settings)
    manifest, created = prepare_job(settings, store, input_url, job, progress)
    app = make_celery(settings)
    r = redis_client(settings)
    try:
        report = enqueue_missing(r, app, store, settings, manifest, retry_failed)
    finally:
        r.close()
    report.created = created
    return report
