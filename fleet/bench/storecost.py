"""Store requests per GPU-hour at the reference job's shape, and what S3 charges for them.

Counted, not assumed: a real `fleet worker` (sim engine) runs chunks, each flushing its checkpoints
several times, and its metrics endpoint says how many requests of each kind it made of its store
(fleet_store_requests{method, kind}, counted as S3 bills them: a listing's pages, a batch delete's
requests). What a chunk costs once (its input, its result, the checkpoint listing and the batched
delete) and what one flush costs are then scaled to the reference shape: a chunk's run is K x its
tokens / the GPU's tok/s, every running chunk flushes every `checkpoint_interval_s`. Prices: S3
Standard, us-east-1 list prices (PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD $0.0004 per
1,000; DELETE free; a DeleteObjects batch is a POST).
"""

from __future__ import annotations

import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from fleet.bench.reference import REFERENCE
from fleet.bench.simjob import SimJob, SimShape, run_sim_job
from fleet.coord.localredis import free_port
from fleet.store import open_store
from fleet.store.layout import results_prefix

#: S3 Standard request prices, $ per 1,000 (us-east-1 list prices)
PUT_CLASS_USD, GET_CLASS_USD = 0.005, 0.0004
RUN_CHUNKS, RUN_RECORDS, RUN_FLUSHES = 4, 8, 8
#: the worker's metric of its store requests (fleet.store.counted)
STORE_REQUESTS = "fleet_store_requests"
#: the counted run's engine: RUN_CHUNKS chunks at once, each about RUN_FLUSHES checkpoint intervals long
SHAPE = SimShape(max_running=64, chunk_size=RUN_RECORDS, mean_output_tokens=1600, sigma=0.05, step_s=0.002)
CHECKPOINT_S = 0.4


def store_requests(port: int) -> Counter[tuple[str, str]]:
    """A worker's store requests so far, by (method, kind), read from its metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == STORE_REQUESTS:
            for sample in family.samples:
                if sample.name == f"{STORE_REQUESTS}_total" and sample.value:
                    counts[sample.labels["method"], sample.labels["kind"]] += int(sample.value)
    return counts


def run_counted(workdir: Path) -> tuple[Counter[tuple[str, str]], int, int]:
    """RUN_CHUNKS chunks on one `fleet worker` with as many slots, at once, each flushing about
    RUN_FLUSHES times: its store requests (read before it stops), chunks committed and flushes made."""
    port = free_port()
    counted: Counter[tuple[str, str]] = Counter()
    job = SimJob("storecost", SHAPE, RUN_CHUNKS, workers=1, slots=RUN_CHUNKS, extra_env={
        "FLEET_CHECKPOINT_INTERVAL_S": str(CHECKPOINT_S), "FLEET_ASSIST": "false",
        "FLEET_MONITOR__METRICS_PORT": str(port)})  # fmt: skip
    # the counts once every result is in: the worker's shutdown requests (none per chunk) stay out
    job.on_done = lambda: counted.update(store_requests(port))
    run_sim_job(job, workdir, timeout_s=300)
    store = open_store(str(workdir / job.name / "store"))
    committed = sum(1 for _ in store.list(results_prefix(job.name)))
    return counted, committed, counted["PUT", "partial"]


@dataclass(frozen=True)
class RefRates:
    """The reference shape's rates per GPU-hour."""

    k: int
    records: int
    checkpoint_interval_s: float

    @property
    def chunk_s(self) -> float:
        return self.k * self.records * REFERENCE.output_tokens / REFERENCE.tok_s_per_gpu

    @property
    def chunks_per_gpu_hour(self) -> float:
        return 3600 / (self.chunk_s / self.k)

    @property
    def flushes_per_gpu_hour(self) -> float:
        return self.k * 3600 / self.checkpoint_interval_s

    @property
    def checkpoints_per_chunk(self) -> float:
        return self.chunk_s / self.checkpoint_interval_s


def requests_per_gpu_hour(workdir: Path, k: int, records: int, checkpoint_interval_s: float) -> dict[str, Any]:
    """Per GPU-hour at the reference shape, by request, from the counted run."""
    counts, committed, flushes = run_counted(workdir)
    if committed != RUN_CHUNKS or flushes == 0:
        raise RuntimeError(f"the counted run committed {committed} of {RUN_CHUNKS} chunks with {flushes} flushes")
    rates = RefRates(k, records, checkpoint_interval_s)
    # The stall watch lists a job's results only when nothing of it is queued or running: at its end, a
    # request per job, not per chunk (it may land before the counts are read, or after)
    per_job = {f"{m} {kind}": n for (m, kind), n in counts.items() if (m, kind) == ("LIST", "results")}
    per_chunk = {f"{m} {kind}": n / committed for (m, kind), n in counts.items()
                 if kind != "partial" and f"{m} {kind}" not in per_job}
    per_chunk |= {f"{m} partial": n / committed for (m, kind), n in counts.items() if kind == "partial" and m != "PUT"}
    # A worker re-reads a job's manifest at most every 30 s (ManifestCache), when a chunk starts: at the
    # reference a chunk starts every chunk_s / K seconds, so once per start at most.
    per_chunk["GET manifest.json"] = 1.0 if rates.chunk_s / rates.k > 30 else per_chunk.get("GET manifest.json", 0)
    hourly = {name: round(n * rates.chunks_per_gpu_hour, 1) for name, n in sorted(per_chunk.items())}
    hourly["PUT partial"] = round(rates.flushes_per_gpu_hour, 1)
    put_class = sum(v for n, v in hourly.items() if n.split()[0] in ("PUT", "LIST", "DeleteObjects"))
    get_class = sum(v for n, v in hourly.items() if n.split()[0] in ("GET", "HEAD"))
    usd = (put_class * PUT_CLASS_USD + get_class * GET_CLASS_USD) / 1000
    gpu_hours = REFERENCE.total_tokens / REFERENCE.tok_s_per_gpu / 3600
    return {
        "per_gpu_hour": hourly, "put_class": round(put_class, 1), "get_class": round(get_class, 1),
        "usd_per_gpu_hour": round(usd, 5), "reference_gpu_hours": round(gpu_hours, 1),
        "reference_usd": round(usd * gpu_hours, 2), "chunks_per_gpu_hour": round(rates.chunks_per_gpu_hour, 2),
        "checkpoints_per_chunk": round(rates.checkpoints_per_chunk, 1),
        "deletes_per_chunk_one_by_one": round(rates.checkpoints_per_chunk, 1),
        "measured": {"chunks": committed, "flushes": flushes,
                     "counts": {f"{m} {kind}": n for (m, kind), n in sorted(counts.items())},
                     "listed": sorted({kind for (m, kind) in counts if m == "LIST"}), "per_job": per_job},
    }
