"""A new host's first token (docs/architecture.md, "A worker's start"): a real worker process reports, as
Prometheus metrics read from its own clock, when it was born, when its engine was ready, when it consumed and
when it made its first token, and each run's first token after its chunk's delivery; each process's engine
start is added to the broker, and `fleet status` shows what starting engines cost the fleet."""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from fleet.bench.firsttoken import scrape as start_metrics
from fleet.coord.enginestarts import engine_starts, gpus_of
from fleet.coord.localredis import free_port
from fleet.worker.process.startclock import POINTS, StartClock, process_birth
from tests.conftest import run_fleet
from tests.fleetproc import FAST_SIM, Workers, made_tokens, wait_for, worker_pids, write_prompts

#: seconds the sim engine takes to start, as a real one loads its weights
ENGINE_START_S = 0.5




def test_process_birth_is_the_kernels():
    # Given this process, started a while ago
    # When its birth is read from its own clock
    born = process_birth()
    # Then it is the kernel's record of the start (psutil's, to its second), not now
    assert abs(born - psutil.Process().create_time()) < 1.5
    assert born < time.time() - 0.1


def test_a_point_is_marked_once_and_the_first_token_once():
    # Given a clock born 10 s ago
    clock = StartClock(born=time.time() - 10)
    # When a point is marked twice and two runs make their first tokens
    first = clock.mark("runtime")
    assert clock.mark("runtime") == first
    ready = clock.engine_ready()
    clock.token(time.time() - 1)
    at = clock.points["first_token"]
    clock.token(time.time())
    # Then the first marks stand, in order
    assert 10 <= first <= ready and clock.points["first_token"] == at
    assert clock.points["runtime"] <= clock.points["engine_ready"] <= at


def test_gpus_of_a_process():
    assert (gpus_of("0,1"), gpus_of("3"), gpus_of(""), gpus_of(None)) == (2, 1, 1, 1)


@pytest.mark.e2e
def test_a_workers_start_is_measured_and_status_shows_what_engine_starts_cost(tmp_path, redis_server, clean_env):
    # Given a job, and a host whose sim engine takes ENGINE_START_S to start
    port = free_port()
    env = {**FAST_SIM, "FLEET_BROKER_URL": redis_server.url, "FLEET_STORE_URL": str(tmp_path / "store"),
           "FLEET_CHUNK_SIZE": "4", "FLEET_SLOTS": "1", "FLEET_SIM__STEP_S": "0.02",
           "FLEET_SIM__MEAN_OUTPUT_TOKENS": "400", "FLEET_SIM__START_S": str(ENGINE_START_S),
           "FLEET_ASSIST": "false", "FLEET_LEASE_TTL_S": "5", "FLEET_REAPER_INTERVAL_S": "1"}
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    assert run_fleet("enqueue", str(prompts), "--job", "first", env=env).returncode == 0
    before = json.loads(run_fleet("status", "--job", "first", "--json", env=env).stdout)
    workers = Workers(env, tmp_path / "logs")
    r = redis_server.client()
    try:
        # When its worker starts and makes its first tokens
        launcher = workers.start("host", extra_env={"FLEET_METRICS_PORT": str(port)})
        seen: dict[str, float] = {}

        def first_token() -> bool:
            seen.update(start_metrics(port))
            return "first_token" in seen and made_tokens(r, "first") > 0

        wait_for(first_token, 90, "the worker's first token")
        # Then its metrics give every point of its start, in order, from its birth: the engine began to start
        # before Celery and fleet's runtime were imported, which start beside it
        assert [p for p in POINTS if p in seen] == list(POINTS), seen
        points = [seen[p] for p in POINTS]
        assert points == sorted(points), seen
        assert seen["engine_begun"] <= seen["imported"] <= seen["runtime"] <= seen["engine_ready"]
        # And its engine start is birth to engine ready, the sim's start inside it
        assert seen["fleet_engine_start_seconds"] == seen["engine_ready"] >= ENGINE_START_S
        assert seen["fleet_engine_ready_to_first_token_seconds"] == pytest.approx(
            seen["first_token"] - seen["engine_ready"], abs=1e-6)
        # And a run's delivery to its first token was measured, and came within the process's life
        assert seen["fleet_run_first_token_seconds_count"] >= 1
        assert 0 < seen["fleet_run_first_token_seconds_sum"] <= seen["first_token"] - seen["runtime"]
        # And `fleet status` shows the engine start, from what the worker recorded in the broker
        st = json.loads(run_fleet("status", "--job", "first", "--json", env=env).stdout)
        assert before["engine_starts"]["starts"] == 0
        starts = st["engine_starts"]
        assert starts["starts"] == 1
        assert starts["seconds"] == pytest.approx(seen["fleet_engine_start_seconds"], rel=1e-9)
        assert starts["gpu_seconds"] == starts["seconds"]  # a CPU worker stands for one GPU
        table = run_fleet("status", "--job", "first", env={**env, "COLUMNS": "300"})  # the table goes to stderr
        assert table.returncode == 0, table.stderr
        assert "engine starts" in table.stderr and "over 1 worker process start" in table.stderr, table.stderr

        # When the worker process is killed and its launcher starts another (a restart, as after a preemption)
        [worker] = worker_pids(launcher.pid)
        os.kill(worker, signal.SIGKILL)
        wait_for(lambda: engine_starts(r).starts == 2, 90, "the successor's engine ready")
        # Then the restart's engine start is added to what the fleet paid
        again = json.loads(run_fleet("status", "--job", "first", "--json", env=env).stdout)["engine_starts"]
        assert again["seconds"] >= starts["seconds"] + ENGINE_START_S
    finally:
        workers.stop()


def test_the_first_token_bench_reads_every_point_the_worker_marks():
    """Given the bench's own list of start points (it reads metrics, not the worker's code)
    Then it is the worker's list, in the worker's order: a point added to one shows in the other."""
    from fleet.bench import firsttoken

    assert firsttoken.POINTS == POINTS
