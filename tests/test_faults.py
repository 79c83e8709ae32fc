"""The fault suite: real workers, real Redis, real S3 over HTTP, and things going wrong.

Each run ends with every record exactly once in the export, byte-identical to a clean
run's export of the same job (`--stable`), and no chunk without a result.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.coord.leases import leased, process_of
from fleet.coord.localredis import LocalRedis
from fleet.store import open_store
from fleet.store.layout import checkpoint_prefix, failed_prefix, result_key, results_prefix
from fleet.store.results import read_result
from fleet.worker.supervisor.proctree import children
from tests.conftest import run_fleet
from tests.faultproxy import FaultProxy
from tests.fleetproc import Workers, shared_reference, wait_for, write_prompts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECORDS, CHUNK = 400, 4  # 100 chunks
# Slow enough that kills land mid-chunk, fast enough that 100 chunks take well under a minute.
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.004",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "120",
    "FLEET_SIM__SIGMA": "0.8",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": str(CHUNK),
    "FLEET_SLOTS": "3",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "0.5",
    "FLEET_GRACE_S": "1",
}


def aws_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith("AWS_")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A clean run of the job with `fleet run`, exported with --stable."""
    return shared_reference(tmp_path_factory, "faults-reference", SIM, "faults", RECORDS)


def export_bytes(env: dict[str, str], tmp: Path) -> bytes:
    out = tmp / "export.jsonl"
    exp = run_fleet("export", "--job", "faults", "--out", str(out), "--stable", env=env)
    assert exp.returncode == 0, exp.stderr
    # every record checked against its own ids: none continued past its end or from a wrong prefix
    assert f"{RECORDS} samples checked against their ids, {RECORDS} pass, 0 fail" in " ".join(exp.stderr.split())
    return out.read_bytes()


def assert_exact(env: dict[str, str], tmp: Path, reference: bytes) -> None:
    got = export_bytes(env, tmp)
    ids = [json.loads(line)["id"] for line in got.splitlines()]
    assert len(ids) == len(set(ids)) == RECORDS
    assert got == reference


def leases_of(r: redis.Redis, owner_pid: int) -> list[str]:
    held = []
    for key in r.scan_iter(f"{keys.PREFIX}:faults:lease:*"):
        owner = r.get(key)
        if owner and process_of(owner.decode()).endswith(f":{owner_pid}"):
            held.append(key.decode())
    return held


def recovered(r: redis.Redis, store, key: str, dead_pid: int) -> bool:
    index = int(key.rsplit(":", 1)[1])
    owner = r.get(key)
    if store.exists(result_key("faults", index)):
        return True
    return owner is not None and not process_of(owner.decode()).endswith(f":{dead_pid}")


@pytest.mark.parametrize("where", ["local", "gs"])
def test_kill_dash_nine_workers(tmp_path, redis_server, reference, clean_env, where, request):
    # Given a 100-chunk job on three supervised workers, its store a directory or gs:// (fake-gcs-server
    # behind the proxy that gives it GCS's precondition edges, tests/gcsserver.py)
    prompts, ref = reference
    store_url, extra = str(tmp_path / "store"), {}
    if where == "gs":
        store_url, extra = f"gs://{request.getfixturevalue('gs_bucket')}/chaos", request.getfixturevalue("gcs_env")
    env = {**SIM, **extra, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    launcher = workers.start("host", workers=3)
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    rng, recoveries = random.Random(3), []
    try:
        # When a random worker is killed with SIGKILL every few seconds
        for _ in range(8):
            time.sleep(2.5)
            if len(list(store.list(results_prefix("faults")))) >= 95:
                break
            pids = children(launcher.pid)
            if not pids:
                continue
            victim = rng.choice(pids)
            held = leases_of(r, victim)
            os.kill(victim, signal.SIGKILL)
            print(f"\nkilled pid {victim} holding {len(held)} chunk(s)")
            killed_at = time.monotonic()
            for key in held:
                wait_for(lambda k=key, v=victim: recovered(r, store, k, v), 60, f"recovery of {key}")
            if held:
                recoveries.append(time.monotonic() - killed_at)
        wait_for(lambda: len(list(store.list(results_prefix("faults")))) == 100, 120, "all results")
    finally:
        workers.stop()
    # Then every chunk recovered within TTL + 30 s, no attempt was spent on a lost worker,
    # nothing was quarantined, and the export equals the clean run's
    spent = sum(int(v) for v in r.hvals(keys.attempts("faults")))
    suspected = len(r.hvals(keys.crashes("faults")))
    print(f"\nrecovery after kill -9 (s): {[round(x, 1) for x in recoveries]}; "
          f"attempts spent: {spent}; chunks once suspected of a crash: {suspected}")
    assert recoveries, "no kill landed on a running chunk"
    assert max(recoveries) < 3 + 30
    assert spent == 0 and not list(store.list(failed_prefix("faults")))
    assert "killed by SIGKILL" in workers.logs()
    assert_exact(env, tmp_path, ref)


def test_broker_loses_everything(tmp_path, reference, clean_env):
    # Given a job running against a Redis without persistence
    prompts, ref = reference
    server = LocalRedis(tmp_path / "redis", persist=False).start()
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    workers.start("host", workers=2)
    store = open_store(store_url)
    try:
        wait_for(lambda: len(list(store.list(results_prefix("faults")))) >= 25, 90, "a quarter done")
        # When Redis restarts empty on the same port mid-job
        server.stop()
        time.sleep(1)
        server = LocalRedis(tmp_path / "redis2", port=server.port, persist=False).start()
        done_then = len(list(store.list(results_prefix("faults"))))
        again = run_fleet("enqueue", str(prompts), "--job", "faults", env=env)
        assert again.returncode == 0, again.stderr
        print(f"\nafter broker loss: {done_then} chunks done; {again.stderr.strip()}")
        # Then the job completes with the reconnected workers
        wait_for(lambda: len(list(store.list(results_prefix("faults")))) == 100, 120, "all results")
    finally:
        workers.stop()
        server.stop()
    assert_exact(env, tmp_path, ref)


def test_s3_faults(tmp_path, redis_server, moto_server, s3_bucket, reference, clean_env):
    # Given an S3 endpoint behind a proxy that fails 10% and drops 5% of requests
    prompts, ref = reference
    proxy = FaultProxy(moto_server.url, fail_rate=0.10, drop_rate=0.05).start()
    env = {**SIM, **aws_env(), "AWS_ENDPOINT_URL": proxy.url, "FLEET_BROKER_URL": redis_server.url,
           "FLEET_STORE_URL": f"s3://{s3_bucket}/flaky", "FLEET_SIM__STEP_S": "0.0005"}
    try:
        assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
        workers = Workers(env, tmp_path / "logs")
        workers.start("host", workers=2)
        store = open_store(f"s3://{s3_bucket}/flaky")  # direct to moto, not through the proxy
        try:
            wait_for(lambda: len(list(store.list(results_prefix("faults")))) == 100, 150, "all results")
        finally:
            workers.stop()
        print(f"\nS3 proxy: {proxy.counts}")
        assert proxy.counts["failed"] > 20 and proxy.counts["dropped"] > 10
        assert_exact(env, tmp_path, ref)
    finally:
        proxy.stop()


def test_sigterm_hands_chunk_back_from_checkpoint(tmp_path, redis_server, clean_env):
    # Given slow chunks of 16 records, a long lease TTL and two single-slot worker hosts
    prompts = write_prompts(tmp_path / "p.jsonl", 32)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": "16", "FLEET_SLOTS": "1", "FLEET_LEASE_TTL_S": "60", "FLEET_ASSIST": "false",
           "FLEET_SIM__STEP_S": "0.004", "FLEET_SIM__MAX_RUNNING": "2", "FLEET_SIM__MEAN_OUTPUT_TOKENS": "400"}
    assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    a = workers.start("hostA")
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    try:
        # When hostA runs chunk 0, hostB (with a free slot) is up, and hostA has checkpointed
        wait_for(lambda: leased(r, "faults", 0), 60, "hostA running chunk 0")
        b = workers.start("hostB", extra_env={"FLEET_SLOTS": "4"})  # a free slot for chunk 0
        wait_for(lambda: b.poll() is None and "hostB ready" in workers.logs(), 30, "hostB ready")
        wait_for(lambda: any(store.list(checkpoint_prefix("faults", 0))), 60, "a checkpoint of chunk 0")
        # and then gets SIGTERM
        a.send_signal(signal.SIGTERM)

        def taken_by_b() -> bool:
            owner = r.get(keys.lease("faults", 0))
            return store.exists(result_key("faults", 0)) or (owner is not None and b"hostB" in owner)

        handover = wait_for(taken_by_b, 30, "chunk 0 re-run on hostB", interval=0.05)
        a.wait(timeout=30)
        wait_for(lambda: len(list(store.list(results_prefix("faults")))) == 2, 120, "all results")
    finally:
        workers.stop()
    # Then it re-ran at once (not after the 60 s TTL), resuming from the checkpoint
    stats, rows = read_result(store, "faults", 0)
    assert stats is not None
    print(f"\nSIGTERM hand-over in {handover:.2f}s; resumed {stats.resumed} of {stats.samples} samples, "
          f"continued {stats.tokens_continued} tokens; made twice {stats.tokens_made_twice}")
    assert handover < 10
    # what hostA made comes back: finished samples, and the running ones' ids (continued, not made again)
    assert (stats.resumed > 0 or stats.tokens_continued > 0) and (stats.worker or "").endswith("hostB")
    assert stats.tokens_made_twice == 0
    assert len(rows) == 16 and a.returncode == 0
    assert not list(store.list(checkpoint_prefix("faults", 0)))
    assert "handed back: on shutdown" in workers.logs()


def test_failing_chunk_is_quarantined_and_job_finishes(tmp_path, clean_env):
    # Given a job where chunk 3 always fails
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    env = {**SIM, "FLEET_DATA_DIR": str(tmp_path / "data"), "FLEET_CHUNK_SIZE": "4",
           "FLEET_SIM__FAULT_CHUNKS": "[3]", "FLEET_SIM__STEP_S": "0.0002", "FLEET_MAX_ATTEMPTS": "3"}
    # When it runs
    run = run_fleet("run", str(prompts), "--job", "q", "--workers", "2", env=env)
    # Then the run fails naming it, after the other nine chunks finished
    assert run.returncode == 1, run.stderr
    store = open_store(str(tmp_path / "data" / "store"))
    assert len(list(store.list(results_prefix("q")))) == 9
    failure = json.loads(store.get("q/failed/000003.json"))
    assert failure["attempts"] == 3 and "fault_chunks" in failure["error"] and "Traceback" in failure["traceback"]
    status = run_fleet("status", "--job", "q", "--json", env={**env, "FLEET_BROKER_URL": ""})
    st = json.loads(status.stdout)
    assert st["chunks_failed"] == 1 and st["failed"][0]["index"] == 3 and not st["done"]
    # And a retry with the fault gone finishes the job
    env.pop("FLEET_SIM__FAULT_CHUNKS")
    retry_env = {**env, "FLEET_SIM__FAULT_CHUNKS": "[]"}
    server = LocalRedis(tmp_path / "r2", persist=False).start()
    try:
        retry_env["FLEET_BROKER_URL"] = server.url
        assert run_fleet("enqueue", str(prompts), "--job", "q", "--retry-failed", env=retry_env).returncode == 0
        workers = Workers(retry_env, tmp_path / "logs")
        workers.start("h")
        try:
            wait_for(lambda: store.exists(result_key("q", 3)), 60, "chunk 3 result")
        finally:
            workers.stop()
    finally:
        server.stop()
    assert not store.exists("q/failed/000003.json")


def test_two_workers_same_chunk_one_result(tmp_path, redis_server, clean_env):
    # Given a chunk whose lease is stolen while it runs, and a second delivery of it
    prompts = write_prompts(tmp_path / "p.jsonl", 8)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": "8", "FLEET_SLOTS": "1", "FLEET_LEASE_TTL_S": "60", "FLEET_SIM__STEP_S": "0.01"}
    assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    workers.start("hostA")
    r, store = redis.Redis(port=redis_server.port), open_store(store_url)
    try:
        wait_for(lambda: leased(r, "faults", 0), 60, "hostA running chunk 0")
        r.delete(keys.lease("faults", 0))
        from fleet.coord.broker import chunk_queue, make_celery, send_chunk
        from fleet.settings import Settings

        settings = Settings(broker_url=redis_server.url, store_url=store_url)
        send_chunk(make_celery(settings), chunk_queue(settings), "faults", 0, 2)
        workers.start("hostB")
        # When both handle it: hostA retakes its free lease (then hostB's copy skips), or hostB
        # took it first (then hostA's run is cancelled at once), or the copy lost the commit race
        handled = ("dropped this copy", "already has a result", "held by", "run cancelled")
        wait_for(lambda: store.exists(result_key("faults", 0)) and any(h in workers.logs() for h in handled),
                 90, "the second copy to be handled")
    finally:
        workers.stop()
    # Then there is one result object, with one record per prompt
    keys_ = list(store.list(results_prefix("faults")))
    assert keys_ == ["faults/results/000000"]
    assert len(read_result(store, "faults", 0)[1]) == 8


def test_a_worker_on_another_store_never_receives_the_jobs_chunks(tmp_path, redis_server, clean_env):
    # Given a job enqueued into one store, and a worker pointed at another store on the same broker
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    right, wrong = str(tmp_path / "store"), str(tmp_path / "other-store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": right, "FLEET_SIM__STEP_S": "0.0005"}
    assert run_fleet("enqueue", str(prompts), "--job", "faults", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    r, store = redis.Redis(port=redis_server.port), open_store(right)
    try:
        workers.start("lost", extra_env={"FLEET_STORE_URL": wrong})
        # When it has been consuming for a few reaper rounds
        wait_for(lambda: workers.ready("lost"), 90, "the wrong-store worker to consume")
        time.sleep(3)
        # Then it took none of the job's chunks (they wait in their own store's queue), leased
        # nothing, wrote nothing in either store, and the job is still its store's on the broker
        assert int(r.scard(keys.queued("faults"))) == 4 and not r.smembers(keys.running())
        assert not list(open_store(wrong).list("faults/")) and not list(store.list(results_prefix("faults")))
        assert r.hget(keys.job_stores(), "faults") is not None
        # And a worker on the right store finishes the job alongside it
        workers.start("right")
        wait_for(lambda: len(list(store.list(results_prefix("faults")))) == 4, 90, "all results")
    finally:
        workers.stop()
    assert "no manifest" not in workers.logs()
    assert not list(store.list(failed_prefix("faults")))
