"""The producer: validate the input, write chunks and the manifest, enqueue what is missing.

Idempotent: a rerun writes nothing new for an existing job and enqueues only chunks with
no result, no live lease and no waiting message, so it also rebuilds a lost queue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery

from fleet.coord import chunkqueue, counters, leases
from fleet.coord.broker import chunk_queue, make_celery, redis_client, store_of
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.chunkstate import done_indexes, failed_indexes
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.queuescan import stale_markers
from fleet.coord.recovery import Reaper
from fleet.engines.identity import engine_identity, identity_hash
from fleet.engines.specs import input_vocab, job_config
from fleet.errors import FleetError, InputError, JobConflict
from fleet.producer.chunker import write_chunks
from fleet.producer.claim import JobIdentity, check_same_job, claim_job, load_claim
from fleet.producer.digest import InputDigest
from fleet.producer.inputs import read_records, validate
from fleet.producer.jobset import OptionsChange, apply_change, planned
from fleet.producer.redo import check_redo, redo_input, redo_settings
from fleet.producer.source import local_input
from fleet.progress import Progress, counted
from fleet.records import InputRecord
from fleet.settings import Settings
from fleet.store import Store, store_for
from fleet.store.layout import failed_key, manifest_key, redo_key
from fleet.store.manifest import Manifest, check_compatible, config_hash, load_manifest, require_manifest

log = logging.getLogger(__name__)
#: a message taken this many lease TTLs ago whose chunk has no lease lost its worker
LOST_AFTER_LEASES = 3


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
    #: chunks whose "queued" marker had no message behind it (cleared and enqueued again)
    repaired: list[int] = field(default_factory=list)
    #: the max_tokens in effect for the job, and where it came from (fleet.model.outputlen)
    max_tokens: int | None = None
    max_tokens_from: str | None = None
    #: the job's options (fleet.store.options) as they stand after this enqueue, and waiting messages
    #: moved to a new priority's list
    options: str = ""
    moved: int = 0


def job_identity(
    settings: Settings, job: str, input_url: str, path: Path, progress: Progress | None = None
) -> JobIdentity:
    """Validate the input and digest it in the same streaming pass; nothing is written."""
    digest = InputDigest()
    if progress:
        progress("validate", 0, None)
    records = validate(path, on_record=digest.update, vocab=input_vocab(settings), turns=settings.turns,
                       source=settings.input)
    if progress:
        progress("validate", records, records)
    return identity_of(settings, job, input_url, digest, records)


def identity_of(
    settings: Settings, job: str, input_url: str, digest: InputDigest, records: int, redo_of: str | None = None
) -> JobIdentity:
    config = job_config(settings)
    engine = engine_identity(settings)
    return JobIdentity(
        job=job, config=config, config_hash=config_hash(config), engine_identity=engine,
        engine_identity_hash=identity_hash(engine), input_digest=digest.hexdigest(),
        input=input_url, records=records, redo_of=redo_of,
    )


def digested(records: Iterator[InputRecord], digest: InputDigest) -> Iterator[InputRecord]:
    for record in records:
        digest.update(record)
        yield record


def write_job(
    settings: Settings, store: Store, records: Iterable[InputRecord], ident: JobIdentity,
    progress: Progress | None = None,
) -> tuple[Manifest, bool]:
    """Chunks, then the manifest last: a job exists only once all its chunks do.

    Chunks are a pure function of the identity, so a joining or resuming enqueue rewrites
    them byte for byte; of two manifests the first stays.
    """
    digest = InputDigest()
    records = counted(digested(iter(records), digest), progress, "write chunks", ident.records)
    counts = write_chunks(store, ident.job, records, settings.chunk_size, settings.sampling.n)
    if digest.hexdigest() != ident.input_digest:
        # The input was read twice (validate, then write): an edit in between would put other
        # records into the chunks than the claim and the manifest describe.
        raise InputError([f"{ident.input} changed while it was enqueued: no manifest was written; "
                          "enqueue it again once it no longer changes"])
    manifest = Manifest(
        job=ident.job, input=ident.input, chunk_size=settings.chunk_size, chunks=counts.chunks,
        records=counts.records, samples=counts.samples, config=ident.config,
        config_hash=ident.config_hash, engine_identity=ident.engine_identity,
        engine_identity_hash=ident.engine_identity_hash, input_digest=ident.input_digest,
        redo_of=ident.redo_of,
    )
    if store.put_if_absent(manifest_key(ident.job), manifest.to_bytes()):
        return manifest, True
    winner = load_manifest(store, ident.job)
    assert winner is not None
    check_same_job(winner, ident)
    return winner, False


def prepare_job(
    settings: Settings, store: Store, input_url: str, job: str, progress: Progress | None = None
) -> tuple[Manifest, bool]:
    """The job's manifest, creating chunks and manifest on first sight of the job.

    A job name already holding another configuration is refused before the input is
    read; another input, once it is read; in both cases nothing is written.
    """
    existing = load_manifest(store, job)
    if existing is not None:
        check_compatible(existing, job_config(settings))
    # A resumed job reads a Hub dataset at the commit it pinned, not wherever main is now: the
    # manifest's, or, where an enqueue died between its claim and its manifest, the claim's.
    held = existing if existing is not None else load_claim(store, job)
    stored = held.input if held is not None else None
    tries = settings.store_client.max_attempts
    with local_input(input_url, settings.input, stored=stored, max_attempts=tries) as fetched:
        ident = job_identity(settings, job, fetched.pinned, fetched.path, progress)
        if existing is not None:
            check_same_job(existing, ident)
            return existing, False
        if not claim_job(store, ident):
            log.info("job %s: joining an enqueue of the same input and configuration", job)
        records = read_records(fetched.path, settings.turns, settings.input)
        return write_job(settings, store, records, ident, progress)


def prepare_redo(
    settings: Settings, store: Store, job: str, redo_of: str, progress: Progress | None = None
) -> tuple[Manifest, bool]:
    """The manifest of `job`, a redo of `redo_of` (fleet.producer.redo), creating it on first
    sight: the same claim, chunks-then-manifest order and refusals as a job of an input file.
    Its samples per record are J's and its seed its own (`redo_settings`)."""
    check_redo(job, redo_of)
    base = require_manifest(store, redo_of)
    settings = redo_settings(settings, base, job)
    existing = load_manifest(store, job)
    if existing is not None:
        check_compatible(existing, job_config(settings))
        if existing.redo_of != redo_of:
            raise JobConflict(f"job {job!r} exists and is not a redo of {redo_of!r} (it redoes "
                              f"{existing.redo_of!r}); use another --job name")
        return existing, False
    found = redo_input(store, base)
    digest = InputDigest()
    for record in found.read(store):
        digest.update(record)
    ident = identity_of(settings, job, f"redo of {redo_of}", digest, found.records, redo_of)
    if not claim_job(store, ident):
        log.info("job %s: joining an enqueue of the same redo and configuration", job)
    # Named under J before the manifest exists: every redo job with a manifest is found from J.
    store.put(redo_key(redo_of, job), ident.to_bytes())
    return write_job(settings, store, found.read(store), ident, progress)


def prepare(
    settings: Settings, store: Store, input_url: str | None, job: str, progress: Progress | None = None,
    redo_of: str | None = None,
) -> tuple[Manifest, bool]:
    """`prepare_job` of an input, or `prepare_redo` of `redo_of`: exactly one of the two is given."""
    if (input_url is None) == (redo_of is None):
        raise FleetError("give an input file, or --redo JOB to take a finished job's unfinished rows (not both)")
    if redo_of is not None:
        return prepare_redo(settings, store, job, redo_of, progress)
    assert input_url is not None
    return prepare_job(settings, store, input_url, job, progress)


def max_tokens_of(manifest: Manifest) -> dict[str, Any]:
    config = manifest.config
    return {"max_tokens": config["sampling"].get("max_tokens"), "max_tokens_from": config.get("max_tokens_from")}


def enqueue_missing(
    r: redis.Redis, app: Celery, store: Store, settings: Settings, manifest: Manifest,
    retry_failed: bool = False, change: OptionsChange | None = None,
) -> EnqueueReport:
    """Send what is missing, at the job's priority; `change` (checked before anything was written) is
    applied first, so the new options hold for every chunk sent here."""
    job = manifest.job
    queue = ChunkQueue.of(app, settings, r)
    change = apply_change(store, r, queue, job, change or planned(store, job, {}))
    Reaper(r, store, app, settings).round()
    report = EnqueueReport(job=job, chunks=manifest.chunks, **max_tokens_of(manifest),
                           options=change.after.summary(), moved=change.moved)
    done = done_indexes(store, job)
    failed = failed_indexes(store, job)
    if retry_failed and failed:
        for index in failed - done:
            store.delete(failed_key(job, index))
            counters.forget(r, job, index)
        failed = set()
    running = leases.running_indexes(r, job)
    queued = chunkqueue.queued_indexes(r, job)
    report.repaired = repair_markers(r, settings, job, queued - done - failed - running)
    queued -= set(report.repaired)
    skip = done | failed | running | queued
    wanted = [i for i in range(manifest.chunks) if i not in skip]
    report.enqueued = queue.enqueue(job, wanted, change.after.priority)
    report.done = len(done)
    report.failed = len(failed - done)
    report.running = len(running - done)
    report.queued = len(queued - done - running)
    return report


def repair_markers(r: redis.Redis, settings: Settings, job: str, markers: set[int]) -> list[int]:
    """Clear the "queued" markers no message backs any more, so those chunks are sent again."""
    lost_after_s = LeaseClock.of(settings).lost_after_s(LOST_AFTER_LEASES)
    stale = stale_markers(r, chunk_queue(settings), job, markers, lost_after_s)
    if stale:
        chunkqueue.clear_markers(r, job, stale)
        log.warning("job %s: %d queued marker(s) had no message (worker lost after taking it): "
                    "re-enqueued %s", job, len(stale), sorted(stale))
    return sorted(stale)


def check_job_name(r: redis.Redis, settings: Settings, job: str) -> None:
    """Refuse a job name another store's job holds on this broker (the per-job keys are named by
    job alone, so two stores' jobs of one name would share leases and markers)."""
    owner, mine = leases.job_store(r, job), store_of(settings)
    if owner is not None and owner != mine:
        raise JobConflict(chunkqueue.other_store(job, owner, mine))


def enqueue(
    settings: Settings, input_url: str | None, job: str, retry_failed: bool = False,
    progress: Progress | None = None, redo_of: str | None = None, options: dict[str, object] | None = None,
) -> EnqueueReport:
    """Enqueue `job` from `input_url`, or as a redo of `redo_of`, with `options` (name -> value,
    fleet.store.options) set on it: a job's stored options stay as they are where none is given."""
    store = store_for(settings)
    r = redis_client(settings)
    try:
        check_job_name(r, settings, job)  # before anything is written to the store
        change = planned(store, job, options or {})  # a bad option is refused before anything is written
        manifest, created = prepare(settings, store, input_url, job, progress, redo_of)
        app = make_celery(settings)
        report = enqueue_missing(r, app, store, settings, manifest, retry_failed, change)
    finally:
        r.close()
    report.created = created
    return report
