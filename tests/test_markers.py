"""`fleet enqueue` repairs "queued" markers that no message backs (a real redis-server, real
Celery messages, and a real kombu consumer process killed after taking a message).

A marker is trusted while its chunk's message waits in a queue list, or sits in kombu's
unacked hash taken recently; a marker with no message anywhere, or whose message was
taken long ago by a worker that never took the lease, is cleared and the chunk sent again."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.coord.broker import chunk_queue, make_celery
from fleet.coord.leases import Lease
from fleet.coord.queuescan import waiting_messages
from fleet.producer.enqueue import LOST_AFTER_LEASES, enqueue_missing, prepare_job
from fleet.settings import Settings
from fleet.store.local import LocalStore
from tests.conftest import run_fleet
from tests.fleetproc import write_prompts

QUEUE = "fleet-markers"
JOB = "m"


@pytest.fixture
def settings(redis_server, clean_env, tmp_path: Path) -> Settings:
    return Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE,
                    chunk_size=4, lease_ttl_s=1.0)


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def job(settings: Settings, r: redis.Redis, tmp_path: Path):
    """A 3-chunk job enqueued once: three messages waiting, three markers set."""
    prompts = write_prompts(tmp_path / "in.jsonl", 12)
    store = LocalStore(settings.store_url)
    manifest, _ = prepare_job(settings, store, str(prompts), JOB)
    app = make_celery(settings)
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.enqueued == [0, 1, 2]
    yield app, store, manifest, prompts
    app.close()


def take_and_die(settings: Settings) -> None:
    """A consumer process that takes one message (kombu records it as unacked) and dies."""
    code = textwrap.dedent(f"""
        import os
        from fleet.coord.broker import chunk_queue, make_celery
        from fleet.settings import Settings
        app = make_celery(Settings(broker_url={settings.broker_url!r}, store_url={settings.store_url!r},
                                   queue={QUEUE!r}))
        with app.connection_for_read() as conn:
            assert conn.default_channel.basic_get(queue={chunk_queue(settings)!r}, no_ack=False) is not None
            os._exit(0)  # killed: no ack, no restore at shutdown
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.slow
def test_messages_are_found_in_lists_and_in_unacked(settings, r, job):
    before = time.time()
    take_and_die(settings)
    after = time.time()
    found = waiting_messages(r, chunk_queue(settings), JOB)
    assert r.hlen(keys.KOMBU_UNACKED) == 1 and r.zcard(keys.KOMBU_UNACKED_INDEX) == 1
    assert len(found.listed) == 2 and len(found.unacked) == 1
    assert found.listed | set(found.unacked) == {0, 1, 2}
    assert before - 1 <= next(iter(found.unacked.values())) <= after + 1  # when it was taken (kombu's clock)


def test_markers_backed_by_a_queued_message_are_left_alone(settings, r, job):
    app, store, manifest, _ = job
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.repaired == [] and report.enqueued == [] and report.queued == 3
    assert len(waiting_messages(r, chunk_queue(settings), JOB).listed) == 3


@pytest.mark.slow
def test_a_marker_whose_message_was_just_taken_is_left_alone(settings, r, job):
    app, store, manifest, _ = job
    take_and_die(settings)
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.repaired == [] and report.enqueued == []


def test_a_marker_with_no_message_is_repaired(settings, r, job):
    app, store, manifest, _ = job
    # Given the messages gone (a broker restored without its lists) and the markers kept
    for name in keys.queue_lists(chunk_queue(settings)):
        r.delete(name)
    # When enqueue runs again
    report = enqueue_missing(r, app, store, settings, manifest)
    # Then each chunk is sent again, once
    assert report.repaired == [0, 1, 2] and report.enqueued == [0, 1, 2]
    assert sorted(waiting_messages(r, chunk_queue(settings), JOB).listed) == [0, 1, 2]
    assert {int(i) for i in r.smembers(keys.queued(JOB))} == {0, 1, 2}


@pytest.mark.slow
def test_a_message_taken_long_ago_without_a_lease_is_repaired(settings, r, job):
    app, store, manifest, _ = job
    take_and_die(settings)
    (tag,) = r.hkeys(keys.KOMBU_UNACKED)
    (index,) = waiting_messages(r, chunk_queue(settings), JOB).unacked
    # Given the dead consumer took it longer ago than any worker needs to take the lease
    long_ago = time.time() - LOST_AFTER_LEASES * settings.lease.ttl_s - 5
    r.zadd(keys.KOMBU_UNACKED_INDEX, {tag: long_ago})
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.repaired == [index] and report.enqueued == [index]
    assert sorted(waiting_messages(r, chunk_queue(settings), JOB).listed) == [0, 1, 2]


@pytest.mark.slow
def test_a_message_taken_long_ago_whose_chunk_runs_is_left_alone(settings, r, job):
    app, store, manifest, _ = job
    take_and_die(settings)
    (tag,) = r.hkeys(keys.KOMBU_UNACKED)
    (index,) = waiting_messages(r, chunk_queue(settings), JOB).unacked
    r.zadd(keys.KOMBU_UNACKED_INDEX, {tag: time.time() - 3600})
    lease = Lease(r, JOB, index, "gpu0@alive:1", ttl_s=30)
    assert lease.acquire()
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.repaired == [] and report.enqueued == []


@pytest.mark.slow
def test_fleet_enqueue_reports_the_repair(settings, r, job, redis_server):
    _app, _store, _manifest, prompts = job
    for name in keys.queue_lists(chunk_queue(settings)):
        r.delete(name)
    env = {"FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": settings.store_url,
           "FLEET_QUEUE": QUEUE, "FLEET_CHUNK_SIZE": "4"}
    out = run_fleet("enqueue", str(prompts), "--job", JOB, env=env)
    assert out.returncode == 0, out.stderr
    assert "enqueued 3" in out.stderr and "repaired 3 stale queued marker(s)" in out.stderr


def test_other_jobs_and_foreign_entries_are_not_counted(settings, r, job):
    app, store, manifest, _ = job
    # Given the job's messages lost, while another job's message and a foreign entry wait
    for name in keys.queue_lists(chunk_queue(settings)):
        r.delete(name)
    from fleet.coord.broker import send_chunk

    send_chunk(app, chunk_queue(settings), "other-job", 1)
    r.lpush(chunk_queue(settings), b"not json at all")
    r.hset(keys.KOMBU_UNACKED, "tag-x", b'["no", "message"]')
    # When enqueue runs, Then only this job's markers are judged, all stale
    report = enqueue_missing(r, app, store, settings, manifest)
    assert report.repaired == [0, 1, 2]
    assert waiting_messages(r, chunk_queue(settings), "other-job").listed == {1}
