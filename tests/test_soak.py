"""The soak: a 600-record job on three workers while a random worker is SIGKILLed every
~8 s until the job ends and the broker is wiped once (FLUSHALL) mid-run. It must end with
every record exactly once, byte-equal to a clean run, and no chunk quarantined."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.coord.leases import process_of
from fleet.store import open_store
from fleet.store.layout import checkpoints_prefix, failed_prefix, results_prefix
from fleet.worker.supervisor.proctree import children
from tests.conftest import run_fleet
from tests.fleetproc import Workers, shared_reference, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
RECORDS, CHUNK = 600, 10  # 60 chunks of a few seconds each
KILL_EVERY_S, WIPE_AT_KILL, JOB_TIMEOUT_S = 8.0, 3, 200
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.025",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "60",
    "FLEET_SIM__SIGMA": "0.8",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": str(CHUNK),
    "FLEET_SLOTS": "2",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "5",
    "FLEET_GRACE_S": "1",
    # Chunks here run seconds, not the minutes of a real job: scale the crash evidence with them.
    "FLEET_CRASH_WINDOW_S": "1.5",
}


@pytest.fixture(scope="module")
def clean_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    return shared_reference(tmp_path_factory, "soak-reference", SIM, "soak", RECORDS)


def test_random_kills_and_a_broker_wipe_lose_nothing_and_quarantine_nothing(tmp_path, redis_server, clean_export,
                                                                          clean_env):
    # Given a 600-record job on one launcher with three workers
    prompts, reference = clean_export
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "soak", env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    launcher = workers.start("soak", workers=3)
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    rng = random.Random(10)
    kills, began = 0, time.monotonic()

    def done() -> int:
        return len(list(store.list(results_prefix("soak"))))

    try:
        # When a random worker is SIGKILLed every ~8 s until the job ends, and Redis is wiped once
        while done() < RECORDS // CHUNK:
            assert time.monotonic() - began < JOB_TIMEOUT_S, f"job not done: {done()} chunks after {kills} kills"
            time.sleep(KILL_EVERY_S * rng.uniform(0.75, 1.25))
            pids = children(launcher.pid)
            if not pids or done() == RECORDS // CHUNK:
                continue
            victim = rng.choice(pids)
            held = sum(1 for k in r.scan_iter(f"{keys.PREFIX}:soak:lease:*")
                       if process_of((r.get(k) or b"").decode()).endswith(f":{victim}"))
            os.kill(victim, signal.SIGKILL)
            kills += 1
            print(f"\nt={time.monotonic() - began:5.1f}s kill {kills}: pid {victim} holding {held} chunk(s), "
                  f"{done()} chunks done")
            if kills == WIPE_AT_KILL:
                r.flushall()
                print(f"t={time.monotonic() - began:5.1f}s broker wiped (FLUSHALL)")
        elapsed = time.monotonic() - began
        # and no checkpoint outlives the job (deleted at commit, or by the job-end sweep)
        wait_for(lambda: not list(store.list(checkpoints_prefix("soak"))), 30, "checkpoints swept at job end")
    finally:
        workers.stop()
    logs = workers.logs()
    recoveries = logs.count("lease expired without result: requeued")
    suspected = len(re.findall(r"requeued \(suspected", logs))
    attempts = len(re.findall(r"attempt \d+ of \d+ failed", logs))
    print(f"\nsoak: {kills} kills in {elapsed:.0f}s, {recoveries} lost-worker recoveries "
          f"({suspected} suspected of the crash), {attempts} attempts spent, "
          f"{logs.count('handed back')} hand-backs, {logs.count('taken again')} leases retaken")
    # Then no chunk was quarantined, nothing was lost or doubled, and the export equals the clean run's
    assert kills >= 5
    assert list(store.list(failed_prefix("soak"))) == []
    out = tmp_path / "export.jsonl"
    assert run_fleet("export", "--job", "soak", "--out", str(out), "--stable", env=env).returncode == 0
    got = out.read_bytes()
    ids = [json.loads(line)["id"] for line in got.splitlines()]
    assert len(ids) == len(set(ids)) == RECORDS
    assert got == reference
