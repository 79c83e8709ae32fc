"""Fast recovery (docs/architecture.md, Recovery) on a real redis-server with a real Celery producer:
an expired lease without a result is requeued once, spending no attempt; a chunk with a result
is only forgotten; only a chunk whose workers die within seconds of starting it is quarantined,
on its own budget; StallWatch re-enqueues missing chunks only after two idle checks in a row; and
the leader's round scans the running set only on a death, a let-go or every few rounds."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import redis

from fleet.coord import keys, leases, suspects, witness
from fleet.coord.broker import TASK_NAME, chunk_queue, make_celery, redis_client, store_of
from fleet.coord.chunkstate import Quarantine, read_failures
from fleet.coord.leaseclock import LeaseClock
from fleet.coord.leases import Lease, add_job, leased, leased_of, run_owner
from fleet.coord.localredis import LocalRedis
from fleet.coord.outages import Outages, Window, outages_of
from fleet.coord.pause import Expiry, PauseJudge
from fleet.coord.recovery import Reaper, StallWatch, requeue_expired, watch_jobs
from fleet.coord.scangate import FULL_SCAN_EVERY, Why
from fleet.settings import Settings
from fleet.store.layout import failed_key, result_key
from fleet.store.local import LocalStore
from fleet.store.options import JobOptions, write_options
from fleet.store.results import ChunkStats, encode_result
from tests.fleetproc import wait_for

QUEUE = "fleet-test-q"


#: the jobs these tests lease chunks of: the store's own on the broker, as its `fleet enqueue` left them
JOBS = ("j", "a", "b", "other", "team/run-1")


@pytest.fixture
def settings(redis_server, tmp_path, clean_env) -> Settings:
    return Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE, lease_ttl_s=0.2,
                    max_attempts=3)


@pytest.fixture(autouse=True)
def own_jobs(redis_server, settings) -> None:
    """The jobs are the settings' store's on the broker (a reaper recovers only its own store's)."""
    client = redis.Redis.from_url(redis_server.url)
    for job in JOBS:
        add_job(client, job, store_of(settings))
    client.close()


@pytest.fixture
def r(redis_server) -> redis.Redis:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def app(settings):
    app = make_celery(settings)
    yield app
    app.close()


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def recovery_lists(r: redis.Redis) -> list[str]:
    """The recovery-priority list of each store's chunk queue (`<QUEUE>.<store id>`, kombu's list of priority 0)."""
    return sorted(name.decode() for name in r.scan_iter(match=f"{QUEUE}.*") if keys.PRIORITY_SEP.encode() not in name)


def queued_messages(r: redis.Redis) -> list[dict]:
    """The chunk messages in the Celery queue at recovery priority: kombu keeps base64 JSON bodies in a Redis list."""
    out = []
    for raw in (raw for name in recovery_lists(r) for raw in r.lrange(name, 0, -1)):
        envelope = json.loads(raw)
        assert envelope["headers"]["task"] == TASK_NAME
        assert envelope["content-type"] == "application/json"
        assert envelope["properties"]["body_encoding"] == "base64"
        args, kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        assert args == []
        out.append(kwargs)
    return out


def running(r: redis.Redis) -> set[str]:
    return {m.decode() for m in r.smembers(keys.running())}


def expired_lease(r: redis.Redis, job: str, index: int, attempts_started: int) -> None:
    """A worker took the chunk (attempt counted, lease taken) and died: its lease runs out."""
    r.hset(keys.attempts(job), index, attempts_started)
    assert Lease(r, job, index, "gpu0@dead:1", ttl_s=0.05).acquire()
    deadline = time.monotonic() + 2
    while leased(r, job, index) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not leased(r, job, index)


def put_result(store: LocalStore, job: str, index: int) -> None:
    store.put(result_key(job, index), encode_result(ChunkStats(chunk=index), []))


# -- requeue_expired ---------------------------------------------------------------------


def test_expired_lease_without_result_is_requeued_once(r, store, app, settings):
    # Given a chunk whose worker died after its first attempt started
    expired_lease(r, "j", 2, attempts_started=1)
    # When the reaper runs
    touched = requeue_expired(r, store, app, settings)
    # Then exactly one message names the chunk, with attempt 2, and the chunk is marked queued
    assert touched == ["j/2"]
    assert queued_messages(r) == [{"job": "j", "index": 2, "attempt": 2}]
    assert running(r) == set()
    assert r.smembers(keys.queued("j")) == {b"2"}
    # When the reaper runs again, nothing more is sent
    assert requeue_expired(r, store, app, settings) == []
    assert len(queued_messages(r)) == 1


def test_two_reapers_seeing_the_same_expiry_send_one_message(r, store, app, settings):
    # Given an expired chunk that a second reaper still sees in its snapshot of the running set
    expired_lease(r, "j", 0, attempts_started=1)
    assert requeue_expired(r, store, app, settings) == ["j/0"]
    r.sadd(keys.running(), keys.member("j", 0))
    # When the second reaper processes it within the guard period
    assert requeue_expired(r, store, app, settings) == []
    # Then still one message
    assert len(queued_messages(r)) == 1


def test_message_attempt_counts_the_attempts_spent(r, store, app, settings):
    expired_lease(r, "j", 5, attempts_started=2)
    requeue_expired(r, store, app, settings)
    assert queued_messages(r) == [{"job": "j", "index": 5, "attempt": 3}]


def test_live_lease_is_left_alone(r, store, app, settings):
    # Given a chunk whose worker is alive
    assert Lease(r, "j", 1, "gpu0@alive:1", ttl_s=30).acquire()
    # When the reaper runs
    assert requeue_expired(r, store, app, settings) == []
    # Then nothing is sent and the chunk stays watched
    assert queued_messages(r) == []
    assert running(r) == {"j/1"}


def test_expired_lease_with_result_is_only_forgotten(r, store, app, settings):
    # Given a chunk that committed its result and whose worker then died before releasing
    expired_lease(r, "j", 4, attempts_started=1)
    put_result(store, "j", 4)
    # When the reaper runs
    touched = requeue_expired(r, store, app, settings)
    # Then the chunk leaves the running set, and nothing is queued or quarantined
    assert running(r) == set()
    assert queued_messages(r) == []
    assert touched == []
    assert not store.exists(failed_key("j", 4))
    assert r.smembers(keys.queued("j")) == set()


def long_run(r: redis.Redis, job: str, index: int, seconds: float) -> None:
    """Backdate the lease clock: the lost worker had run the chunk this long."""
    member = keys.member(job, index)
    beat = int(r.hget(keys.lease_beat(), member))
    r.hset(keys.lease_started(), member, beat - int(seconds * 1000))


def test_worker_loss_after_a_long_run_spends_nothing(r, store, app, settings):
    # Given a chunk out of attempts whose worker died a minute into running it
    expired_lease(r, "j", 7, attempts_started=settings.failure.max_attempts)
    r.hset(keys.crashes("j"), 7, 2)
    long_run(r, "j", 7, 60)
    # When the reaper runs
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    # Then it is requeued, not quarantined; no attempt spent; the crash suspicion is cleared
    assert queued_messages(r) == [{"job": "j", "index": 7, "attempt": settings.failure.max_attempts + 1}]
    assert read_failures(store, "j") == []
    assert int(r.hget(keys.attempts("j"), 7)) == settings.failure.max_attempts
    assert r.hget(keys.crashes("j"), 7) is None
    assert r.hget(keys.lease_started(), "j/7") is None and r.hget(keys.lease_beat(), "j/7") is None


def lost_run(r: redis.Redis, job: str, index: int, owner: str, solo: bool = False, committed: bool = True,
             witnessed: bool = True) -> None:
    """A process took the chunk (beside others, or alone) and died at once: its lease runs out. Its launcher
    saw it die (`witnessed`), or it vanished with its host and nothing that outlived it saw it."""
    lease = Lease(r, job, index, owner, ttl_s=0.2)
    assert lease.acquire()
    suspects.note_holder(r, job, index, owner)
    if solo:
        lease.restart_clock()
        suspects.start_solo(r, job, index, owner)
    if committed:  # it had finished other chunks before: a healthy process
        suspects.note_commit(r, owner)
    if witnessed:
        witness.note_witnessed(r, owner, "its launcher saw it killed by SIGKILL")
    wait_for(lambda: not leased(r, job, index), 30, "lease expiry")
    r.delete(keys.requeue_guard(job, index))


@pytest.mark.parametrize("waited_s", [0.0, 60.0])
def test_a_death_while_a_suspect_waits_to_run_alone_is_no_evidence(r, store, app, settings, waited_s):
    # Given a suspect with a solo death on host b, now leased by a process on host a that waits
    # (short or long) for its other chunks to end before running it alone
    for n in range(settings.failure.solo_after):
        lost_run(r, "j", 7, f"gpu0@b:{n}")
        assert requeue_expired(r, store, app, settings) == ["j/7"]
    lost_run(r, "j", 7, "gpu0@b:9", solo=True)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    before = suspects.suspicion(r, "j", 7)
    assert before.deaths == settings.failure.solo_after + 1 and int(r.hget(keys.crashes("j"), 7)) == 1
    lease = Lease(r, "j", 7, "gpu0@a:1", ttl_s=0.2)
    assert lease.acquire()
    suspects.wait_solo(r, "j", 7, "gpu0@a:1")
    suspects.note_holder(r, "j", 7, "gpu0@a:1")
    witness.note_witnessed(r, "gpu0@a:1", "its launcher saw it killed by SIGKILL")
    # When the process dies during the wait (killed by one of its other chunks)
    wait_for(lambda: not leased(r, "j", 7), 30, "lease expiry")
    r.delete(keys.requeue_guard("j", 7))
    long_run(r, "j", 7, waited_s)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    # Then the chunk is requeued with its suspicion and solo death as they were: nothing spent, nothing cleared
    assert suspects.suspicion(r, "j", 7) == before and int(r.hget(keys.crashes("j"), 7)) == 1
    assert read_failures(store, "j") == [] and len(queued_messages(r)) == settings.failure.solo_after + 2
    # and its marks are gone, the process's death counted against its worker
    assert r.hget(keys.solo_waits(), "j/7") is None and r.hget(keys.lease_holder(), "j/7") is None
    assert suspects.worker_health(r, "gpu0@a").deaths == 1


class FailingStore(LocalStore):
    """A store whose writes of quarantine records fail `fails` times (the store is down)."""

    fails = 0

    def put(self, key: str, data: bytes) -> None:
        if "/failed/" in key and self.fails:
            self.fails -= 1
            raise OSError("store down")
        super().put(key, data)


def test_a_failed_recovery_round_keeps_the_crash_evidence_for_the_next(r, tmp_path, app, settings):
    # Given a chunk with one solo death on host b, whose next solo run on host a dies at once
    store = FailingStore(tmp_path / "store")
    lost_run(r, "j", 7, "gpu0@b:1", solo=True)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    lost_run(r, "j", 7, "gpu0@a:1", solo=True)
    # When the reaper's round fails writing the quarantine record
    store.fails = 1
    assert requeue_expired(r, store, app, settings) == []
    # Then the chunk is watched again with its evidence, nothing counted twice
    assert running(r) == {"j/7"} and r.hget(keys.lease_started(), "j/7") is not None
    assert r.hget(keys.lease_holder(), "j/7") == b"gpu0@a:1" and r.hget(keys.solo_runs(), "j/7") == b"gpu0@a:1"
    assert int(r.hget(keys.crashes("j"), 7)) == 1
    # and the next round judges the same death: quarantined on its two solo deaths on two hosts
    r.delete(keys.requeue_guard("j", 7))
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    [failure] = read_failures(store, "j")
    assert failure["attempts"] == 2 and "2 host(s)" in failure["error"] and "alone" in failure["error"]
    assert int(r.hget(keys.crashes("j"), 7)) == 2 and running(r) == set()
    assert r.hget(keys.lease_started(), "j/7") is None and r.hget(keys.lease_holder(), "j/7") is None


@pytest.mark.slow
def test_deaths_beside_other_chunks_never_quarantine_solo_deaths_on_two_hosts_do(r, store, app, settings):
    # Given a chunk in six quick deaths of processes running it beside other chunks
    for n in range(1, 7):
        lost_run(r, "j", 7, f"gpu0@a:{n}")
        assert requeue_expired(r, store, app, settings) == ["j/7"]
        # Then each makes it a suspect, never a quarantine, and no attempt or crash is counted
        assert suspects.suspicion(r, "j", 7).deaths == n and r.hget(keys.crashes("j"), 7) is None
    assert read_failures(store, "j") == [] and len(queued_messages(r)) == 6
    # When it then kills a process running it alone on host b, and one on host a
    lost_run(r, "j", 7, "gpu0@b:1", solo=True)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    assert int(r.hget(keys.crashes("j"), 7)) == 1 and read_failures(store, "j") == []
    lost_run(r, "j", 7, "gpu0@a:9", solo=True)
    requeue_expired(r, store, app, settings)
    # Then it is quarantined as a worker-killer, on the evidence of its solo runs only, no attempt spent
    [failure] = read_failures(store, "j")
    assert failure["error_type"] == "WorkerLost" and failure["attempts"] == 2 and "2 host(s)" in failure["error"]
    assert len(queued_messages(r)) == 7 and not r.hget(keys.attempts("j"), 7)


def test_the_reaper_reads_the_jobs_own_crash_policy(r, store, app, settings):
    # Given job j whose options quarantine a chunk at its first solo death (the fleet's max_crashes is 3)
    write_options(store, "j", JobOptions(max_crashes=1))
    # When a process running chunk 7 alone dies at once
    lost_run(r, "j", 7, "gpu0@b:1", solo=True)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    # Then the reaper quarantines it under the job's policy, where the fleet's would requeue it
    [failure] = read_failures(store, "j")
    assert failure["error_type"] == "WorkerLost" and failure["attempts"] == 1 and "1 host(s)" in failure["error"]
    assert queued_messages(r) == []


@pytest.mark.slow
def test_a_process_lost_with_its_host_is_no_evidence_against_its_chunks(r, store, app, settings):
    # Given a chunk that vanished twice beside others and twice alone, on two hosts, within seconds of each
    # start, every time with its whole host: no launcher outlived a process to see it die
    settings.failure.witness_wait_s = 0.5
    runs = [("gpu0@a:1", False), ("gpu0@b:1", False), ("gpu0@a:2", True), ("gpu0@b:2", True)]
    for n, (owner, solo) in enumerate(runs, 1):
        lost_run(r, "j", 7, owner, solo=solo, witnessed=False)
        # When the reaper's rounds run, Then the first leaves it for a witness that may still come
        assert requeue_expired(r, store, app, settings) == [] and running(r) == {"j/7"}
        time.sleep(settings.failure.witness_wait_s)
        assert requeue_expired(r, store, app, settings) == ["j/7"]
        # and then it is requeued with nothing against it: never suspected, no crash, no attempt
        assert suspects.suspicion(r, "j", 7).deaths == 0 and r.hget(keys.crashes("j"), 7) is None
        assert len(queued_messages(r)) == n
    assert read_failures(store, "j") == [] and not r.hget(keys.attempts("j"), 7)
    # and the losses count against the hosts alone, once per process, not their workers
    assert witness.host_losses(r) == {"a": 2, "b": 2}
    assert r.hgetall(keys.worker_deaths()) == {} and suspects.dying_workers(r) == []
    assert r.hget(keys.lease_holder(), "j/7") is None and r.hget(keys.solo_runs(), "j/7") is None


def test_a_vanished_hosts_chunk_is_requeued_as_its_lease_runs_out_not_a_witness_wait_later(r, store, app, redis_server,
                                                                                           tmp_path, clean_env):
    # Given fleet's default lease (60 s, renewed every 10 s past the crash window), and a process that vanished
    # with its host (no witness) after its last renewal 60.5 s ago: its lease ran out 0.5 s ago
    settings = Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE)
    assert settings.lease.ttl_s == 60 and LeaseClock.of(settings).renew_s + settings.failure.witness_wait_s < 60
    lost_run(r, "j", 7, "gpu0@a:1", witnessed=False)
    last_ms = int((time.time() - 60.5) * 1000)
    r.hset(keys.lease_started(), "j/7", last_ms)
    r.hset(keys.lease_beat(), "j/7", last_ms)
    # When the reaper's next round runs
    touched = requeue_expired(r, store, app, settings)
    # Then the chunk is requeued at once, as a host's loss: a launcher that outlived its process would have said
    # how it died 47 s ago (its last renewal + 10 s + the 3 s witness wait), so no round more is left to it
    assert touched == ["j/7"] and len(queued_messages(r)) == 1
    assert witness.host_losses(r) == {"a": 1} and suspects.suspicion(r, "j", 7).deaths == 0


#: a worker process's chunk leases, in a child: argv[2] chunks of job "j" on its heartbeat (TTL 2 s, a beat
#: every 0.5 s); it prints its process's name once they are taken
HOLDER = """
import os, sys, time, redis
from fleet.coord.heartbeat import Heartbeat
from fleet.coord.leases import Lease, run_owner
r = redis.Redis.from_url(sys.argv[1])
owner = f"gpu0@doomed:{os.getpid()}"
hb = Heartbeat(interval_s=0.5)
for i in range(int(sys.argv[2])):
    lease = Lease(r, "j", i, run_owner(owner, i), ttl_s=2.0)
    assert lease.acquire()
    hb.add(lease)
hb.start()
print(owner, flush=True)
time.sleep(600)
"""


def test_a_sigkilled_process_has_its_128_chunks_requeued_within_the_ttl_and_a_round(r, store, app, redis_server,
                                                                                    tmp_path, clean_env):
    # Given a process holding 128 chunk leases (TTL 2 s) on its heartbeat, alive past several TTLs
    settings = Settings(broker_url=redis_server.url, store_url=str(tmp_path / "store"), queue=QUEUE, lease_ttl_s=2.0)
    chunks = [("j", i) for i in range(128)]
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, redis_server.url, "128"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        owner = proc.stdout.readline().strip()
        time.sleep(5.0)
        assert all(leased_of(r, chunks)) and requeue_expired(r, store, app, settings) == []
        # When it is killed with SIGKILL, and the reaper rounds every 0.5 s
        proc.send_signal(signal.SIGKILL)
        killed = time.monotonic()
    finally:
        proc.kill()
        proc.wait()
    touched: set[str] = set()
    found = killed
    while len(touched) < len(chunks) and time.monotonic() - killed < 30:
        began = time.monotonic()
        if got := requeue_expired(r, store, app, settings):
            touched |= set(got)
            found = began
        time.sleep(0.5)
    # Then the round that found them began within the TTL and a round of the kill (1 s more for a busy
    # machine's scheduling), and requeued each chunk once
    assert len(touched) == len(chunks) and found - killed <= 2.0 + 0.5 + 1.0
    assert sorted(m["index"] for m in queued_messages(r)) == list(range(128))
    # and nothing of the dead process is left behind: its chunk leases (keys with no TTL of their own) and
    # its process's key are gone
    assert not list(r.scan_iter(f"{keys.PREFIX}:j:lease:*"))
    assert not list(r.scan_iter(keys.process_lease(f"{owner}#*")))
    assert not running(r)


def test_a_witness_that_comes_while_the_reaper_waits_makes_the_death_evidence(r, store, app, settings):
    # Given a chunk with a solo death on host b, whose next solo run on host a dies at once
    lost_run(r, "j", 7, "gpu0@b:1", solo=True)
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    lost_run(r, "j", 7, "gpu0@a:1", solo=True, witnessed=False)
    # When the reaper's first round finds no witness yet, and its launcher then says how it died
    assert requeue_expired(r, store, app, settings) == [] and read_failures(store, "j") == []
    witness.note_witnessed(r, "gpu0@a:1", "its launcher saw it killed by SIGSEGV")
    r.delete(keys.requeue_guard("j", 7))
    assert requeue_expired(r, store, app, settings) == ["j/7"]
    # Then the death counts against the chunk as before: quarantined on two solo deaths on two hosts
    [failure] = read_failures(store, "j")
    assert failure["attempts"] == 2 and "2 host(s)" in failure["error"] and "SIGSEGV" in failure["error"]
    assert witness.host_losses(r) == {} and suspects.worker_health(r, "gpu0@a").deaths == 1


@pytest.mark.slow
def test_a_worker_whose_processes_keep_dying_is_blamed_and_benched(r, store, app, settings, caplog):
    # Given a healthy worker, and one whose processes each die soon after taking chunks, before finishing a batch
    suspects.note_commit(r, "gpu0@good:1")
    for n in range(1, settings.failure.bench_after + 1):
        lost_run(r, "j", n, f"gpu0@bad:{n}", committed=False)
        requeue_expired(r, store, app, settings)
    # Then its deaths are counted in a row, and only the first one's chunk is suspected
    health = suspects.worker_health(r, "gpu0@bad")
    assert (health.deaths, health.streak) == (settings.failure.bench_after, settings.failure.bench_after)
    assert [bool(suspects.suspicion(r, "j", n)) for n in range(1, settings.failure.bench_after + 1)] == \
        [True] + [False] * (settings.failure.bench_after - 1)
    assert "worker gpu0@bad benched" in caplog.text
    assert [h.worker for h in suspects.dying_workers(r)] == ["gpu0@bad"]
    assert suspects.healthy_others(r, "gpu0@bad") and not suspects.healthy_others(r, "gpu0@good")
    # and a process of it that commits a chunk ends the streak
    suspects.note_commit(r, "gpu0@bad:99")
    assert suspects.dying_workers(r) == []
    assert suspects.worker_health(r, "gpu0@bad").deaths == settings.failure.bench_after


def test_reaper_never_drops_a_new_owner(r, store, app, settings):
    # Given an expired chunk that a new owner leases between the reaper's scan and its removal
    from fleet.coord.leases import forget_unleased

    expired_lease(r, "j", 3, attempts_started=0)
    assert Lease(r, "j", 3, "gpu1@new:2", ttl_s=30).acquire()
    # When the reaper's one-step removal runs
    # Then it refuses: the chunk stays watched under its new owner, and nothing is sent
    assert forget_unleased(r, "j", 3) is None
    assert running(r) == {"j/3"}
    assert requeue_expired(r, store, app, settings) == []
    assert queued_messages(r) == []


def test_expired_lease_with_result_drops_leftover_checkpoints(r, store, app, settings):
    from fleet.store.layout import checkpoint_prefix

    expired_lease(r, "j", 4, attempts_started=0)
    store.put(checkpoint_prefix("j", 4) + "000001-w", b"x")
    put_result(store, "j", 4)
    requeue_expired(r, store, app, settings)
    assert list(store.list(checkpoint_prefix("j", 4))) == []


def test_jobs_are_kept_apart(r, store, app, settings):
    expired_lease(r, "a", 0, attempts_started=1)
    expired_lease(r, "b", 0, attempts_started=1)
    put_result(store, "a", 0)
    assert requeue_expired(r, store, app, settings) == ["b/0"]
    assert queued_messages(r) == [{"job": "b", "index": 0, "attempt": 2}]


def test_job_names_with_slashes_parse(r, store, app, settings):
    expired_lease(r, "team/run-1", 3, attempts_started=1)
    assert requeue_expired(r, store, app, settings) == ["team/run-1/3"]
    assert queued_messages(r) == [{"job": "team/run-1", "index": 3, "attempt": 2}]


# -- StallWatch --------------------------------------------------------------------------


def job_with_gaps(store: LocalStore) -> None:
    """Chunks 0..3: 0 done, 1 quarantined, 2 and 3 missing with nothing queued or running."""
    put_result(store, "j", 0)
    Quarantine(index=1, error="boom", error_type="EngineError", attempts=3).write(store, "j")


def test_stallwatch_reenqueues_only_on_the_second_idle_check(r, store, app, settings):
    # Given a job with missing chunks, an empty queue and no live lease
    job_with_gaps(store)
    r.hset(keys.attempts("j"), 3, 1)
    watch = StallWatch()
    # When checked once, nothing is sent (a message may be between pop and lease)
    assert watch.check(r, store, app, settings, "j", 4) == []
    assert queued_messages(r) == []
    # When checked a second time in a row, the missing chunks (not done, not failed) are sent
    assert watch.check(r, store, app, settings, "j", 4) == [2, 3]
    assert sorted(queued_messages(r), key=lambda m: m["index"]) == [
        {"job": "j", "index": 2, "attempt": 1},
        {"job": "j", "index": 3, "attempt": 2},
    ]
    assert r.smembers(keys.queued("j")) == {b"2", b"3"}


def test_stallwatch_counter_restarts_after_a_reenqueue(r, store, app, settings):
    job_with_gaps(store)
    watch = StallWatch()
    watch.check(r, store, app, settings, "j", 4)
    assert watch.check(r, store, app, settings, "j", 4) == [2, 3]
    r.delete(chunk_queue(settings))  # the messages were taken by workers that died before their lease
    # And a second process checking at once does not send the chunks again
    assert StallWatch().check(r, store, app, settings, "j", 4) == []
    assert StallWatch().check(r, store, app, settings, "j", 4) == []
    r.delete(keys.stall_guard("j"))  # the guard expires
    # Then the next stall again needs two idle checks
    assert watch.check(r, store, app, settings, "j", 4) == []
    assert watch.check(r, store, app, settings, "j", 4) == [2, 3]


def test_stallwatch_resets_when_work_is_queued_or_running(r, store, app, settings):
    # Given one idle check behind
    job_with_gaps(store)
    watch = StallWatch()
    assert watch.check(r, store, app, settings, "j", 4) == []
    # When a message is waiting in the queue, the check is not idle and resets the count
    r.lpush(chunk_queue(settings), "placeholder")
    assert watch.check(r, store, app, settings, "j", 4) == []
    r.delete(chunk_queue(settings))
    assert watch.check(r, store, app, settings, "j", 4) == []
    # When a live lease runs a chunk of the job, that resets the count too
    lease = Lease(r, "j", 2, "gpu0@alive:1", ttl_s=30)
    lease.acquire()
    assert watch.check(r, store, app, settings, "j", 4) == []
    lease.release()
    assert watch.check(r, store, app, settings, "j", 4) == []
    assert r.llen(QUEUE) == 0
    # And only the second idle check in a row sends
    assert watch.check(r, store, app, settings, "j", 4) == [2, 3]


def test_stallwatch_ignores_a_complete_job(r, store, app, settings):
    for i in range(3):
        put_result(store, "j", i)
    watch = StallWatch()
    for _ in range(3):
        assert watch.check(r, store, app, settings, "j", 3) == []
    assert queued_messages(r) == []


def test_stallwatch_counts_jobs_separately(r, store, app, settings):
    job_with_gaps(store)
    watch = StallWatch()
    assert watch.check(r, store, app, settings, "j", 4) == []
    assert watch.check(r, store, app, settings, "other", 1) == []
    assert watch.check(r, store, app, settings, "j", 4) == [2, 3]


# -- watch_jobs --------------------------------------------------------------------------


def test_a_job_without_manifest_is_pruned_and_does_not_stop_the_others(r, store, app, settings):
    # Given the store's jobs on the broker: one with no manifest in this store and nothing queued or
    # running, one without manifest with a chunk queued, one whose check raises, one stalled with
    # chunks missing; another store's job; and two jobs of the old shared job set, one this store's
    mine = store_of(settings)
    for job in ("gone", "busy", "broken"):
        add_job(r, job, mine)
    r.sadd(keys.queued("busy"), 0)
    add_job(r, "theirs", "0123456789ab")
    r.sadd(keys.legacy_jobs(), "old-mine", "old-theirs")
    put_result(store, "j", 0)
    put_result(store, "old-mine", 0)

    def chunks_of(job: str) -> int | None:
        if job == "broken":
            raise RuntimeError("store hiccup")
        return {"gone": None, "busy": None, "theirs": None, "old-theirs": None, "j": 3, "old-mine": 1}[job]

    stall = StallWatch()
    # When two recovery rounds run
    for _ in range(2):
        watch_jobs(r, store, app, settings, stall, chunks_of)
    # Then only the idle job without manifest left the store's set; the broken and the busy ones stay,
    # another store's job is left alone, the old set's job of this store joined it, and j was re-enqueued
    owners = {k.decode(): v.decode() for k, v in r.hgetall(keys.job_stores()).items()}
    assert owners == {**{job: mine for job in (*JOBS, "busy", "broken", "old-mine")},
                      "theirs": "0123456789ab"}
    assert r.smembers(keys.legacy_jobs()) == {b"old-theirs"}
    assert sorted(m["index"] for m in queued_messages(r)) == [1, 2]


def test_job_end_drops_every_checkpoint(r, store, app, settings):
    from fleet.store.layout import checkpoint_prefix, checkpoints_prefix

    for i in range(2):
        put_result(store, "j", i)
        store.put(checkpoint_prefix("j", i) + "000001-w", b"x")
    StallWatch().check(r, store, app, settings, "j", 2)
    assert list(store.list(checkpoints_prefix("j"))) == []


# -- broker pauses -------------------------------------------------------------------------


def freeze(server: LocalRedis, seconds: float, client: redis.Redis) -> None:
    """Stop the redis-server (a broker pause) while `client` waits on a command to it."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    waiting = threading.Thread(target=client.ping)
    try:
        waiting.start()
        time.sleep(seconds)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    waiting.join(timeout=10)


def leased_by(r: redis.Redis, job: str, index: int, process: str) -> Lease:
    lease = Lease(r, job, index, run_owner(process, 1), ttl_s=0.2)
    assert lease.acquire()
    suspects.note_holder(r, job, index, process)
    return lease


def nothing_recorded(r: redis.Redis) -> bool:
    return (r.hgetall(keys.worker_deaths()) == {} and r.hgetall(keys.suspects("j")) == {}
            and list(r.scan_iter(f"{keys.PREFIX}:dead:*")) == [])


@pytest.mark.slow
def test_a_lease_that_ran_out_while_the_reaper_could_not_reach_the_broker_is_left_to_its_holder(
        r, store, app, settings, redis_server):
    # Given a chunk leased by a live process, and a reaper whose own command waited through a broker
    # pause longer than the lease TTL
    reaper = redis_client(settings)
    reaper.ping()
    lease = leased_by(r, "j", 7, "gpu0@a:1")
    freeze(redis_server, 1.0, reaper)
    assert not leased(r, "j", 7)
    [window] = outages_of(reaper).windows()
    assert window.end - window.start >= 0.9
    # When it runs its recovery round
    assert requeue_expired(reaper, store, app, settings, outages_of(reaper)) == []
    # Then the chunk is left to its holder: still watched, no message, no death or suspicion
    assert running(r) == {"j/7"} and queued_messages(r) == [] and nothing_recorded(r)
    # and once the holder takes its lease back, the next rounds have nothing to do
    assert lease.retake()
    assert requeue_expired(reaper, store, app, settings, outages_of(reaper)) == []
    assert running(r) == {"j/7"} and queued_messages(r) == [] and nothing_recorded(r)


@pytest.mark.slow
def test_every_holder_losing_its_leases_at_once_is_a_pause_and_no_death(r, store, app, settings, caplog):
    # Given chunks of two processes on two hosts whose leases all run out at once, seen by a reaper that
    # saw no pause itself (`fleet enqueue` started afterwards)
    for index, process in ((1, "gpu0@a:1"), (2, "gpu0@b:1")):
        leased_by(r, "j", index, process)
    wait_for(lambda: not leased(r, "j", 1) and not leased(r, "j", 2), 30, "lease expiry")
    # When it runs its recovery round
    assert requeue_expired(r, store, app, settings) == []
    # Then it reads them as a broker or network pause: left to their holders, nothing recorded
    assert "ran out at once" in caplog.text
    assert running(r) == {"j/1", "j/2"} and queued_messages(r) == [] and nothing_recorded(r)
    # and when the holders never take them back, they are requeued after the grace, still with no death
    time.sleep(PauseJudge(Outages(), settings).grace_s)
    assert sorted(requeue_expired(r, store, app, settings)) == ["j/1", "j/2"]
    assert len(queued_messages(r)) == 2 and running(r) == set() and nothing_recorded(r)
    assert r.hget(keys.lease_holder(), "j/1") is None and r.hget(keys.lease_started(), "j/1") is None


def test_a_lease_lost_outside_any_pause_is_still_a_death(r, store, app, settings):
    # Given one process's lease running out while the broker answers everyone, its launcher seeing it die
    leased_by(r, "j", 3, "gpu0@a:1")
    witness.note_witnessed(r, "gpu0@a:1", "its launcher saw it killed by SIGKILL")
    wait_for(lambda: not leased(r, "j", 3), 30, "lease expiry")
    # When the reaper runs its round
    assert requeue_expired(r, store, app, settings) == ["j/3"]
    # Then the death counts against its worker, as before
    assert suspects.worker_health(r, "gpu0@a").deaths == 1 and len(queued_messages(r)) == 1


def test_leases_running_out_a_renewal_interval_apart_ran_out_at_once(clean_env):
    # Given the default 60 s TTL, whose old leases are renewed every 10 s: in a pause, two processes'
    # leases run out that far apart, their last renewals spread over a renewal interval
    settings = Settings(lease_ttl_s=60)
    judge, t = PauseJudge(Outages(), settings), time.time() - 120
    spread = LeaseClock.of(settings).renew_s + LeaseClock.of(settings).beat_s
    expired = [Expiry("j", 1, t, t + 60, "gpu0@a:1"), Expiry("j", 2, t + spread, t + spread + 60, "gpu0@b:1")]
    # When a reaper that saw no pause itself finds them, and no lease live, Then it is a pause
    judge.note_round(expired, live=0)
    assert judge.outages.windows() == [Window(t, t + spread + 60)]
    # and two that ran out further apart than that are deaths, one after the other
    later = PauseJudge(Outages(), settings)
    apart = judge.at_once_s + 1
    later.note_round([expired[0], Expiry("j", 2, t + apart, t + apart + 60, "gpu0@b:1")], live=0)
    assert later.outages.windows() == []


@pytest.mark.slow
def test_two_processes_losing_their_leases_one_after_another_are_two_deaths(r, store, app, settings):
    # Given two processes whose leases run out seconds apart, the first after the second took its lease
    leased_by(r, "j", 1, "gpu0@a:1")
    wait_for(lambda: not leased(r, "j", 1), 30, "first lease expiry")
    time.sleep(PauseJudge(Outages(), settings).at_once_s + 0.5)
    leased_by(r, "j", 2, "gpu0@b:1")
    for process in ("gpu0@a:1", "gpu0@b:1"):  # their launchers saw them die
        witness.note_witnessed(r, process, "its launcher saw it killed by SIGKILL")
    wait_for(lambda: not leased(r, "j", 2), 30, "second lease expiry")
    # When a reaper that saw no pause finds both gone
    assert sorted(requeue_expired(r, store, app, settings)) == ["j/1", "j/2"]
    # Then they are deaths, not a pause: each counts against its worker
    assert suspects.worker_health(r, "gpu0@a").deaths == 1 and suspects.worker_health(r, "gpu0@b").deaths == 1


# -- when a round scans (fleet.coord.scangate): a death, a let-go, every few rounds ----------------------

#: a live process's leases here: none runs out while a test steps its rounds
LIVE_TTL_S = 600.0


def holding_chunks(r: redis.Redis, owner: str, indexes: range) -> list[Lease]:
    """A process `owner` with a run per chunk, each holding its chunk of job "j"."""
    held = [Lease(r, "j", i, run_owner(owner, i), LIVE_TTL_S) for i in indexes]
    assert all(lease.acquire() for lease in held)
    return held


def mgets(r: redis.Redis) -> int:
    """MGETs served so far: the look at the processes' keys is one, a scan of the running set two more
    (its chunks' leases, then their processes' keys)."""
    return int(r.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def turn(reaper: Reaper, r: redis.Redis) -> Why | None:
    """One round; why it scanned the running set, checked against what the broker served."""
    before = mgets(r)
    reaper.round()
    assert mgets(r) - before == (3 if reaper.gate.why else 1)
    return reaper.gate.why


def test_a_round_scans_on_a_death_a_let_go_or_every_few_rounds_and_recovers_at_once(r, store, app, settings):
    # Given two live processes holding three chunks each, and the leader's reaper
    a, b = holding_chunks(r, "gpu0@host-a:1", range(0, 3)), holding_chunks(r, "gpu0@host-b:2", range(3, 6))
    reaper = Reaper(r, store, app, settings, chunks_of=lambda job: 6 if job == "j" else None)
    every = reaper.gate.every
    assert every == FULL_SCAN_EVERY
    # Then its first round scans, and the rounds after it do not while nothing happens
    assert turn(reaper, r) is Why.FIRST
    assert [turn(reaper, r) for _ in range(every - 1)] == [None] * (every - 1)
    assert turn(reaper, r) is Why.PERIODIC and queued_messages(r) == []
    # When process b dies (its key runs out)
    r.delete(b[0].process_key)
    # Then the next round scans and requeues its chunks
    assert turn(reaper, r) is Why.DEATH
    assert sorted(m["index"] for m in queued_messages(r)) == [3, 4, 5]
    assert running(r) == {"j/0", "j/1", "j/2"}
    # and, nothing of it left to recover, the dead process leaves the set the rounds look at: no scan after
    assert r.hkeys(keys.lease_processes()) == [leases.leased_process(a[0].owner).encode()]
    assert turn(reaper, r) is None
    # When a lease of the live process a is let go (its release never reached the broker)
    a[1].let_go()
    # Then the next round scans and requeues that chunk alone
    assert turn(reaper, r) is Why.LET_GO
    assert sorted(m["index"] for m in queued_messages(r)) == [1, 3, 4, 5]
    assert turn(reaper, r) is None
    # When a lease goes that neither a death nor a let-go shows (deleted by hand here)
    r.delete(keys.lease("j", 2))
    # Then it is recovered by the next periodic scan, not before
    whys = [turn(reaper, r) for _ in range(every)]
    assert Why.PERIODIC in whys and whys[:whys.index(Why.PERIODIC)] == [None] * whys.index(Why.PERIODIC)
    assert sorted(m["index"] for m in queued_messages(r)) == [1, 2, 3, 4, 5]
    assert running(r) == {"j/0"}


def test_a_process_whose_key_came_back_stays_in_the_set_the_rounds_look_at(r):
    # Given a process holding a chunk, whose key ran out (a broker pause) and came back (it retook its lease)
    [lease, other] = holding_chunks(r, "gpu0@host-a:1", range(2))
    process = leases.leased_process(lease.owner)
    r.delete(lease.process_key)
    seen = leases.dead_processes(r)
    assert list(seen) == [process]
    assert lease.retake()
    # When a reaper that saw it dead is done with its deaths
    assert leases.forget_dead(r, seen) == 0
    # Then the process is still looked at (its next death is seen at once), and is not dead
    assert r.hkeys(keys.lease_processes()) == [process.encode()] and leases.dead_processes(r) == {}
    # When it dies again, and takes a lease (another of its runs) and dies once more after a round saw it dead
    r.delete(lease.process_key)
    seen = leases.dead_processes(r)
    time.sleep(0.002)
    assert other.retake()
    r.delete(lease.process_key)
    # Then that round's forget leaves it: the chunk it took since is not that round's to have seen
    assert leases.forget_dead(r, seen) == 0 and list(leases.dead_processes(r)) == [process]
    # and one that stayed dead since a round saw it leaves
    assert leases.forget_dead(r, leases.dead_processes(r)) == 1 and r.hkeys(keys.lease_processes()) == []


def test_a_dead_process_holding_another_stores_chunk_stays_looked_at_until_that_store_recovers_it(r, store, app,
                                                                                                   settings):
    # Given a process holding a chunk of another store's job on the same broker, and this store's leader
    add_job(r, "theirs", "another-store")
    [lease] = [Lease(r, "theirs", 0, run_owner("gpu0@host-c:3", 0), LIVE_TTL_S, store="another-store")]
    assert lease.acquire()
    reaper = Reaper(r, store, app, settings, chunks_of=lambda job: None)
    assert turn(reaper, r) is Why.FIRST
    # When that process dies
    r.delete(lease.process_key)
    # Then this store's rounds scan but leave the chunk to its own store's reaper, and go on seeing the death
    # (were it forgotten here, the other store's leader would find the chunk only at its next periodic scan)
    assert [turn(reaper, r) for _ in range(3)] == [Why.DEATH] * 3
    assert running(r) == {"theirs/0"} and queued_messages(r) == []
    assert list(leases.dead_processes(r)) == [leases.leased_process(lease.owner)]


def test_a_scan_that_leaves_a_chunk_pending_is_followed_by_another(r, store, app, settings):
    # Given a live process holding two chunks, and the leader's reaper after its first round
    [a, b] = holding_chunks(r, "gpu0@host-a:1", range(2))
    reaper = Reaper(r, store, app, settings, chunks_of=lambda job: 2 if job == "j" else None)
    assert turn(reaper, r) is Why.FIRST
    # When a lease is let go while another reaper holds the claim to recover its chunk (for a while)
    assert leases.claim_recovery(r, "j", 0, 60)
    a.let_go()
    # Then the round scans and leaves it, and the rounds after scan again until it is recovered
    assert turn(reaper, r) is Why.LET_GO and queued_messages(r) == []
    assert turn(reaper, r) is Why.PENDING and queued_messages(r) == []
    r.delete(keys.requeue_guard("j", 0))
    assert turn(reaper, r) is Why.PENDING and [m["index"] for m in queued_messages(r)] == [0]
    assert turn(reaper, r) is None


def test_a_release_after_its_process_key_ran_out_is_seen_though_the_key_came_back(r, store, app, settings):
    # Given a process holding two chunks, and the leader's reaper after its first round
    [a, b] = holding_chunks(r, "gpu0@host-a:1", range(2))
    reaper = Reaper(r, store, app, settings, chunks_of=lambda job: 2 if job == "j" else None)
    assert turn(reaper, r) is Why.FIRST
    # When its key runs out (a pause), a run releases its lease (left watched: the reaper's), and another
    # run retakes its own lease, which brings the key back before the round
    r.delete(a.process_key)
    a.release()
    assert running(r) == {"j/0", "j/1"} and b.retake()
    # Then the round, which sees no death, scans and requeues the released chunk
    assert turn(reaper, r) is Why.LET_GO
    assert [m["index"] for m in queued_messages(r)] == [0] and running(r) == {"j/1"}
