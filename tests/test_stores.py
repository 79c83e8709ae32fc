"""Stores on one broker (issue 44, docs/architecture.md "Stores on one broker"): two stores'
jobs on one Redis never meet, with real workers and real `fleet` commands."""

from __future__ import annotations

import json
import time

import pytest
import redis

from fleet.coord import keys
from fleet.store import open_store
from fleet.store.identity import store_id
from fleet.store.layout import failed_prefix, results_prefix
from tests.conftest import run_fleet
from tests.fleetproc import Workers, wait_for, write_prompts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.002",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "60",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": "4",
    "FLEET_SLOTS": "1",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_GRACE_S": "1",
}
#: chunks of each store's job: the issue's stuck run had 4 and 32
CHUNKS = {"a": 4, "b": 32}


def results(store_url: str, job: str) -> int:
    return len(list(open_store(store_url).list(results_prefix(job))))


def test_two_stores_on_one_redis_one_slot_each_both_finish(tmp_path, redis_server, clean_env):
    # Given two stores on one Redis, each with a job enqueued by its own `fleet enqueue`
    stores = {job: str(tmp_path / f"store-{job}") for job in CHUNKS}
    env = {job: {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": url} for job, url in stores.items()}
    for job, chunks in CHUNKS.items():
        prompts = write_prompts(tmp_path / f"{job}.jsonl", 4 * chunks, prefix=job)
        enq = run_fleet("enqueue", str(prompts), "--job", job, env=env[job])
        assert enq.returncode == 0, enq.stderr
    # And one worker of one slot on each store
    workers = Workers({**SIM, "FLEET_BROKER_URL": redis_server.url}, tmp_path / "logs")
    r = redis.Redis(port=redis_server.port)
    try:
        began = time.monotonic()
        for job in CHUNKS:
            workers.start(f"host-{job}", extra_env={"FLEET_STORE_URL": stores[job]})
        # When they run, Then both jobs finish: every chunk of each has its result in its own store
        took = wait_for(lambda: all(results(stores[j], j) == n for j, n in CHUNKS.items()), 120,
                        "both stores' jobs to finish")
        print(f"two stores, one slot each: both jobs done {took:.1f}s after the workers started "
              f"({time.monotonic() - began:.1f}s)")
    finally:
        workers.stop()
    # And neither worker ever met the other store's chunk, nor handed one back
    logs = workers.logs()
    assert "no manifest" not in logs and "handed back" not in logs
    # And neither store's job set lost its job: each job is its own store's on the broker
    owners = {k.decode(): v.decode() for k, v in r.hgetall(keys.job_stores()).items()}
    assert owners == {job: store_id(url) for job, url in stores.items()}
    # And each store holds its own job only, nothing failed, and its status says done
    for job, url in stores.items():
        other = next(j for j in CHUNKS if j != job)
        assert not list(open_store(url).list(f"{other}/")) and not list(open_store(url).list(failed_prefix(job)))
        st = run_fleet("status", "--job", job, "--json", env=env[job])
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["done"] is True


def test_a_job_name_of_another_store_is_refused_before_anything_is_written(tmp_path, redis_server, clean_env):
    # Given store A's job "a" enqueued on the broker
    prompts = write_prompts(tmp_path / "a.jsonl", 8)
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url}
    assert run_fleet("enqueue", str(prompts), "--job", "a",
                     env={**env, "FLEET_STORE_URL": str(tmp_path / "store-a")}).returncode == 0
    # When store B enqueues a job of the same name on the same broker
    out = run_fleet("enqueue", str(prompts), "--job", "a", env={**env, "FLEET_STORE_URL": str(tmp_path / "store-b")})
    # Then it is refused with one line naming both stores' ids, and store B holds nothing of it
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert "is another store's on this broker" in out.stderr
    assert store_id(str(tmp_path / "store-a")) in out.stderr and store_id(str(tmp_path / "store-b")) in out.stderr
    assert not list(open_store(str(tmp_path / "store-b")).list("a/"))
    r = redis.Redis(port=redis_server.port)
    assert r.hgetall(keys.job_stores()) == {b"a": store_id(str(tmp_path / "store-a")).encode()}
