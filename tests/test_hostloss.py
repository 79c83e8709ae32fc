"""A lost host is never evidence against a chunk (docs/architecture.md, "Failures"), with real
processes: `fleet worker` launchers against a real redis-server and store.

A worker that dies while its launcher lives is seen dying by it, and its launcher records how
(fleet.coord.witness): that death still counts against the chunk it ran alone. A host whose whole
process tree (launcher and workers) is SIGKILLed at once, as a spot preemption takes it, leaves no
witness: under such kills every few seconds, on three hosts replaced at once, no chunk is
quarantined and the job ends with every record exactly once."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest
import redis

from fleet.coord import keys, witness
from fleet.coord.leases import process_of
from fleet.store import open_store
from fleet.store.layout import failed_prefix, results_prefix
from fleet.worker.supervisor.proctree import descendants, running, signal_all
from tests.conftest import run_fleet
from tests.fleetproc import Workers, read_jsonl, wait_for, worker_pids, write_prompts

pytestmark = [pytest.mark.e2e]
RECORDS, CHUNK = 240, 10  # 24 chunks of ~5 s each: enough work that the job outlasts 10 kills (16 ended after 9 in CI)
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.06",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "40",
    "FLEET_SIM__SIGMA": "0.5",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": str(CHUNK),
    "FLEET_SLOTS": "2",
    "FLEET_LEASE_TTL_S": "2",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_GRACE_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "1",
    "FLEET_SUSPECT_HOLD_S": "2",
}
HOSTS = ("host-a", "host-b", "host-c")
#: a whole host is killed every ~KILL_EVERY_S, up to KILLS times, then the job is let end
KILL_EVERY_S, KILLS, JOB_TIMEOUT_S = 3.0, 20, 150


def whole_tree(launcher: subprocess.Popen[bytes]) -> list[int]:
    """A host's processes: its launcher, then every process below it (the workers, in sessions of their own)."""
    return [launcher.pid, *descendants(launcher.pid)]


def kill_host(launcher: subprocess.Popen[bytes]) -> list[int]:
    """SIGKILL a host's whole process tree at once, its launcher first (nothing of it lives to see the rest
    die), and wait until every process of it has ended."""
    pids = whole_tree(launcher)
    signal_all(pids, signal.SIGKILL)
    launcher.wait()
    wait_for(lambda: not any(running(p) for p in pids[1:]), 30, f"host processes {pids} gone", interval=0.05)
    return pids


def leases_of(r: redis.Redis, job: str, pids: list[int]) -> int:
    """How many of the job's chunks processes in `pids` hold now."""
    owners = [process_of((r.get(k) or b"").decode()) for k in r.scan_iter(f"{keys.PREFIX}:{job}:lease:*")]
    return sum(1 for o in owners if o.rpartition(":")[2] in {str(p) for p in pids})


def test_a_worker_dying_alone_is_witnessed_by_its_launcher_and_a_whole_host_is_not(tmp_path, redis_server,
                                                                                  clean_env):
    # Given a `fleet worker` host of one worker
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store")}
    r = redis.Redis(port=redis_server.port)
    workers = Workers(env, tmp_path / "logs")
    launcher = workers.start("w")
    try:
        wait_for(lambda: len(worker_pids(launcher.pid)) == 1, 60, "the worker started")
        [worker] = worker_pids(launcher.pid)
        # When the worker alone is SIGKILLed (an OOM kill, a crash), its launcher living on
        os.kill(worker, signal.SIGKILL)
        # Then its launcher records how it died, under the name its leases' evidence gives it
        wait_for(lambda: witness.witnessed(r, f"cpu0@w:{worker}") is not None, 30, "the launcher's witness")
        assert "killed by SIGKILL" in witness.witnessed(r, f"cpu0@w:{worker}")
        # When the host is then killed whole, its successor worker with it
        wait_for(lambda: [p for p in worker_pids(launcher.pid) if p != worker], 60, "a successor worker")
        [successor] = [p for p in worker_pids(launcher.pid) if p != worker]
        kill_host(launcher)
        time.sleep(2)
        # Then no one says how the successor died
        assert witness.witnessed(r, f"cpu0@w:{successor}") is None
    finally:
        workers.stop()


def test_hosts_killed_whole_every_few_seconds_quarantine_nothing(tmp_path, redis_server, clean_env):
    # Given a 24-chunk job on three `fleet worker` hosts
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    prompts = write_prompts(tmp_path / "p.jsonl", RECORDS)
    assert run_fleet("enqueue", str(prompts), "--job", "spot", env=env).returncode == 0
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    workers = Workers(env, tmp_path / "logs")
    hosts = {h: workers.start(h) for h in HOSTS}
    rng, kills, holding, began = random.Random(45), 0, 0, time.monotonic()

    def done() -> int:
        return len(list(store.list(results_prefix("spot"))))

    def failed() -> int:
        return len(list(store.list(failed_prefix("spot"))))

    try:
        # When, every ~3 s, a host is killed whole (launcher and workers at once: a preemption) and replaced
        # at once, 20 times or until the job ends: the one running a chunk alone, else the one whose chunks
        # started last (the deaths a quick-death rule would hold against its chunks)
        while done() + failed() < RECORDS // CHUNK:
            assert time.monotonic() - began < JOB_TIMEOUT_S, f"job not done: {done()} chunks after {kills} kills"
            time.sleep(KILL_EVERY_S * rng.uniform(0.75, 1.25))
            if kills >= KILLS or done() + failed() == RECORDS // CHUNK:
                continue
            trees = {h: whole_tree(p) for h, p in hosts.items()}
            busy = [h for h in HOSTS if leases_of(r, "spot", trees[h])]
            alone = [h for h in busy if runs_alone(r, trees[h])]
            victim = alone[0] if alone else max(busy, key=lambda h: youngest_lease(r, "spot", trees[h])) \
                if busy else rng.choice(HOSTS)
            held = leases_of(r, "spot", trees[victim])
            kill_host(hosts[victim])
            kills, holding = kills + 1, holding + (held > 0)
            hosts[victim] = workers.start(victim)
            print(f"t={time.monotonic() - began:5.1f}s kill {kills}: {victim} holding {held} chunk(s), "
                  f"{done()} chunks done, {failed()} quarantined")
        elapsed = time.monotonic() - began
        st = json.loads(run_fleet("status", "--job", "spot", "--json", env=env).stdout)
        text = run_fleet("status", "--job", "spot", env=env).stderr  # the table goes to the console (stderr)
    finally:
        workers.stop()
    quarantined = list(store.list(failed_prefix("spot")))
    print(f"\nspot: {kills} whole-host kills ({holding} holding chunks) in {elapsed:.0f}s; {len(quarantined)} "
          f"chunks quarantined; {st['tokens_made_twice']:,} of {st['completion_tokens']:,} tokens made twice; "
          f"lost hosts {st['lost_hosts']}")
    # Then no chunk was quarantined, and every chunk has its result
    assert kills >= 10 and holding >= 5
    assert quarantined == [] and st["chunks_failed"] == 0 and st["chunks_done"] == RECORDS // CHUNK
    # and the losses count against the hosts, never a chunk: none suspected, none charged a crash
    assert set(st["lost_hosts"]) <= set(HOSTS) and sum(st["lost_hosts"].values()) > 0
    assert "lost host host-" in text
    logs = workers.logs()
    assert "requeued (suspected" not in logs and "runs alone" not in logs
    assert r.hgetall(keys.crashes("spot")) == {}
    # and the job's export holds every record exactly once, and verifies
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "spot", "--out", str(out), env=env).returncode == 0
    ids = [row["id"] for row in read_jsonl(out)]
    assert sorted(ids) == sorted(f"r{i:05d}" for i in range(RECORDS))
    verified = run_fleet("verify", "--job", "spot", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def runs_alone(r: redis.Redis, pids: list[int]) -> bool:
    """Whether a process in `pids` runs a chunk alone (a suspect's solo run)."""
    pids_s = {str(p) for p in pids}
    return any(owner.decode().rpartition(":")[2] in pids_s for owner in r.hvals(keys.solo_runs()))


def youngest_lease(r: redis.Redis, job: str, pids: list[int]) -> int:
    """When the newest lease of the job held by processes in `pids` was taken (ms; 0 if none)."""
    pids_s = {str(p) for p in pids}
    newest = 0
    for k in r.scan_iter(f"{keys.PREFIX}:{job}:lease:*"):
        owner = process_of((r.get(k) or b"").decode())
        if owner.rpartition(":")[2] in pids_s:
            index = int(k.decode().rpartition(":")[2])
            newest = max(newest, int(r.hget(keys.lease_started(), keys.member(job, index)) or 0))
    return newest
