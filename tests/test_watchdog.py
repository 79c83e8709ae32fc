"""An engine that stops making tokens without dying is found in `stall_s`: its chunks go back at
once with their ids, the worker is named as stalled and restarts (fleet.worker.process.watchdog).

Real worker processes and redis-server; the sim engine's `stall_after_s` hangs every request of
one host's engine while its process, loop and heartbeat stay alive, as a stuck GPU engine does."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from fleet.coord import keys
from fleet.store import open_store
from fleet.store.layout import results_prefix
from fleet.worker.process.watchdog import EngineClock
from tests.conftest import run_fleet
from tests.fleetproc import Workers, clean_reference, wait_for
from tests.modelkit import tiny_model_fixture  # noqa: F401

SIM = {
    "FLEET_ENGINE": "sim",
    "FLEET_SIM__STEP_S": "0.01",
    "FLEET_SIM__MEAN_OUTPUT_TOKENS": "200",
    "FLEET_SIM__SIGMA": "0.3",
    "FLEET_SIM__MAX_RUNNING": "16",
    "FLEET_CHUNK_SIZE": "4",
    "FLEET_SLOTS": "2",
    "FLEET_LEASE_TTL_S": "3",
    "FLEET_REAPER_INTERVAL_S": "1",
    "FLEET_CHECKPOINT_INTERVAL_S": "1",
    "FLEET_GRACE_S": "0.5",
    "FLEET_ASSIST": "false",
    "FLEET_STALL_S": "3",
}


def test_the_clock_counts_only_time_with_requests_and_no_token():
    clock = EngineClock()
    assert clock.stalled_for(clock.last + 100) == 0  # idle is no stall
    clock.enter()
    began = clock.last
    assert clock.stalled_for(began + 5) == pytest.approx(5)
    clock.tick()
    assert clock.stalled_for(clock.last + 1) == pytest.approx(1)
    clock.leave()
    assert clock.stalled_for(clock.last + 100) == 0


@pytest.mark.e2e
@dataclass
class Hang:
    """What `hang_then_recover` saw: seconds from the hang to hostA being named stalled, `fleet status
    --json` then, the workers' logs, and the attempts the job's chunks spent."""

    declared_s: float
    status: dict
    logs: str
    attempts: int


def hang_then_recover(tmp_path: Path, env: dict[str, str], redis_port: int, prompts: Path, job: str, chunks: int,
                      host_a_env: dict[str, str], hung: Callable[[], bool]) -> Hang:  # fmt: skip
    """The job enqueued; hostA started with `host_a_env` (its engine hangs); once `hung()` and hostA is
    named stalled, a healthy hostB joins and the job's `chunks` results are awaited."""
    assert run_fleet("enqueue", str(prompts), "--job", job, env=env).returncode == 0
    workers = Workers(env, tmp_path / "logs")
    store, r = open_store(env["FLEET_STORE_URL"]), redis.Redis(port=redis_port)
    workers.start("hostA", extra_env=host_a_env)
    try:
        wait_for(hung, 180, "hostA's engine to hang")
        began = time.monotonic()
        wait_for(lambda: r.hexists(keys.worker_stalls(), "cpu0@hostA"), 60, "hostA declared stalled")
        declared = time.monotonic() - began
        status = json.loads(run_fleet("status", "--job", job, "--json", env=env).stdout)
        workers.start("hostB")
        wait_for(lambda: len(list(store.list(results_prefix(job)))) == chunks, 300, "all results")
    finally:
        workers.stop()
    return Hang(declared, status, workers.logs(), sum(int(v) for v in r.hvals(keys.attempts(job))))


@pytest.mark.slow
def test_a_hung_engine_hands_its_chunks_back_and_the_job_finishes_on_the_other_worker(
        tmp_path, redis_server, clean_env):
    # Given a job, its clean run's export, and two hosts: hostA's engine hangs 2 s after it starts
    (tmp_path / "ref").mkdir()
    prompts, ref = clean_reference(tmp_path / "ref", SIM, "hang", 32)
    env = {**SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store")}
    # When a healthy host joins once hostA is named stalled (timed from hostA's start: `hung` holds at once)
    hang = hang_then_recover(tmp_path, env, redis_server.port, prompts, "hang", 8,
                             {"FLEET_SIM__STALL_AFTER_S": "2"}, lambda: True)
    st = hang.status
    # Then hostA was named stalled within stall_s (+ its check period) of hanging, its chunks went
    # back without an attempt spent, and the export equals the clean run's
    print(f"\nstall declared {hang.declared_s:.1f}s after hostA started (hangs at 2 s, stall_s 3 s)")
    assert [w["worker"] for w in st["stalled_workers"]] == ["cpu0@hostA"]
    assert st["stalled_workers"][0]["stalled_s"] >= 3
    assert "declaring it hung" in hang.logs
    assert hang.attempts == 0
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "hang", "--out", str(out), "--stable", env=env).returncode == 0
    assert out.read_bytes() == ref


HANG_DIR = Path(__file__).parent / "hf_hang"  #: its sitecustomize hangs the hf engine's generating thread once


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_hung_hf_engine_hands_its_chunks_back_and_the_job_finishes_on_the_other_worker(
        tmp_path, redis_server, tiny_model, clean_env):
    # Given a greedy job of 8 long records in two chunks on the hf engine, and its clean run's records
    lines = [{"id": f"h{i}", "messages": [{"role": "user", "content": f"def f{i}(x): return x * {i}"}],
              "sampling": {"temperature": 0, "max_tokens": 400}} for i in range(8)]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    hf = {"FLEET_ENGINE": "hf", "FLEET_MODEL": str(tiny_model), "FLEET_HF__THREADS": "1", "FLEET_CHUNK_SIZE": "4",
          "FLEET_RETURN_OUTPUT_IDS": "true", "FLEET_ASSIST": "false"}
    clean = {**hf, "FLEET_DATA_DIR": str(tmp_path / "clean")}
    assert run_fleet("run", str(prompts), "--job", "hfhang", "--workers", "1", env=clean, timeout=300).returncode == 0
    assert run_fleet("export", "--job", "hfhang", "--out", str(tmp_path / "ref.jsonl"), env=clean).returncode == 0
    ref = [json.loads(line)["output_ids"] for line in (tmp_path / "ref.jsonl").read_text().splitlines()]
    # When hostA's engine hangs at its 40th decode step (its thread blocked, the process, loop and heartbeat
    # alive), and a healthy hostB joins once hostA is declared stalled
    env = {**hf, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store"), "FLEET_STALL_S": "5",
           "FLEET_LEASE_TTL_S": "5", "FLEET_REAPER_INTERVAL_S": "1", "FLEET_CHECKPOINT_INTERVAL_S": "1",
           "FLEET_GRACE_S": "0.5"}
    marker = tmp_path / "hung"
    hang = hang_then_recover(tmp_path, env, redis_server.port, prompts, "hfhang", 2, {
        "FLEET_TEST_HF_HANG": str(marker), "FLEET_TEST_HF_HANG_AFTER_STEPS": "40",
        "PYTHONPATH": os.pathsep.join([str(HANG_DIR), os.environ["PYTHONPATH"]])}, marker.exists)
    # Then hostA was named stalled within stall_s (+ its check period) of hanging, its chunks went back
    # without an attempt spent, and every record equals the clean run's, some continued from hostA's ids
    print(f"\nhf engine hung; stall declared {hang.declared_s:.1f}s later (stall_s 5)")
    assert [w["worker"] for w in hang.status["stalled_workers"]] == ["cpu0@hostA"] and hang.declared_s < 5 + 5
    assert "declaring it hung" in hang.logs
    assert hang.attempts == 0
    out = tmp_path / "out.jsonl"
    assert run_fleet("export", "--job", "hfhang", "--out", str(out), env=env).returncode == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["output_ids"] for row in rows] == ref
    assert any(row.get("continued_at") for row in rows)
