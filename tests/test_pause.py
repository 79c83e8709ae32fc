"""A broker pause is not a death (docs/architecture.md, "Failures"): Redis frozen mid-job for
longer than the lease TTL, with real worker processes on two hosts and a real redis-server
stopped with SIGSTOP. Every lease runs out while its holder is alive; the holders take them
back when Redis answers, and the job ends as a clean run does: no death, suspect or bench
recorded, no sample made twice by one process, the export equal to a clean run's."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.coord.leases import process_of
from fleet.store.layout import failed_prefix, results_prefix
from tests.conftest import run_fleet
from tests.fleetproc import job_on_two_hosts, read_jsonl, shared_reference, wait_for

pytestmark = [pytest.mark.e2e]
RECORDS, CHUNK = 120, 10  # 12 chunks of ~15-20 s each: they outlast the freeze
TTL_S = 3
# Four lease TTLs, and past the Redis client's 10 s socket timeout: it stands for the operator's
# 60-65 s freeze under the default 60 s TTL.
FREEZE_S = 4 * TTL_S
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.3",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "40",
    "FLEET_SIM__SIGMA": "0.3",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": str(CHUNK),
    "FLEET_SLOTS": "4",
    "FLEET_LEASE_TTL_S": str(TTL_S),
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_GRACE_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "1",
}
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def clean_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    return shared_reference(tmp_path_factory, "pause-reference", SIM, "pause", RECORDS)


def lease_holders(r: redis.Redis) -> set[str]:
    """The processes holding chunk leases now."""
    values = (r.get(k) for k in r.scan_iter(f"{keys.PREFIX}:pause:lease:*"))
    return {process_of(v.decode()) for v in values if v}


def made_twice(trace: Path) -> tuple[int, int, int]:
    """From the sim engine's trace of finished samples: (samples made more than once by one
    process, tokens made again after a sample's first copy anywhere, tokens made in all)."""
    rows = [row for f in trace.glob("*.jsonl") for row in read_jsonl(f)]
    per_process = Counter((row["pid"], row["id"], row["sample"]) for row in rows)
    first: dict[tuple[str, int], int] = {}
    for row in rows:
        first.setdefault((row["id"], row["sample"]), row["tokens"])
    tokens = sum(row["tokens"] for row in rows)
    return sum(1 for n in per_process.values() if n > 1), tokens - sum(first.values()), tokens


def test_a_broker_pause_longer_than_the_lease_ttl_is_no_death(tmp_path, redis_server, clean_export, clean_env):
    # Given a job running on two hosts, with leases held by both
    prompts, reference = clean_export
    trace = tmp_path / "trace"
    trace.mkdir()
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store"),
           "FLEET_SIM__TRACE_DIR": str(trace)}
    store, r, workers = job_on_two_hosts(env, prompts, "pause", redis_server, tmp_path / "logs")
    began = time.monotonic()
    try:
        wait_for(lambda: len(lease_holders(r)) >= 2, 60, "leases held on both hosts")
        time.sleep(1)
        held = lease_holders(r)
        # When Redis freezes (no answer to anyone) for four lease TTLs, then goes on
        assert redis_server.proc is not None
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE_S)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        wait_for(lambda: len(list(store.list(results_prefix("pause")))) == RECORDS // CHUNK, JOB_TIMEOUT_S,
                 "every chunk done")
        elapsed = time.monotonic() - began
        done = run_fleet("status", "--job", "pause", "--json", env=env)
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
    finally:
        workers.stop()
    logs = workers.logs()
    twice_here, tokens_again, tokens = made_twice(trace)
    print(f"\nbroker pause of {FREEZE_S}s over leases of {sorted(held)}: job done in {elapsed:.0f}s; "
          f"{logs.count('taken again')} leases taken back, {logs.count('runs in this process already')} "
          f"second deliveries skipped, {logs.count('during a broker pause')} requeued; "
          f"tokens made twice {tokens_again} of {tokens} ({100 * tokens_again / max(1, tokens):.1f}%)")
    # Then the leases ran out under live holders, who took them back
    assert "taken again" in logs
    # and no death, suspect or bench is recorded against any worker or chunk, nothing judged as lost
    assert "expired without result" not in logs
    assert r.hgetall(keys.worker_deaths()) == {} and r.hgetall(keys.worker_streak()) == {}
    assert list(r.scan_iter(f"{keys.PREFIX}:dead:*")) == []
    assert r.hgetall(keys.suspects("pause")) == {} and r.hgetall(keys.crashes("pause")) == {}
    assert status["dying_workers"] == [] and "died holding chunks" not in logs
    # and no process made a sample twice (it never ran two copies of a chunk), nothing was quarantined
    assert twice_here == 0
    assert list(store.list(failed_prefix("pause"))) == []
    # and the export equals a clean run's
    out = tmp_path / "export.jsonl"
    assert run_fleet("export", "--job", "pause", "--out", str(out), "--stable", env=env).returncode == 0
    assert out.read_bytes() == reference
