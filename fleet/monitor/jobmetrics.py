"""Job-level Prometheus metrics for the head: what only the store and Redis know (chunks by
state, records, ETA, cost), for every job the broker knows, computed by `fleet status`'s
own `job_status` at scrape time. Workers export per-GPU figures (fleet.metrics); this
exporter adds the job's progress, so one dashboard shows both.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import redis
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleet.coord.broker import store_of
from fleet.coord.leases import known_jobs
from fleet.monitor.status import JobStatus, job_status
from fleet.settings import Settings
from fleet.store import Store
from fleet.store.results import ChunkStats

log = logging.getLogger(__name__)

#: Listing a big job's results costs seconds: one computation serves scrapes this long.
CACHE_S = 30.0

#: metric name -> help, every family this collector yields (the dashboard test reads it)
FAMILIES = {
    "fleet_job_chunks": "Chunks of the job by state (done, failed, running, queued, total)",
    "fleet_job_records": "Records of the job (total, done, repetition: samples the repetition stop ended)",
    "fleet_job_output_tokens_per_second": "Job output tokens per second over the recent window",
    "fleet_job_eta_seconds": "Estimated seconds until every chunk has a result",
    "fleet_job_cost_usd": "USD spent on GPUs so far (settings.monitor.usd_per_gpu_hour)",
    "fleet_job_usd_per_million_tokens": "USD per million output tokens so far",
    "fleet_job_output_tokens": "Output tokens of the job: committed, in flight (made for chunks not yet committed, "
    "as they stream), continued (checkpointed tokens samples went on from), made twice (lost between flushes)",
    "fleet_dying_worker_deaths": "Deaths of a worker's processes in a row before finishing a batch (benched at "
    "bench_after)",
}


class JobCollector(Collector):
    def __init__(self, store: Store, r: redis.Redis, settings: Settings) -> None:
        self.store, self.r, self.settings = store, r, settings
        self._cache: tuple[float, list[JobStatus]] = (0.0, [])
        #: each job's done chunks' headers read so far: a committed result never changes, so a
        #: scrape asks Redis only for the chunks done since the last (issue 48: no look holds the broker)
        self._known: dict[str, dict[int, ChunkStats]] = {}

    def statuses(self) -> list[JobStatus]:
        at, cached = self._cache
        if time.monotonic() - at < CACHE_S:
            return cached
        out = []
        try:
            jobs = known_jobs(self.r, store_of(self.settings))
        except redis.RedisError as e:  # the broker is down: say so in the log, serve the last figures
            log.warning("no job list from the broker: %s: %s", type(e).__name__, e)
            return cached
        self._known = {job: self._known.get(job, {}) for job in jobs}
        for job in jobs:
            try:
                out.append(job_status(self.store, self.r, job, self.settings.monitor.usd_per_gpu_hour,
                                      known_stats=self._known.setdefault(job, {})))
            except Exception as e:  # one unreadable job must not blank the others
                log.warning("job %s: no metrics: %s: %s", job, type(e).__name__, e)
        self._cache = (time.monotonic(), out)
        return out

    def describe(self) -> Iterator[GaugeMetricFamily]:
        for name, text in FAMILIES.items():
            yield GaugeMetricFamily(name, text, labels=self._labels(name))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        fam = {name: GaugeMetricFamily(name, text, labels=self._labels(name)) for name, text in FAMILIES.items()}
        dying: dict[str, int] = {}
        for st in self.statuses():
            dying.update({d["worker"]: d["deaths_in_a_row"] for d in st.dying_workers})
            for state, n in (
                ("done", st.chunks_done),
                ("failed", st.chunks_failed),
                ("running", st.chunks_running),
                ("queued", st.chunks_queued),
                ("total", st.chunks_total),
            ):
                fam["fleet_job_chunks"].add_metric([st.job, state], n)
            fam["fleet_job_records"].add_metric([st.job, "total"], st.records_total)
            fam["fleet_job_records"].add_metric([st.job, "done"], st.records_done)
            fam["fleet_job_records"].add_metric([st.job, "repetition"], st.records_repetition)
            fam["fleet_job_output_tokens_per_second"].add_metric([st.job], st.tok_s)
            for kind, n in (("committed", st.completion_tokens), ("in_flight", st.tokens_in_flight),
                            ("continued", st.tokens_continued), ("made_twice", st.tokens_made_twice)):
                fam["fleet_job_output_tokens"].add_metric([st.job, kind], n)
            fam["fleet_job_cost_usd"].add_metric([st.job], st.cost_usd)
            if st.eta_s is not None:
                fam["fleet_job_eta_seconds"].add_metric([st.job], st.eta_s)
            if st.usd_per_m_tokens is not None:
                fam["fleet_job_usd_per_million_tokens"].add_metric([st.job], st.usd_per_m_tokens)
        for worker, n in sorted(dying.items()):
            fam["fleet_dying_worker_deaths"].add_metric([worker], n)
        yield from fam.values()

    @staticmethod
    def _labels(name: str) -> list[str]:
        return {"fleet_job_chunks": ["job", "state"], "fleet_job_records": ["job", "kind"],
                "fleet_job_output_tokens": ["job", "kind"], "fleet_dying_worker_deaths": ["worker"]}.get(name, ["job"])
