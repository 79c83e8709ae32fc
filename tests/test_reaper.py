"""One recovery round (fleet.coord.recovery.Reaper) for every process that watches the broker:
`fleet enqueue` runs the same round as a worker's reaper thread and `fleet run`, on a real
redis-server with a real Celery producer."""

from __future__ import annotations

import time

import pytest
import redis

from fleet.coord import keys
from fleet.coord.broker import make_celery, store_of
from fleet.coord.leases import Lease, leased
from fleet.coord.localredis import free_port
from fleet.coord.recovery import Reaper
from fleet.producer.enqueue import enqueue_missing, prepare_job
from fleet.settings import Settings
from fleet.store.local import LocalStore
from tests.fleetproc import write_prompts
from tests.test_recovery import queued_messages

QUEUE = "fleet-test-q"


@pytest.fixture
def settings(redis_server, tmp_path, clean_env) -> Settings:
    return Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE, lease_ttl_s=0.2,
                    chunk_size=4)


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def app(settings):
    app = make_celery(settings)
    yield app
    app.close()


@pytest.fixture
def store(settings) -> LocalStore:
    return LocalStore(settings.store_url or "")


def lose_worker(r: redis.Redis, job: str, index: int, store: str) -> None:
    """A worker of `store` took the chunk's lease and died: the lease runs out, the chunk stays in the running set."""
    assert Lease(r, job, index, "gpu0@dead:1", ttl_s=0.05, store=store).acquire()
    deadline = time.monotonic() + 2
    while leased(r, job, index) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_enqueue_runs_the_whole_recovery_round(r, store, app, settings, tmp_path):
    # Given a job of three chunks, a chunk of an old job of this store whose worker died, a job of
    # this store whose manifest is gone, and another store's job, whose worker died too
    manifest, _ = prepare_job(settings, store, str(write_prompts(tmp_path / "p.jsonl", 12)), "j")
    mine = store_of(settings)
    lose_worker(r, "old", 1, mine)
    r.hset(keys.job_stores(), "gone", mine)
    lose_worker(r, "elsewhere", 0, "0123456789ab")
    # When `fleet enqueue` enqueues the job
    report = enqueue_missing(r, app, store, settings, manifest)
    # Then the lost chunk is requeued (recovery priority comes first), the store's idle job without
    # a manifest leaves its job set, and the job's chunks are sent; the other store's job and its
    # lost chunk are left to that store's reaper
    assert queued_messages(r) == [{"job": "old", "index": 1, "attempt": 1}]
    assert report.enqueued == [0, 1, 2]
    owners = {k.decode(): v.decode() for k, v in r.hgetall(keys.job_stores()).items()}
    assert owners == {"j": mine, "old": mine, "elsewhere": "0123456789ab"}
    assert r.smembers(keys.running()) == {b"elsewhere/0"}


@pytest.mark.slow
def test_a_round_survives_a_dead_broker(store, app, settings, caplog):
    # Given a broker that is gone
    dead = redis.Redis(port=free_port(), socket_connect_timeout=0.2)
    # When a round runs, Then it says so and returns: the next round tries again
    Reaper(dead, store, app, settings).round()
    assert "failed" in caplog.text
