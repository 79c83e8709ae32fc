"""A stop is a hand-over: workers stopped over and over (as interruptible instances are) still
finish a job whose records outlive every worker, and a SIGTERM costs seconds, not records.

Real worker processes, a real redis-server, the sim engine (its output is a function of seed and
position, so a continued record equals an uninterrupted one and the export a clean run's)."""

from __future__ import annotations

import json
import signal
import time

import pytest
import redis

from fleet.coord import keys
from fleet.store import open_store
from fleet.store.layout import results_prefix
from fleet.store.results import read_result
from tests.conftest import run_fleet
from tests.fleetproc import Workers, clean_reference, wait_for, write_prompts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECORDS = 24
# ~6 s records (300 tokens at 0.02 s a step) on 16 engine slots; chunks of 4, 4 chunks a worker.
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.02",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "300",
    "FLEET_SIM__SIGMA": "0.2",
    "FLEET_SIM__MAX_RUNNING": "16",
    "FLEET_CHUNK_SIZE": "4",
    "FLEET_SLOTS": "4",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "1",
    "FLEET_GRACE_S": "0.5",
    "FLEET_ASSIST": "false",
}


def status(env: dict[str, str], job: str) -> dict:
    out = run_fleet("status", "--job", job, "--json", env=env)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_job_whose_records_outlive_every_worker_finishes_while_the_stops_go_on(tmp_path, redis_server, clean_env):
    # Given a job of ~6 s records, and its clean run's export
    (tmp_path / "ref").mkdir()
    prompts, ref = clean_reference(tmp_path / "ref", SIM, "hand", RECORDS)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "hand", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store = open_store(store_url)
    hosts = [workers.start("host0"), workers.start("host1")]
    stops, n = 0, 2
    began = time.monotonic()
    try:
        # When, every 3.5 s, the older host gets SIGTERM and a new one starts (each lives ~7 s,
        # boot included: shorter than a record), for as long as the job runs
        while len(list(store.list(results_prefix("hand")))) < RECORDS // 4:
            assert time.monotonic() - began < 240, "the job did not finish while the stops went on"
            time.sleep(3.5)
            old = hosts.pop(0)
            old.send_signal(signal.SIGTERM)
            stops += 1
            hosts.append(workers.start(f"host{n}"))
            n += 1
    finally:
        workers.stop()
    took = time.monotonic() - began
    # Then it finished during the stops, every record once, equal to the clean run's export
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "hand", "--out", str(out), "--stable", env=env).returncode == 0
    assert out.read_bytes() == ref
    full = tmp_path / "full.jsonl"
    assert run_fleet("export", "--job", "hand", "--out", str(full), env=env).returncode == 0
    rows = [json.loads(line) for line in full.read_text().splitlines()]
    continued = [r for r in rows if r.get("continued_at")]
    st = status(env, "hand")
    print(f"\n{stops} stops in {took:.0f}s; {len(continued)} of {len(rows)} records continued; tokens continued "
          f"{st['tokens_continued']}, made twice {st['tokens_made_twice']} of {st['completion_tokens']}")
    assert stops >= 3 and continued
    assert st["tokens_continued"] > 0
    # a SIGTERM flushes before handing back: what was made is never made again
    assert st["tokens_made_twice"] <= st["completion_tokens"] * 0.05


def test_sigterm_exits_in_seconds_and_the_next_worker_makes_none_of_its_tokens_again(
        tmp_path, redis_server, clean_env):
    # Given one worker holding K=4 chunks with 16 requests running (8 s records)
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "400", "FLEET_CHECKPOINT_INTERVAL_S": "30"}
    assert run_fleet("enqueue", str(prompts), "--job", "term", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    a = workers.start("hostA")
    try:
        wait_for(lambda: sum(int(v) for v in r.hvals(keys.made("term"))) > 16 * 60, 60, "requests running")
        # When it gets SIGTERM mid-generation (no checkpoint taken yet: the interval is 30 s)
        began = time.monotonic()
        a.send_signal(signal.SIGTERM)
        a.wait(timeout=60)
        exit_s = time.monotonic() - began
        made_before = sum(int(v) for v in r.hvals(keys.made("term")))
        # And another worker finishes the job
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix("term")))) == 4, 120, "all results")
    finally:
        workers.stop()
    results = [read_result(store, "term", i) for i in range(4)]
    made = sum(s.tokens_made for s, _ in results if s)
    completion = sum(s.completion_tokens for s, _ in results if s)
    continued = sum(s.tokens_continued for s, _ in results if s)
    print(f"\nSIGTERM to exit with K=4 chunks, 16 requests running: {exit_s:.2f}s; tokens made before it "
          f"{made_before}, continued from {continued}; made twice {made - completion}")
    # Then it exited within seconds, and hostB continued every running sample where it stopped
    assert exit_s < 10
    assert continued >= made_before * 0.95
    assert made - completion == 0


def test_status_counts_tokens_in_flight_before_anything_commits(tmp_path, redis_server, clean_env):
    prompts = write_prompts(tmp_path / "p.jsonl", 16)
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "600"}
    assert run_fleet("enqueue", str(prompts), "--job", "pace", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    r = redis.Redis(port=redis_server.port)
    workers.start("hostA")
    try:
        wait_for(lambda: sum(int(v) for v in r.hvals(keys.made("pace"))) > 400, 60, "tokens streaming")
        time.sleep(2)
        st = status(env, "pace")
    finally:
        workers.stop()
    # 16 requests at 50 tok/s each: ~800 tok/s, long before the first chunk (12 s) commits
    print(f"\nlive: {st['tok_s']} tok/s, {st['tokens_in_flight']} tokens in flight, done {st['chunks_done']}")
    assert st["chunks_done"] == 0
    assert st["tokens_in_flight"] > 400
    assert 300 < st["tok_s"] < 1200


