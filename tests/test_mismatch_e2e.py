"""A worker process with other engine settings than the job's, beside a matching one:
real redis-server, real `fleet worker` launchers, `fleet enqueue`, `fleet status`."""

from __future__ import annotations

import json

import pytest

from fleet.coord import keys
from fleet.store import open_store
from fleet.store.layout import results_prefix
from fleet.store.results import read_result
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, wait_for, write_prompts

pytestmark = pytest.mark.e2e
RECORDS, CHUNK = 48, 4  # 12 chunks


def test_a_mismatched_worker_commits_nothing_and_spends_no_attempt(tmp_path, redis_server, clean_env):
    # Given a job enqueued with the sim's default length distribution
    prompts = write_prompts(tmp_path / "prompts.jsonl", RECORDS)
    store_url = str(tmp_path / "store")
    env = {**FAST_SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_CHUNK_SIZE": str(CHUNK), "FLEET_SLOTS": "2"}
    done = run_fleet("enqueue", str(prompts), "--job", "mixed", env=env)
    assert done.returncode == 0, done.stderr
    workers = Workers(env, tmp_path / "logs")
    # And a worker host whose engine makes other outputs, started first so it meets chunks
    workers.start("odd", extra_env={"FLEET_SIM__MEAN_OUTPUT_TOKENS": "300"})
    store = open_store(store_url)
    try:
        def listed() -> bool:
            status = run_fleet("status", "--job", "mixed", "--json", env=env)
            return status.returncode == 0 and bool(json.loads(status.stdout)["mismatched_workers"])

        wait_for(listed, 60, "the odd worker listed as mismatched")
        text = run_fleet("status", "--job", "mixed", env=env)
        shown = text.stdout + text.stderr  # rich may wrap the name inside its column
        assert "mismatched" in shown and "@odd" in shown and "runs nothing" in shown, shown
        # When a matching worker host joins
        workers.start("good")
        wait_for(lambda: len(list(store.list(results_prefix("mixed")))) == RECORDS // CHUNK, 120, "every result")
        status = json.loads(run_fleet("status", "--job", "mixed", "--json", env=env).stdout)
    finally:
        workers.stop()
    # Then every result is the matching worker's, and no attempt was charged to any chunk
    headers = [read_result(store, "mixed", i)[0] for i in range(RECORDS // CHUNK)]
    writers = {(h.worker if h else "?@?").split("@")[1] for h in headers}
    assert writers == {"good"}, workers.logs()
    import redis

    r = redis.Redis.from_url(redis_server.url)
    assert not any(int(v) > 1 for v in r.hgetall(keys.attempts("mixed")).values())
    assert not r.hgetall(keys.crashes("mixed")) and not list(store.list("mixed/failed/"))
    # And status named the odd worker with what differs, and its log said so as CRITICAL
    [entry] = [w for w in status["mismatched_workers"] if w["worker"].endswith("@odd")]
    assert "sim.mean_output_tokens: 24.0 -> 300.0" in entry["differences"]
    assert "CRITICAL" in workers.logs() and "differs from the job's" in workers.logs()
