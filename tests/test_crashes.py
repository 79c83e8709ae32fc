"""Crash evidence with real worker processes: a crash-looping host is named and benched and
quarantines nothing; a chunk that kills every process that runs it is quarantined alone.

Workers are real `fleet worker` launchers (one per --host-name) and, for the crash-looping
host, a bare worker process the test SIGKILLs soon after each start and restarts at once
(the harshest restart loop: no launcher backoff); the test plays its launcher, recording each
death it saw as a launcher does (fleet.coord.witness)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from fleet.coord import keys, witness
from fleet.coord.leases import process_of
from fleet.store import open_store
from fleet.store.layout import failed_prefix, results_prefix
from tests.conftest import run_fleet
from tests.fleetproc import Workers, job_on_two_hosts, shared_reference, wait_for

pytestmark = [pytest.mark.e2e]
RECORDS, CHUNK = 200, 10  # 20 chunks of ~3 s each
SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.04",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "40",
    "FLEET_SIM__SIGMA": "0.5",
    "FLEET_SIM__MAX_RUNNING": "64",
    "FLEET_CHUNK_SIZE": str(CHUNK),
    "FLEET_SLOTS": "4",
    "FLEET_LEASE_TTL_S": "2",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_GRACE_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "2",
    "FLEET_SUSPECT_HOLD_S": "5",
    "FLEET_BENCH_BACKOFF_S": "5",
}
JOB_TIMEOUT_S = 75


class CrashLoop:
    """One worker process of host `bad-host`, SIGKILLed once it has held chunks for `after_s`
    (or `max_life_s` after its start, holding nothing), and restarted at once."""

    def __init__(self, env: dict[str, str], log: Path, r: redis.Redis, after_s: float = 1.5,
                 max_life_s: float = 8.0):
        self.env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        self.log, self.r, self.after_s, self.max_life_s = log, r, after_s, max_life_s
        self.kills = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._thread.start()

    def _holds(self, pid: int) -> bool:
        leases = self.r.scan_iter(f"{keys.PREFIX}:*:lease:*")
        return any(process_of((self.r.get(k) or b"").decode()).endswith(f":{pid}") for k in leases)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with open(self.log, "ab") as out:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "fleet.worker.main", "--name", "cpu0@bad-host", "--concurrency", "4"],
                    env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            began, held = time.monotonic(), None
            while not self._stop.is_set() and self._proc.poll() is None:
                now = time.monotonic()
                if held is None and self._holds(self._proc.pid):
                    held = now
                if (held is not None and now - held >= self.after_s) or now - began >= self.max_life_s:
                    break
                time.sleep(0.1)
            if self._proc.poll() is None:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self.kills += held is not None
            self._proc.wait()
            witness.note_witnessed(self.r, f"cpu0@bad-host:{self._proc.pid}", "its launcher saw it killed by SIGKILL")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()


@pytest.fixture(scope="module")
def clean_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    return shared_reference(tmp_path_factory, "crash-reference", SIM, "loop", RECORDS)


def status_json(env: dict[str, str], job: str) -> dict:
    done = run_fleet("status", "--job", job, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_crash_looping_host_is_named_and_benched_and_quarantines_nothing(tmp_path, redis_server, clean_export,
                                                                          clean_env):
    # Given a job on a healthy host, beside a host whose worker is killed soon after it takes chunks, every time
    prompts, reference = clean_export
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url}
    assert run_fleet("enqueue", str(prompts), "--job", "loop", env=env).returncode == 0
    store, r = open_store(store_url), redis.Redis(port=redis_server.port)
    (tmp_path / "logs").mkdir()
    bad = CrashLoop(env, tmp_path / "logs" / "bad-host.log", r)
    bad.start()
    wait_for(lambda: bad.kills >= 1, 30, "the bad host's first death holding chunks")
    workers = Workers(env, tmp_path / "logs")
    workers.start("good-host")
    began = time.monotonic()
    try:
        # When the job runs to its end
        wait_for(lambda: len(list(store.list(results_prefix("loop")))) == RECORDS // CHUNK, JOB_TIMEOUT_S,
                 "every chunk done")
        elapsed = time.monotonic() - began
        st = status_json(env, "loop")
    finally:
        bad.stop()
        workers.stop()
    logs = workers.logs()
    print(f"\ncrash loop: job done in {elapsed:.0f}s beside {bad.kills} deaths of the bad host holding chunks; "
          f"{logs.count('runs alone on cpu0')} solo runs; status: {st['dying_workers']}")
    # Then nothing was quarantined, and the export equals a clean run's
    assert bad.kills >= 3
    assert list(store.list(failed_prefix("loop"))) == []
    out = tmp_path / "export.jsonl"
    assert run_fleet("export", "--job", "loop", "--out", str(out), "--stable", env=env).returncode == 0
    assert out.read_bytes() == reference
    # and `fleet status` names the bad host (JSON and text) with its deaths, benched; the good one not
    [dying] = st["dying_workers"]
    assert dying["worker"] == "cpu0@bad-host" and dying["deaths"] >= 3 and dying["benched"]
    text = run_fleet("status", "--job", "loop", env=env).stderr  # the table goes to the console (stderr)
    assert "dying cpu0@bad-host" in text and "benched" in text
    # and a CRITICAL line says so
    assert "CRITICAL" in logs and "worker cpu0@bad-host benched" in logs


def test_a_chunk_that_kills_every_worker_running_it_is_quarantined_alone(tmp_path, redis_server, clean_env):
    # Given a job whose chunk 5 SIGKILLs any worker process that runs it, on two hosts
    store_url = str(tmp_path / "store")
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": store_url,
           "FLEET_SIM__KILL_CHUNKS": "[5]"}
    prompts = tmp_path / "p.jsonl"
    from tests.fleetproc import write_prompts

    write_prompts(prompts, RECORDS)
    store, r, workers = job_on_two_hosts(env, prompts, "poison", redis_server, tmp_path / "logs")
    began = time.monotonic()
    try:
        # When the job runs
        wait_for(lambda: len(list(store.list(results_prefix("poison")))) == RECORDS // CHUNK - 1
                 and store.exists("poison/failed/000005.json"), JOB_TIMEOUT_S, "19 results and chunk 5 quarantined")
        elapsed = time.monotonic() - began
    finally:
        workers.stop()
    deaths = {k.decode(): int(v) for k, v in r.hgetall(keys.worker_deaths()).items()}
    print(f"\npoison: done in {elapsed:.0f}s; deaths by worker {deaths}")
    # Then exactly chunk 5 is quarantined, as a worker-killer convicted by its solo runs on two hosts
    assert [k for k in store.list(failed_prefix("poison"))] == ["poison/failed/000005.json"]
    failure = json.loads(store.get("poison/failed/000005.json"))
    assert failure["error_type"] == "WorkerLost" and failure["attempts"] == 2 and "2 host(s)" in failure["error"]
    # within a few of its own runs: one beside others, then two alone
    assert sum(deaths.values()) <= 4
