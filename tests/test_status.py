"""`fleet status` figures (docs/architecture.md, CLI) from a job built directly in a local store:
chunks done and failed from the store, running and queued from a real Redis, records and
tokens from the result headers, tok/s over a recent window, ETA and cost."""

from __future__ import annotations

import json
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from rich.console import Console

from fleet.cli.jobs import status_table
from fleet.coord import keys, suspects
from fleet.coord.chunkstate import Quarantine
from fleet.coord.leases import Lease
from fleet.coord.localredis import free_port
from fleet.errors import ObjectMissing
from fleet.monitor.status import RATE_WINDOW_S, job_status, recent_rate
from fleet.store.layout import encode_lines, manifest_key, result_key
from fleet.store.local import LocalStore
from fleet.store.manifest import Manifest, config_hash
from fleet.store.results import ChunkStats, encode_result

JOB = "j"


def write_manifest(store: LocalStore, chunks: int, records: int, samples: int) -> None:
    config = {"engine": "sim", "seed": 0}
    m = Manifest(
        job=JOB,
        input="in.jsonl",
        chunk_size=4,
        chunks=chunks,
        records=records,
        samples=samples,
        config=config,
        config_hash=config_hash(config),
    )
    store.put(manifest_key(JOB), m.to_bytes())


def write_result(
    store: LocalStore,
    index: int,
    records: int,
    tokens: int,
    started: float,
    finished: float,
    worker: str = "gpu0@h",
    errors: int = 0,
    prompt: int = 10,
) -> dict:
    stats = {
        "job": JOB,
        "chunk": index,
        "records": records,
        "samples": records,
        "prompt_tokens": prompt * records,
        "completion_tokens": tokens,
        "errors": errors,
        "started": started,
        "finished": finished,
        "worker": worker,
        "attempt": 1,
    }
    rows = [
        {
            "id": f"{index}-{i}",
            "pos": index * 4 + i,
            "sample": 0,
            "completion_tokens": tokens // records,
            "finish_reason": "stop",
        }
        for i in range(records)
    ]
    store.put(result_key(JOB, index), encode_result(ChunkStats(**stats), rows))
    return stats


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


@pytest.fixture
def r(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def half_done_job(store: LocalStore, now: float) -> None:
    """4 chunks of 4 records: 0 and 1 done (by two GPUs), 2 quarantined, 3 not started."""
    write_manifest(store, chunks=4, records=15, samples=15)
    write_result(store, 0, 4, 4000, started=now - 100, finished=now - 60, worker="gpu0@h")
    write_result(store, 1, 4, 2000, started=now - 90, finished=now - 20, worker="gpu1@h", errors=1)
    Quarantine(index=2, error="engine died", error_type="EngineError", attempts=3).write(store, JOB)


# -- recent_rate -------------------------------------------------------------------------


def test_recent_rate_of_nothing_is_zero():
    assert recent_rate([], now=100.0) == 0.0


def test_recent_rate_of_a_young_running_job_spans_the_whole_run():
    # Given two chunks done within the window, the run younger than the window
    stats = [
        ChunkStats(started=0, finished=100, completion_tokens=1000),
        ChunkStats(started=50, finished=150, completion_tokens=2000),
    ]
    # When asked at t = 160
    # Then the rate is all tokens over the time since the first chunk started
    assert recent_rate(stats, now=160) == pytest.approx(3000 / 160)


def test_recent_rate_counts_only_chunks_finished_in_the_window():
    # Given chunks finishing at 100, 500 and 900, asked at 950 with a 300 s window
    stats = [
        ChunkStats(started=0, finished=100, completion_tokens=1000),
        ChunkStats(started=400, finished=500, completion_tokens=1000),
        ChunkStats(started=700, finished=900, completion_tokens=600),
    ]
    # Then only the chunk inside [650, 950] counts
    assert recent_rate(stats, now=950, window_s=300) == pytest.approx(600 / 300)


def test_recent_rate_of_a_finished_job_is_its_last_window():
    # Given a job whose last chunk finished long ago
    stats = [
        ChunkStats(started=0, finished=100, completion_tokens=1000),
        ChunkStats(started=50, finished=150, completion_tokens=2000),
    ]
    # Then the rate is that of its last window, not diluted by the idle time since
    assert recent_rate(stats, now=10_000, window_s=300) == pytest.approx(3000 / 150)


def test_recent_rate_default_window():
    assert RATE_WINDOW_S == 300.0


# -- job_status --------------------------------------------------------------------------


def test_status_of_a_half_done_job_without_broker(store):
    # Given a half-done job in the store and no broker
    now = time.time()
    half_done_job(store, now)
    # When its status is taken at $2 per GPU-hour
    began = time.time()
    st = job_status(store, None, JOB, usd_per_gpu_hour=2.0)
    ended = time.time()
    # Then the store's figures are exact
    assert (st.chunks_total, st.chunks_done, st.chunks_failed) == (4, 2, 1)
    assert (st.records_total, st.samples_total) == (15, 15)
    assert (st.records_done, st.samples_done) == (8, 8)
    assert (st.completion_tokens, st.prompt_tokens, st.record_errors) == (6000, 80, 1)
    assert st.workers == ["gpu0@h", "gpu1@h"]
    assert st.done is False
    assert st.failed == [
        {"index": 2, "error_type": "EngineError", "error": "engine died", "attempts": 3}
    ]
    # And rate, ETA and cost follow from them: 6000 tokens over the 100 s since the first start (and
    # the moments the call itself took)
    assert 100 + (began - now) - 0.01 <= st.elapsed_s <= 100 + (ended - now) + 0.01
    assert st.tok_s == pytest.approx(6000 / st.elapsed_s, rel=0.03)
    per_sample = 6000 / 8
    assert st.eta_s == pytest.approx((15 - 8) * per_sample / st.tok_s, rel=0.01)
    assert st.cost_usd == pytest.approx(2.0 * 2 * st.elapsed_s / 3600, rel=0.01)
    assert st.projected_cost_usd == pytest.approx(st.cost_usd + 2.0 * 2 * st.eta_s / 3600, rel=0.01)
    assert st.usd_per_m_tokens == pytest.approx(st.cost_usd / 6000 * 1e6, rel=0.01)


def test_status_json_has_the_contract_fields(store):
    half_done_job(store, time.time())
    data = json.loads(job_status(store, None, JOB).to_json())
    for name in (
        "chunks_total",
        "chunks_done",
        "chunks_failed",
        "records_done",
        "completion_tokens",
        "done",
    ):
        assert name in data
    assert (data["chunks_done"], data["chunks_failed"], data["done"]) == (2, 1, False)


def test_status_of_a_finished_job(store):
    # Given every chunk done, the last one an hour ago
    now = time.time()
    write_manifest(store, chunks=2, records=5, samples=5)
    write_result(store, 0, 4, 800, started=now - 3700, finished=now - 3650)
    write_result(store, 1, 1, 200, started=now - 3660, finished=now - 3600)
    # When its status is taken
    st = job_status(store, None, JOB, usd_per_gpu_hour=3.6)
    # Then it is done, elapsed ends at the last finish, nothing remains
    assert st.done is True
    assert (st.chunks_done, st.records_done, st.completion_tokens) == (2, 5, 1000)
    assert st.elapsed_s == pytest.approx(100, abs=0.01)
    assert st.tok_s == pytest.approx(1000 / 100)
    assert st.eta_s == 0
    assert st.cost_usd == pytest.approx(0.1)  # 3.6 $/h x 1 GPU x 100 s
    assert st.failed == []


def test_status_of_a_job_with_nothing_done(store):
    write_manifest(store, chunks=3, records=10, samples=20)
    st = job_status(store, None, JOB)
    assert (st.chunks_done, st.records_done, st.tok_s, st.eta_s, st.done) == (
        0,
        0,
        0.0,
        None,
        False,
    )


def test_a_quarantined_chunk_that_later_finished_is_not_failed(store):
    now = time.time()
    half_done_job(store, now)
    write_result(store, 2, 4, 100, started=now - 10, finished=now - 5)
    st = job_status(store, None, JOB)
    assert (st.chunks_done, st.chunks_failed, st.failed) == (3, 0, [])


def test_status_with_broker_counts_running_and_queued(store, r):
    # Given chunk 3 running under a live lease, chunk 1 (done) with a stale queued mark,
    # chunk 2 (failed) too, and a lease-less running member for chunk 3 of another job
    half_done_job(store, time.time())
    assert Lease(r, JOB, 3, "gpu0@h:1", ttl_s=30).acquire()
    r.sadd(keys.queued(JOB), 1, 2, 3)
    r.sadd(keys.running(), keys.member(JOB, 0))  # lease long gone
    # When status is taken with the broker
    st = job_status(store, r, JOB)
    # Then only live leases count as running, and queued excludes done and failed chunks
    assert st.broker is True
    assert st.chunks_running == 1
    assert st.chunks_queued == 1
    # And the result headers are now cached in Redis for the next call
    cached = {int(k): json.loads(v) for k, v in r.hgetall(keys.chunk_stats(JOB)).items()}
    assert sorted(cached) == [0, 1]
    assert cached[0]["completion_tokens"] == 4000


def test_status_reads_cached_stats_from_redis(store, r):
    # Given a cached header that differs from the stored one (as a sign of which is read)
    half_done_job(store, time.time())
    job_status(store, r, JOB)
    cached = json.loads(r.hget(keys.chunk_stats(JOB), 0))
    r.hset(keys.chunk_stats(JOB), 0, json.dumps({**cached, "completion_tokens": 1}))
    # Then status uses the cache, not the store
    assert job_status(store, r, JOB).completion_tokens == 2001
    # And without the broker it reads the store
    assert job_status(store, None, JOB).completion_tokens == 6000


def test_status_survives_a_dead_broker(store):
    # Given a Redis URL where nothing listens
    half_done_job(store, time.time())
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    # When status is taken
    st = job_status(store, dead, JOB)
    # Then it says the broker is unreachable and still reports the store's figures
    assert st.broker is False
    assert (st.chunks_done, st.completion_tokens, st.chunks_running) == (2, 6000, 0)


def test_status_of_an_unknown_job(store):
    with pytest.raises(ObjectMissing):
        job_status(store, None, "nope")


def test_status_tolerates_a_result_without_header(store):
    # Given one normal result and one written without a stats header
    now = time.time()
    write_manifest(store, chunks=2, records=5, samples=5)
    write_result(store, 0, 4, 800, started=now - 100, finished=now - 50)
    store.put(result_key(JOB, 1), encode_lines([{"id": "x", "pos": 4, "sample": 0}]))
    # When status is taken
    st = job_status(store, None, JOB)
    # Then both chunks count as done and the header's figures are summed
    assert (st.chunks_done, st.done, st.completion_tokens) == (2, True, 800)


def test_retractions_are_counted_per_chunk_and_shown_by_status(store):
    from fleet.cli.jobs import status_table
    from fleet.store.results import ChunkStats, sample_counts

    # Given two chunks whose records SGLang retracted 3 and 0 times in all
    now = time.time()
    write_manifest(store, chunks=2, records=4, samples=4)
    for index, retracted in ((0, [2, 1]), (1, [0, None])):
        rows = [{"id": f"{index}-{i}", "pos": index * 2 + i, "sample": 0, "prompt_tokens": 5, "completion_tokens": 9,
                 "finish_reason": "stop", "retractions": n} for i, n in enumerate(retracted)]  # fmt: skip
        stats = {"job": JOB, "chunk": index, "records": 2, **sample_counts(rows), "started": now - 20,
                 "finished": now - 10, "worker": "gpu0@h"}  # fmt: skip
        store.put(result_key(JOB, index), encode_result(ChunkStats(**stats), rows))
    # When its status is taken
    st = job_status(store, None, JOB)
    # Then the JSON has the sum, and the text says what it means
    assert json.loads(st.to_json())["retractions"] == 3
    table = status_table(st)
    cells = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert cells["retractions"].startswith("3 (0.75 per sample): the batch outgrows the KV pool")


def test_status_names_workers_whose_processes_keep_dying(store, r):
    # Given worker gpu0@bad whose three processes died before finishing a batch, and gpu0@ok
    # whose one death came after it had committed one
    half_done_job(store, time.time())
    for n in range(3):
        suspects.note_process_death(r, f"gpu0@bad:{n}")
    suspects.note_commit(r, "gpu0@ok:1")
    suspects.note_process_death(r, "gpu0@ok:1")
    # When status is taken
    st = job_status(store, r, JOB, bench_after=3)
    # Then only the dying one is listed, with its deaths, benched; in JSON and in the table
    [dying] = st.dying_workers
    assert (dying["worker"], dying["deaths"], dying["deaths_in_a_row"], dying["benched"]) == ("gpu0@bad", 3, 3, True)
    assert json.loads(st.to_json())["dying_workers"][0]["worker"] == "gpu0@bad"
    console = Console(record=True, width=200)
    console.print(status_table(st))
    text = console.export_text()
    assert "dying gpu0@bad" in text and "3 deaths, 3 in a row" in text and "benched" in text
    assert "gpu0@ok" not in text
