"""A worker's broker connections: what a real one holds, and the control-plane bench's simulated
worker holds the same (fleet.coord.pool, fleet.coord.transport, fleet.bench.connections)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest
import redis

from fleet.bench.celerycost import BUSY_ENV
from fleet.bench.connections import connection_kinds
from fleet.bench.procs import WorkerHost, clean_env, run_fleet, wait_until
from fleet.bench.simfleet import Spec
from fleet.coord import leases
from fleet.coord.localredis import LocalRedis
from fleet.coord.pool import WORKER_CONNECTIONS

SIMULATED = 3


def ports_of(root: int, broker: int) -> set[int]:
    """The local ports of every connection to the broker's port from `root` and its descendants."""
    procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    return {c.laddr.port for p in procs for c in p.net_connections(kind="tcp") if c.raddr and c.raddr.port == broker}


def busy_worker(tmp_path: Path, server: LocalRedis, admin: redis.Redis) -> WorkerHost:
    """A real `fleet worker` (one process, sim engine) with every slot running a long chunk."""
    env = clean_env(tmp_path, {"FLEET_BROKER_URL": server.url, "FLEET_STORE_URL": str(tmp_path / "store"),
                               "FLEET_ENGINE": "sim", "FLEET_QUEUE": "conns", **BUSY_ENV})
    host = WorkerHost(env, 1, tmp_path / "worker.log", host="conns").start()
    host.wait_ready()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"c{i}", "prompt": "x"}) + "\n" for i in range(32)))
    run_fleet(["enqueue", str(prompts), "--job", "conns"], env, 120, tmp_path)
    slots = int(BUSY_ENV["FLEET_SLOTS"])
    wait_until(lambda: len(leases.running_indexes(admin, "conns")) >= slots, 90, "every slot running")
    return host


def simulated_workers(tmp_path: Path, server: LocalRedis) -> subprocess.Popen[bytes]:
    """A process of the control-plane bench's simulated workers, each with K leased chunks."""
    spec = Spec(broker_url=server.url, store_url=str(tmp_path / "simstore"), queue="simconns", job="sim",
                host="sim-", workers=SIMULATED, k=4, first=0, last=SIMULATED * 40, chunk_s=600.0, chunk_tok_s=10.0,
                chunk_records=4, lease_ttl_s=60.0, reaper_interval_s=5.0,
                celery_mix=[("PING", 1.0), ("PUBLISH", 1.0)], publish_bytes=100, patterns=["/0.celery.pidbox"],
                out=str(tmp_path / "sim.json"))
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(asdict(spec)))
    proc = subprocess.Popen([sys.executable, "-m", "fleet.bench.simfleet", str(path)], env=clean_env(tmp_path),
                            stdout=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


@pytest.mark.slow
def test_a_simulated_worker_holds_the_connections_a_real_worker_holds(tmp_path, redis_server):
    # Given a real worker whose every slot runs a chunk (its threads all use the broker at once)
    admin = redis.Redis(port=redis_server.port, client_name="bench")
    host = busy_worker(tmp_path / "real", redis_server, admin)
    sim = None
    try:
        assert host.proc is not None
        # When its connections are counted by kind, after a few heartbeats, reaper turns and event PUBLISHes
        time.sleep(12)
        real = connection_kinds(admin, ports_of(host.proc.pid, redis_server.port))
        # And simulated workers run beside it, past their first beats and Celery stand-in's commands
        sim = simulated_workers(tmp_path / "sim", redis_server)
        time.sleep(5)
        simulated = connection_kinds(admin, ports_of(sim.pid, redis_server.port))
    finally:
        host.stop()
        if sim is not None:
            sim.send_signal(signal.SIGTERM)
            sim.wait(60)
    # Then the real worker holds three: the process's one pool (fleet's and kombu's short commands),
    # kombu's consumer (its BRPOP) and kombu's remote-control subscription
    assert dict(real) == {"pool": 1, "consumer": 1, "subscription": 1}
    assert sum(real.values()) == WORKER_CONNECTIONS
    # And each simulated worker holds the same
    assert dict(simulated) == {kind: SIMULATED * n for kind, n in real.items()}
