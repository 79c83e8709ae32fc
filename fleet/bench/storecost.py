"""Store requests per GPU-hour at the reference job's shape, and what S3 charges for them.

Counted, not assumed: a worker's real middleware stack and chunk task (sim engine, in this
process, as tests/middleware run them) run chunks against a store that counts every request by
kind of object, with checkpoints flushed several times per chunk. What a chunk costs once
(its input, its result, the checkpoint listing and the batched delete) and what one flush costs
are then scaled to the reference shape: a chunk's run is K x its tokens / the GPU's tok/s, every
running chunk flushes every `checkpoint_interval_s`. Prices: S3 Standard, us-east-1 list prices
(PUT, COPY, POST, LIST $0.005 per 1,000; GET, HEAD $0.0004 per 1,000; DELETE free; a
DeleteObjects batch is a POST).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleet.bench.reference import REFERENCE
from fleet.coord.broker import make_celery, redis_client
from fleet.coord.chunkqueue import ChunkQueue
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.localredis import LocalRedis
from fleet.coord.retry import RetryPolicy
from fleet.engines.identity import engine_identity, identity_hash
from fleet.engines.specs import build_engine
from fleet.producer.enqueue import prepare_job
from fleet.settings import Settings
from fleet.store.base import Store
from fleet.store.local import LocalStore
from fleet.worker.process.context import ManifestCache, WorkerContext
from fleet.worker.process.enginehost import EngineHost
from fleet.worker.run.chunk import ChunkRun
from fleet.worker.run.executor import Executor
from fleet.worker.run.middleware import owner_stack
from fleet.worker.run.outcome import Committed
from fleet.worker.run.task import ChunkTask

#: S3 Standard request prices, $ per 1,000 (us-east-1 list prices)
PUT_CLASS_USD, GET_CLASS_USD = 0.005, 0.0004
#: keys S3 returns per LIST page and deletes per DeleteObjects request
PAGE = 1000
RUN_CHUNKS, RUN_RECORDS, RUN_FLUSHES = 4, 8, 8


class CountingStore(Store):
    """A store that counts S3 requests (a listing's pages, a batch delete's requests) by method
    and by the kind of object (chunks, results, partial, manifest.json ...)."""

    def __init__(self, inner: Store):
        self.inner, self.url = inner, inner.url
        self.counts: Counter[tuple[str, str]] = Counter()
        self.listed: list[str] = []
        self._lock = threading.Lock()

    def _count(self, method: str, key: str, n: int = 1) -> None:
        parts = key.split("/")
        kind = parts[1] if len(parts) > 1 else parts[0]
        with self._lock:
            self.counts[method, kind] += n

    def put(self, key: str, data: bytes) -> None:
        self._count("PUT", key)
        self.inner.put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._count("PUT", key)
        return self.inner.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        self._count("GET", key)
        return self.inner.get(key)

    def exists(self, key: str) -> bool:
        self._count("HEAD", key)
        return self.inner.exists(key)

    def list(self, prefix: str) -> Iterator[str]:
        keys = list(self.inner.list(prefix))
        self._count("LIST", prefix, max(1, math.ceil(len(keys) / PAGE)))
        with self._lock:
            self.listed.append(prefix)
        return iter(keys)

    def delete(self, key: str) -> None:
        self._count("DELETE", key)
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        todo = list(keys)
        if todo:
            self._count("DeleteObjects", todo[0], math.ceil(len(todo) / PAGE))
        self.inner.delete_many(todo)

    def version(self, key: str) -> str:
        return self.inner.version(key)


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


def run_counted(workdir: Path) -> tuple[CountingStore, int, int]:
    """RUN_CHUNKS chunks through the real owner stack, at once, each flushing about RUN_FLUSHES times:
    the counting store, chunks committed and flushes made."""
    workdir.mkdir(parents=True, exist_ok=True)
    with LocalRedis(workdir / "redis", persist=False) as server:
        settings = Settings(broker_url=server.url, store_url=str(workdir / "store"), queue="storecost",
                            chunk_size=RUN_RECORDS, checkpoint_interval_s=0.4, assist=False,
                            sim={"step_s": 0.002, "mean_output_tokens": 1600, "sigma": 0.05, "max_running": 64})
        prompts = workdir / "prompts.jsonl"
        prompts.write_text("".join(f'{{"id": "s{i}", "prompt": "x"}}\n' for i in range(RUN_CHUNKS * RUN_RECORDS)))
        prepare_job(settings, LocalStore(workdir / "store"), str(prompts), "storecost")
        store = CountingStore(LocalStore(workdir / "store"))
        r, identity = redis_client(settings), engine_identity(settings)
        heartbeat = Heartbeat.of(settings)
        ctx = WorkerContext(settings=settings, store=store, redis=r, heartbeat=heartbeat, name="cpu0@storecost",
                            owner="cpu0@storecost:1", queue=ChunkQueue.of(make_celery(settings), settings, r),
                            policy=RetryPolicy.from_settings(settings), manifests=ManifestCache(store),
                            identity=identity, identity_hash=identity_hash(identity))
        host = EngineHost(build_engine(settings))
        host.start(timeout_s=60)
        heartbeat.start()
        executor, task = Executor(owner_stack(ctx)), ChunkTask(store, host, ctx.writer)
        outcomes: list[Any] = []

        def one(index: int) -> None:
            outcomes.append(executor.execute(ChunkRun(job="storecost", index=index, attempt=1, worker=ctx.name), task))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(RUN_CHUNKS)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
        finally:
            heartbeat.stop()
            host.stop()
            r.close()
    committed = sum(isinstance(o, Committed) for o in outcomes)
    flushes = store.counts["PUT", "partial"]
    return store, committed, flushes


def requests_per_gpu_hour(workdir: Path, k: int, records: int, checkpoint_interval_s: float) -> dict[str, Any]:
    """Per GPU-hour at the reference shape, by request, from the counted run."""
    store, committed, flushes = run_counted(workdir)
    if committed != RUN_CHUNKS or flushes == 0:
        raise RuntimeError(f"the counted run committed {committed} of {RUN_CHUNKS} chunks with {flushes} flushes")
    rates = RefRates(k, records, checkpoint_interval_s)
    per_chunk = {f"{m} {kind}": n / committed for (m, kind), n in store.counts.items() if kind != "partial"}
    per_chunk |= {f"{m} partial": n / committed for (m, kind), n in store.counts.items()
                  if kind == "partial" and m != "PUT"}
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
                     "counts": {f"{m} {kind}": n for (m, kind), n in sorted(store.counts.items())},
                     "listed": sorted(set(store.listed))},
    }
