"""The store refusing connections costs no GPU work: results that finish during the outage wait
in the worker's spool, the lease held, and are committed when the store answers
(fleet.worker.process.spool). Real worker processes, redis-server, moto's S3 server behind a loopback
proxy that is stopped (connections refused) and started again on its port."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis

from fleet.coord import figures
from fleet.store import open_store
from fleet.store.layout import results_prefix
from fleet.store.results import read_result
from tests.conftest import run_fleet
from tests.faultproxy import FaultProxy
from tests.fleetproc import Workers, clean_reference, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RECORDS = 16
# ~8 s records (400 tokens at 0.02 s), chunks of 4, each worker runs two chunks at once
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.02",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "400",
    "FLEET_SIM__SIGMA": "0.2",
    "FLEET_SIM__MAX_RUNNING": "16",
    "FLEET_CHUNK_SIZE": "4",
    "FLEET_SLOTS": "2",
    "FLEET_LEASE_TTL_S": "5",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "2",
    "FLEET_ASSIST": "false",
    "FLEET_S3_MAX_ATTEMPTS": "2",
}
OUTAGE_S = 25  # stands for the 60-90 s outages seen: longer than every chunk's run


def test_results_made_during_a_store_outage_are_committed_after_it_not_made_again(
        tmp_path, redis_server, moto_server, s3_bucket, clean_env):
    # Given a job on S3 behind a proxy, and its clean run's export
    (tmp_path / "ref").mkdir()
    prompts, ref = clean_reference(tmp_path / "ref", SIM, "out", RECORDS)
    proxy = FaultProxy(moto_server.url, fail_rate=0, drop_rate=0).start()
    aws = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    url = f"s3://{s3_bucket}/outage"
    env = {**SIM, **aws, "AWS_ENDPOINT_URL": proxy.url, "FLEET_BROKER_URL": redis_server.url,
           "FLEET_STORE_URL": url, "FLEET_DATA_DIR": str(tmp_path / "data")}
    assert run_fleet("enqueue", str(prompts), "--job", "out", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store = open_store(url)  # direct to moto, not through the proxy
    workers.start("hostA")
    workers.start("hostB")
    try:
        # When the store refuses every connection for OUTAGE_S, starting while every chunk runs
        r = redis.Redis(port=redis_server.port)
        wait_for(lambda: len(figures.paces(r, "out")) == RECORDS // 4, 60, "every chunk generating")
        proxy.stop()
        down = time.monotonic()
        time.sleep(OUTAGE_S)
        status = json.loads(run_fleet("status", "--job", "out", "--json", env={**env, "AWS_ENDPOINT_URL":
                                                                                   moto_server.url}).stdout)
        proxy = FaultProxy(moto_server.url, fail_rate=0, drop_rate=0, port=proxy.port).start()
        back = time.monotonic()
        wait_for(lambda: len(list(store.list(results_prefix("out")))) == RECORDS // 4, 120, "all results")
        after = time.monotonic() - back
    finally:
        workers.stop()
        proxy.stop()
    results = [read_result(store, "out", i)[0] for i in range(RECORDS // 4)]
    twice = sum(s.tokens_made_twice for s in results if s)
    longest = max(s.seconds for s in results if s)
    print(f"\nstore down {back - down:.0f}s; {status['store_outages']}; job done {after:.1f}s after it returned "
          f"(longest chunk run {longest:.1f}s); tokens made twice {twice}")
    # Then the outage showed in status, the job ended soon after the store returned, nothing was
    # generated again, and the export equals a clean run's
    assert status["store_outages"] and max(o["results_waiting"] for o in status["store_outages"]) >= 1
    assert after < 20
    assert twice == 0
    assert "spooled" in workers.logs()
    out = tmp_path / "o.jsonl"
    assert run_fleet("export", "--job", "out", "--out", str(out), "--stable",
                     env={**env, "AWS_ENDPOINT_URL": moto_server.url}).returncode == 0
    assert out.read_bytes() == ref
