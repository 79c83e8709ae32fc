"""No look holds the broker (issue 48, item 2): `fleet status` and a `fleet job-metrics` scrape at
64,000 chunks read Redis in slices (fleet.coord.slices), never one command over a whole job's keys,
and the figures they give are still exact against a recount of the whole keys."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.client

from fleet.coord import chunkqueue, counters, figures, keys, leases
from fleet.coord.broker import store_of
from fleet.coord.localredis import LocalRedis
from fleet.coord.slices import SLICE
from fleet.monitor import jobmetrics
from fleet.monitor.jobmetrics import JobCollector
from fleet.monitor.status import job_status
from fleet.settings import Settings
from fleet.store.layout import manifest_key, result_key
from fleet.store.local import LocalStore
from fleet.store.manifest import Manifest
from fleet.store.results import ChunkStats, encode_result

JOB = "big"
CHUNKS = 64_000
RUNNING = 16_000
QUEUED = 16_000
DONE = 300  # results in the store (each also cached); every chunk has a cached header or made count
WORKERS = 1_000
#: the most values one reply may carry: a slice of field-value pairs, with room for a scan's overshoot
BOUND = 4 * SLICE


def leaves(reply: Any) -> int:
    if isinstance(reply, (list, tuple)):
        return sum(leaves(x) for x in reply)
    if isinstance(reply, dict):
        return 2 * len(reply)
    return 1


class Counting(redis.Redis):
    """A client that keeps every reply's size, by the command it answers and its first key
    (a pipeline's one by one)."""

    replies: list[tuple[str, int]] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        Counting.replies.append((" ".join(str(a) for a in args[:2]), leaves(reply)))
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return CountingPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class CountingPipeline(redis.client.Pipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        asked = [" ".join(str(a) for a in args[:2]) for args, _ in self.command_stack]
        replies = super().execute(raise_on_error)
        Counting.replies += [(name, leaves(reply)) for name, reply in zip(asked, replies, strict=False)]
        return replies


def counting_client(server: LocalRedis) -> redis.Redis:
    Counting.replies = []
    return Counting(port=server.port)


def stats(index: int) -> ChunkStats:
    now = time.time()
    return ChunkStats(job=JOB, chunk=index, records=256, samples=256, completion_tokens=460_000,
                      started=now - 600 - index * 0.01, finished=now - index * 0.01,
                      worker=f"gpu{index % 8}@h{index % 125}")


def fill(r: redis.Redis, store: LocalStore, settings: Settings) -> None:
    """Given: a 64,000-chunk job as a thousand workers leave the broker mid-job."""
    store.put(manifest_key(JOB), Manifest(job=JOB, input="x", chunk_size=256, chunks=CHUNKS, records=CHUNKS * 256,
                                          samples=CHUNKS * 256, config={"sampling": {}}, config_hash="x").to_bytes())
    for index in range(DONE):
        store.put(result_key(JOB, index), encode_result(stats(index), []))
    leases.add_job(r, JOB, store_of(settings))
    now_ms = int(time.time() * 1000)
    with r.pipeline(transaction=False) as p:
        for index in range(CHUNKS):
            figures.cache_stats(p, JOB, index, stats(index))  # type: ignore[arg-type]
            p.hset(keys.made(JOB), index, 1_000 + index % 7)
        running = range(CHUNKS - RUNNING, CHUNKS)
        for index in running:
            p.set(keys.lease(JOB, index), f"gpu@h:{index}#1")
            p.set(keys.process_lease(f"gpu@h:{index}"), 1, px=60_000)
            p.sadd(keys.running(), keys.member(JOB, index))
            p.hset(keys.pace(JOB), index, json.dumps({"made": 500, "started_ms": now_ms - 60_000, "at_ms": now_ms}))
        for index in range(CHUNKS - RUNNING - QUEUED, CHUNKS - RUNNING):
            p.sadd(keys.queued(JOB), index)
        for w in range(WORKERS):
            p.hset(keys.worker_last_commit(), f"gpu{w % 8}@h{w}", now_ms)
        p.execute()


def recount(r: redis.Redis) -> dict[str, int]:
    """The figures from whole reads of every key (what status read before issue 48)."""
    done = set(range(DONE))
    running = {keys.parse_member(m.decode())[1] for m in r.smembers(keys.running())}
    live = {i for i in running if leases.leased(r, JOB, i)}
    return {"running": len(live - done), "queued": len({int(v) for v in r.smembers(keys.queued(JOB))} - done),
            "in_flight": sum(int(n) for i, n in r.hgetall(keys.made(JOB)).items() if int(i) not in done),
            "records_done": sum(ChunkStats.model_validate_json(v).records
                                for i, v in r.hgetall(keys.chunk_stats(JOB)).items() if int(i) in done)}


def seen(st: Any) -> dict[str, int]:
    return {"running": st.chunks_running, "queued": st.chunks_queued, "in_flight": st.tokens_in_flight,
            "records_done": st.records_done}


@pytest.mark.slow
def test_status_and_job_metrics_at_64000_chunks_read_in_slices_and_stay_exact(redis_server: LocalRedis,
                                                                               tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    settings = Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"))
    admin = redis.Redis(port=redis_server.port)
    fill(admin, store, settings)
    r = counting_client(redis_server)

    # When: one `fleet status` and one job-metrics scrape
    st = job_status(store, r, JOB)
    status_replies = list(Counting.replies)
    Counting.replies = []
    scraped = JobCollector(store, r, settings).statuses()
    scrape_replies = list(Counting.replies)

    # Then: no single command answered with more than a slice of the job's keys
    for look, replies in (("status", status_replies), ("job-metrics", scrape_replies)):
        name, biggest = max(replies, key=lambda x: x[1])
        assert biggest <= BOUND, f"{look}: one {name} carried {biggest} values (> {BOUND}): it holds the broker"
    # ...and the figures are the whole keys' figures
    assert seen(st) == recount(admin) == seen(scraped[0])
    assert st.chunks_running == RUNNING and st.chunks_queued == QUEUED and st.records_done == DONE * 256

    # Given: kills (leases of 500 runs gone, their figures left behind) and retries (their chunks queued
    # again, their attempts charged, 200 more runs ending and their tokens counted)
    with admin.pipeline(transaction=False) as p:
        for index in range(CHUNKS - 500, CHUNKS):
            p.delete(keys.lease(JOB, index))
        p.execute()
    for index in range(CHUNKS - 500, CHUNKS):
        admin.sadd(keys.queued(JOB), index)
        counters.charge(admin, JOB, index, "crash", 1)
    for index in range(CHUNKS - RUNNING, CHUNKS - RUNNING + 200):
        figures.end_run(admin, JOB, index, 333, owner=True)
    Counting.replies = []

    # When: status again. Then: still exact, still in slices
    again = job_status(store, r, JOB)
    assert seen(again) == recount(admin)
    assert again.chunks_running == RUNNING - 500 and again.chunks_queued == QUEUED + 500
    assert max(n for _, n in Counting.replies) <= BOUND


def test_a_job_metrics_scrape_asks_redis_only_for_the_headers_of_chunks_done_since_the_last(
        redis_server: LocalRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given: a job of 1,000 chunks, 600 of them done, and the exporter's first scrape
    monkeypatch.setattr(jobmetrics, "CACHE_S", 0.0)
    store = LocalStore(tmp_path / "store")
    settings = Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"))
    store.put(manifest_key(JOB), Manifest(job=JOB, input="x", chunk_size=256, chunks=1_000, records=256_000,
                                          samples=256_000, config={"sampling": {}}, config_hash="x").to_bytes())
    r = counting_client(redis_server)
    leases.add_job(r, JOB, store_of(settings))
    for index in range(600):
        store.put(result_key(JOB, index), encode_result(stats(index), []))
        figures.cache_stats(r, JOB, index, stats(index))
    collector = JobCollector(store, r, settings)
    assert collector.statuses()[0].records_done == 600 * 256

    # When: 25 more chunks are done and it scrapes again
    for index in range(600, 625):
        store.put(result_key(JOB, index), encode_result(stats(index), []))
        figures.cache_stats(r, JOB, index, stats(index))
    Counting.replies = []
    st = collector.statuses()[0]

    # Then: the headers it read were the 25 new ones', and its figures count all 625
    assert sum(n for name, n in Counting.replies if name.endswith(keys.chunk_stats(JOB))) == 25
    assert st.records_done == 625 * 256 and st.chunks_done == 625


def test_an_idle_workers_queue_look_is_one_exists_over_every_priority_list(redis_server: LocalRedis) -> None:
    # Given a queue whose ten priority lists are empty
    r = counting_client(redis_server)
    # When an idle worker asks whether anything waits. Then: nothing, in one command
    assert not chunkqueue.waiting(r, "q")
    assert [name for name, _ in Counting.replies] == ["EXISTS q"]
    # Given a message waiting at priority 3 (kombu's list for it): then something waits
    r.lpush(keys.queue_lists("q")[3], "message")
    assert chunkqueue.waiting(r, "q")
