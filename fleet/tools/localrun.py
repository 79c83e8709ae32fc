"""`fleet run`: the whole pipeline on one machine, with a local Redis when none is configured.

Starts what it needs, enqueues, shows progress, keeps recovery going (expired leases,
stalls), and stops everything it started. Exit 0 only when every chunk has a result.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from pathlib import Path

import redis
from celery import Celery
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fleet.coord.broker import make_celery, redis_client
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.localredis import LocalRedis
from fleet.coord.recovery import Reaper
from fleet.monitor.status import JobStatus, job_status
from fleet.producer.enqueue import enqueue_missing, prepare
from fleet.redact import redact_url
from fleet.settings import Settings
from fleet.store import Store, store_for
from fleet.store.manifest import Manifest
from fleet.tools.jobcontext import with_job_context
from fleet.worker.supervisor.launcher import Supervisor, plan_workers

log = logging.getLogger(__name__)
POLL_S = 1.0


def job_dir(settings: Settings, job: str) -> Path:
    return settings.data_dir / "jobs" / job


def status_line(st: JobStatus) -> str:
    return (f"chunks {st.chunks_done}/{st.chunks_total} done, {st.chunks_running} running, "
            f"{st.chunks_queued} queued, {st.chunks_failed} failed | {st.tok_s:,.0f} tok/s")


def run_local(settings: Settings, input_url: str | None, job: str, workers: int | None = None,
              gpus: list[int] | None = None, console: Console | None = None, redo_of: str | None = None) -> JobStatus:
    """Run `job` of `input_url`, or a redo of the job `redo_of` (fleet.producer.redo)."""
    console = console or Console(stderr=True)
    with ExitStack() as stack:
        if not settings.broker_url:
            local = LocalRedis(job_dir(settings, job) / "redis").start()
            stack.callback(local.stop)
            settings = settings.model_copy(update={"broker_url": local.url})
            console.print(f"started local redis-server on {redact_url(local.url)}")
        store = store_for(settings)
        manifest, created = prepare(settings, store, input_url, job, redo_of=redo_of)
        console.print(f"job {job}: {manifest.records} records in {manifest.chunks} chunks "
                      f"({'new' if created else 'resumed'}), store {store.url}")
        app = make_celery(settings)
        r = redis_client(settings)
        stack.callback(r.close)
        st = job_status(store, r, job, settings.monitor.usd_per_gpu_hour)
        if st.done:
            console.print("every chunk already has a result; nothing to do")
            return st
        settings = with_job_context(settings, st)  # a resumed job: its measured context sizes S
        supervisor = Supervisor(settings, plan_workers(settings, workers, gpus),
                                log_dir=job_dir(settings, job) / "logs")
        supervisor.start()
        stack.callback(supervisor.stop)
        report = enqueue_missing(r, app, store, settings, manifest)
        console.print(f"enqueued {len(report.enqueued)} chunks; {report.done} already done")
        return watch(settings, store, r, app, supervisor, manifest, console)
    raise AssertionError("unreachable")


def watch(settings: Settings, store: Store, r: redis.Redis, app: Celery, supervisor: Supervisor,
          manifest: Manifest, console: Console) -> JobStatus:
    """Show progress and keep recovery going until every chunk is done or quarantined."""
    job, chunks = manifest.job, manifest.chunks
    reaper, last_reap = Reaper(r, store, app, settings), time.monotonic()
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[info]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(job, total=chunks, info="")
        while True:
            supervisor.poll()
            st = job_status(store, r, job, settings.monitor.usd_per_gpu_hour, manifest)
            progress.update(bar, completed=st.chunks_done, info=status_line(st))
            if st.chunks_done + st.chunks_failed >= chunks:
                return st
            if time.monotonic() - last_reap >= LeaseClock.of(settings).reaper_interval_s:
                last_reap = time.monotonic()
                reaper.round()
            time.sleep(POLL_S)
